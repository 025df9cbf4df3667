//! Greedy generation over a backend: request validation, admission into the KV pool, prefill
//! then decode one token at a time, stop at `max_tokens` or EOS, and per-prompt timing as
//! docs/PROTOCOL.md defines it.

use std::collections::VecDeque;
use std::time::Instant;

use crate::backend::{Backend, DecodeItem};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kv::{BlockAllocator, BlockTable};

/// A validated request.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub batch: usize,
}

/// One prompt's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqResult {
    pub index: usize,
    pub tokens: Vec<u32>,
    pub elapsed_s: f64,
    pub ttft_s: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub wall_s: f64,
    pub tokens: usize,
}

pub struct Engine {
    backend: Box<dyn Backend>,
    cfg: ModelConfig,
    alloc: BlockAllocator,
    max_batch: usize,
}

struct Active {
    index: usize,
    table: BlockTable,
    tokens: Vec<u32>,
    prompt_len: usize,
    origin: Instant,
    ttft_s: f64,
}

impl Engine {
    pub fn new(backend: Box<dyn Backend>, cfg: ModelConfig, max_batch: usize) -> Self {
        let alloc = BlockAllocator::new(backend.pool());
        Self {
            backend,
            cfg,
            alloc,
            max_batch: max_batch.max(1),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Checks a whole request before any of it runs: token ids, lengths, the pool.
    pub fn validate(
        &self,
        prompts: &[Vec<i64>],
        max_tokens: usize,
        ignore_eos: bool,
        batch: usize,
    ) -> Result<Request> {
        let malformed = |message: String| Error::MalformedRequest { message };
        if max_tokens == 0 {
            return Err(malformed("max_tokens must be at least 1".into()));
        }
        if batch == 0 {
            return Err(malformed("batch must be at least 1".into()));
        }
        if batch > self.max_batch {
            return Err(Error::BatchTooLarge {
                batch,
                max_batch: self.max_batch,
            });
        }
        if prompts.is_empty() {
            return Err(malformed(
                "prompts is empty; send at least one prompt".into(),
            ));
        }
        let vocab = self.cfg.vocab_size;
        let pool = self.alloc.shape();
        let mut out = Vec::with_capacity(prompts.len());
        for (p, prompt) in prompts.iter().enumerate() {
            if prompt.is_empty() {
                return Err(Error::EmptyPrompt { prompt: p });
            }
            if let Some((position, &id)) = prompt
                .iter()
                .enumerate()
                .find(|(_, &id)| id < 0 || id as u64 >= vocab as u64)
            {
                return Err(Error::BadToken {
                    prompt: p,
                    position,
                    id,
                    vocab,
                });
            }
            if prompt.len() + max_tokens > self.cfg.max_position_embeddings {
                return Err(Error::TooLong {
                    prompt: p,
                    prompt_len: prompt.len(),
                    max_tokens,
                    max_context: self.cfg.max_position_embeddings,
                });
            }
            let needed_tokens = kv_tokens(prompt.len(), max_tokens);
            let needed_blocks = pool.blocks_for(needed_tokens);
            if needed_blocks > pool.num_blocks {
                return Err(Error::OverCapacity {
                    prompt: p,
                    needed_tokens,
                    needed_blocks,
                    pool_blocks: pool.num_blocks,
                    block_size: pool.block_size,
                });
            }
            out.push(prompt.iter().map(|&t| t as u32).collect());
        }
        Ok(Request {
            prompts: out,
            max_tokens,
            ignore_eos,
            batch,
        })
    }

    /// Runs a validated request; `emit` receives each prompt's result as it completes.
    pub fn generate(
        &mut self,
        req: &Request,
        mut emit: impl FnMut(SeqResult) -> Result<()>,
    ) -> Result<Summary> {
        let start = Instant::now();
        let mut pending: VecDeque<usize> = (0..req.prompts.len()).collect();
        let mut active: Vec<Active> = Vec::new();
        let mut total = 0;
        loop {
            // Admit in order while there is room in the batch and in the pool.
            while active.len() < req.batch {
                let Some(&index) = pending.front() else { break };
                let prompt = &req.prompts[index];
                let Some(table) = self.alloc.reserve(kv_tokens(prompt.len(), req.max_tokens))
                else {
                    break;
                };
                pending.pop_front();
                let origin = if req.batch == 1 {
                    Instant::now()
                } else {
                    start
                };
                let first = self.backend.prefill(prompt, &table)?;
                let seq = Active {
                    index,
                    table,
                    tokens: vec![first],
                    prompt_len: prompt.len(),
                    origin,
                    ttft_s: origin.elapsed().as_secs_f64(),
                };
                if self.finished(&seq, req) {
                    total += self.retire(seq, &mut emit)?;
                } else {
                    active.push(seq);
                }
            }
            if active.is_empty() {
                if pending.is_empty() {
                    break;
                }
                // Validation proved each prompt fits an empty pool, and the pool is empty now.
                return Err(Error::Internal {
                    message: "a validated prompt did not fit the empty KV pool".into(),
                });
            }
            let next = {
                let items: Vec<DecodeItem<'_>> = active
                    .iter()
                    .map(|s| DecodeItem {
                        token: *s.tokens.last().expect("every active sequence has a token"),
                        position: s.prompt_len + s.tokens.len() - 1,
                        table: &s.table,
                    })
                    .collect();
                self.backend.decode(&items)?
            };
            for (s, t) in active.iter_mut().zip(next) {
                s.tokens.push(t);
            }
            let mut i = 0;
            while i < active.len() {
                if self.finished(&active[i], req) {
                    let seq = active.remove(i);
                    total += self.retire(seq, &mut emit)?;
                } else {
                    i += 1;
                }
            }
        }
        Ok(Summary {
            wall_s: start.elapsed().as_secs_f64(),
            tokens: total,
        })
    }

    fn finished(&self, s: &Active, req: &Request) -> bool {
        s.tokens.len() >= req.max_tokens
            || (!req.ignore_eos && self.cfg.eos_token_ids.contains(s.tokens.last().unwrap()))
    }

    fn retire(
        &mut self,
        s: Active,
        emit: &mut impl FnMut(SeqResult) -> Result<()>,
    ) -> Result<usize> {
        let elapsed_s = s.origin.elapsed().as_secs_f64();
        let n = s.tokens.len();
        self.alloc.release(s.table);
        emit(SeqResult {
            index: s.index,
            tokens: s.tokens,
            elapsed_s,
            ttft_s: s.ttft_s,
        })?;
        Ok(n)
    }
}

/// Positions a sequence writes into the cache: the prompt and every new token but the last,
/// which is never fed back.
fn kv_tokens(prompt_len: usize, max_tokens: usize) -> usize {
    prompt_len + max_tokens - 1
}
