//! Greedy generation over a backend: request validation, admission into the KV pool, prefill
//! then decode one token at a time, stop at `max_tokens` or EOS, and per-prompt timing as
//! docs/PROTOCOL.md defines it. A verify request (teacher forcing) runs through the same
//! admission, prefill and batched decode steps, feeding the forced tokens and scoring each
//! position instead of choosing.

use std::collections::VecDeque;
use std::time::Instant;

use crate::backend::{Backend, DecodeItem, Scored};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::kv::{BlockAllocator, BlockTable};

/// A validated request.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub batch: usize,
}

/// A validated verify request: each prompt with the tokens to feed after it.
#[derive(Debug, Clone)]
pub struct VerifyRequest {
    pub prompts: Vec<Vec<u32>>,
    pub forced: Vec<Vec<u32>>,
    pub batch: usize,
}

/// One prompt's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqResult {
    pub index: usize,
    /// The generated tokens; for a verify request, the greedy choice at each position.
    pub tokens: Vec<u32>,
    pub elapsed_s: f64,
    pub ttft_s: f64,
    /// A verify request's score of each position; empty for generate.
    pub scores: Vec<Scored>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub wall_s: f64,
    /// New tokens, or for a verify request positions scored.
    pub tokens: usize,
}

pub struct Engine {
    backend: Box<dyn Backend>,
    cfg: ModelConfig,
    alloc: BlockAllocator,
    max_batch: usize,
    faults: Faults,
}

/// What the scheduler runs: one loop for both, so that verify takes generate's path.
#[derive(Clone, Copy)]
enum Job<'r> {
    Generate(&'r Request),
    Verify(&'r VerifyRequest),
}

impl Job<'_> {
    fn prompts(&self) -> &[Vec<u32>] {
        match self {
            Job::Generate(r) => &r.prompts,
            Job::Verify(r) => &r.prompts,
        }
    }

    fn batch(&self) -> usize {
        match self {
            Job::Generate(r) => r.batch,
            Job::Verify(r) => r.batch,
        }
    }

    /// Positions prompt `index` produces at most: new tokens, or forced tokens scored.
    fn positions(&self, index: usize) -> usize {
        match self {
            Job::Generate(r) => r.max_tokens,
            Job::Verify(r) => r.forced[index].len(),
        }
    }
}

struct Active {
    index: usize,
    table: BlockTable,
    tokens: Vec<u32>,
    scores: Vec<Scored>,
    prompt_len: usize,
    origin: Instant,
    ttft_s: f64,
}

impl Active {
    /// The token the next decode step feeds: the last one chosen, or the forced one.
    fn fed(&self, job: Job<'_>) -> u32 {
        match job {
            Job::Generate(_) => *self
                .tokens
                .last()
                .expect("every active sequence has a token"),
            Job::Verify(r) => r.forced[self.index][self.tokens.len() - 1],
        }
    }
}

/// Whether a prompt's checks count new tokens (`generate`) or forced ones (`verify`), for the
/// errors' wording.
#[derive(Clone, Copy)]
enum Budget<'a> {
    MaxTokens(usize),
    Forced(&'a [Vec<i64>]),
}

impl Budget<'_> {
    fn of(&self, prompt: usize) -> usize {
        match self {
            Budget::MaxTokens(n) => *n,
            Budget::Forced(f) => f[prompt].len(),
        }
    }
}

impl Engine {
    pub fn new(
        backend: Box<dyn Backend>,
        cfg: ModelConfig,
        max_batch: usize,
        faults: Faults,
    ) -> Self {
        let alloc = BlockAllocator::new(backend.pool());
        Self {
            backend,
            cfg,
            alloc,
            max_batch: max_batch.max(1),
            faults,
        }
    }

    /// The `features` object of the `ready` event: the backend's, and the planted faults'
    /// names as `fault` where there are any.
    pub fn features(&self) -> serde_json::Value {
        let mut f = self.backend.features();
        if !self.faults.is_empty() {
            f["fault"] = self.faults.names().into();
        }
        f
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

    /// KV blocks a sequence of `prompt_len` tokens holds once it has made `max_tokens`.
    pub fn blocks_needed(&self, prompt_len: usize, max_tokens: usize) -> usize {
        self.alloc
            .shape()
            .blocks_for(kv_tokens(prompt_len, max_tokens))
    }

    /// Checks a whole request before any of it runs: token ids, lengths, the pool.
    pub fn validate(
        &self,
        prompts: &[Vec<i64>],
        max_tokens: usize,
        ignore_eos: bool,
        batch: usize,
    ) -> Result<Request> {
        if max_tokens == 0 {
            return Err(Error::MalformedRequest {
                message: "max_tokens must be at least 1".into(),
            });
        }
        self.check_batch(batch)?;
        Ok(Request {
            prompts: self.check_prompts(prompts, Budget::MaxTokens(max_tokens))?,
            max_tokens,
            ignore_eos,
            batch,
        })
    }

    /// Checks a verify request as [`Engine::validate`] checks generate, each prompt's
    /// `max_tokens` being its forced tokens' count; the forced ids are checked like prompts'.
    pub fn validate_verify(
        &self,
        prompts: &[Vec<i64>],
        forced: &[Vec<i64>],
        batch: usize,
    ) -> Result<VerifyRequest> {
        let malformed = |message: String| Error::MalformedRequest { message };
        if forced.len() != prompts.len() {
            return Err(malformed(format!(
                "forced has {} lists for {} prompts; send one list of forced tokens per prompt",
                forced.len(),
                prompts.len()
            )));
        }
        if let Some(p) = forced.iter().position(|f| f.is_empty()) {
            return Err(malformed(format!(
                "forced[{p}] is empty; verify needs at least one forced token per prompt"
            )));
        }
        self.check_batch(batch)?;
        let prompts = self.check_prompts(prompts, Budget::Forced(forced))?;
        let forced = forced
            .iter()
            .enumerate()
            .map(|(p, f)| self.check_ids(p, f, true))
            .collect::<Result<_>>()?;
        Ok(VerifyRequest {
            prompts,
            forced,
            batch,
        })
    }

    fn check_batch(&self, batch: usize) -> Result<()> {
        if batch == 0 {
            return Err(Error::MalformedRequest {
                message: "batch must be at least 1".into(),
            });
        }
        if batch > self.max_batch {
            return Err(Error::BatchTooLarge {
                batch,
                max_batch: self.max_batch,
            });
        }
        Ok(())
    }

    /// Token ids in the vocabulary, as u32.
    fn check_ids(&self, prompt: usize, ids: &[i64], forced: bool) -> Result<Vec<u32>> {
        let vocab = self.cfg.vocab_size;
        if let Some((position, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id < 0 || id as u64 >= vocab as u64)
        {
            return Err(Error::BadToken {
                prompt,
                position,
                id,
                vocab,
                forced,
            });
        }
        Ok(ids.iter().map(|&t| t as u32).collect())
    }

    /// Each prompt non-empty, in the vocabulary, and with its `budget` of positions within the
    /// model's context and the whole pool.
    fn check_prompts(&self, prompts: &[Vec<i64>], budget: Budget<'_>) -> Result<Vec<Vec<u32>>> {
        if prompts.is_empty() {
            return Err(Error::MalformedRequest {
                message: "prompts is empty; send at least one prompt".into(),
            });
        }
        let pool = self.alloc.shape();
        let mut out = Vec::with_capacity(prompts.len());
        for (p, prompt) in prompts.iter().enumerate() {
            if prompt.is_empty() {
                return Err(Error::EmptyPrompt { prompt: p });
            }
            let ids = self.check_ids(p, prompt, false)?;
            let max_tokens = budget.of(p);
            if prompt.len() + max_tokens > self.cfg.max_position_embeddings {
                return Err(Error::TooLong {
                    prompt: p,
                    prompt_len: prompt.len(),
                    max_tokens,
                    max_context: self.cfg.max_position_embeddings,
                    forced: matches!(budget, Budget::Forced(_)),
                });
            }
            let needed_tokens = kv_tokens(prompt.len(), max_tokens);
            let needed_blocks = self.blocks_needed(prompt.len(), max_tokens);
            if needed_blocks > pool.num_blocks {
                return Err(Error::OverCapacity {
                    prompt: p,
                    needed_tokens,
                    needed_blocks,
                    pool_blocks: pool.num_blocks,
                    block_size: pool.block_size,
                });
            }
            out.push(ids);
        }
        Ok(out)
    }

    /// Runs a validated request; `emit` receives each prompt's result as it completes.
    pub fn generate(
        &mut self,
        req: &Request,
        mut emit: impl FnMut(SeqResult) -> Result<()>,
    ) -> Result<Summary> {
        self.run(Job::Generate(req), &mut emit)
    }

    /// Runs a validated verify request through generate's path, feeding the forced tokens;
    /// `emit` receives each prompt's scores (and greedy choices) as it completes.
    pub fn verify(
        &mut self,
        req: &VerifyRequest,
        mut emit: impl FnMut(SeqResult) -> Result<()>,
    ) -> Result<Summary> {
        self.run(Job::Verify(req), &mut emit)
    }

    fn run(
        &mut self,
        job: Job<'_>,
        emit: &mut dyn FnMut(SeqResult) -> Result<()>,
    ) -> Result<Summary> {
        let start = Instant::now();
        let prompts = job.prompts();
        let mut pending: VecDeque<usize> = (0..prompts.len()).collect();
        let mut active: Vec<Active> = Vec::new();
        let mut total = 0;
        loop {
            // Admit in order while there is room in the batch and in the pool, each round's
            // prompts prefilled together; a prompt done at its first token leaves room for more.
            loop {
                let mut round = Vec::new();
                while active.len() + round.len() < job.batch() {
                    let Some(&index) = pending.front() else { break };
                    let prompt = &prompts[index];
                    let Some(table) = self
                        .alloc
                        .reserve(kv_tokens(prompt.len(), job.positions(index)))
                    else {
                        break;
                    };
                    pending.pop_front();
                    round.push((index, table));
                }
                if round.is_empty() {
                    break;
                }
                for seq in self.admit(job, round, start)? {
                    if self.finished(&seq, job) {
                        total += self.retire(seq, emit)?;
                    } else {
                        active.push(seq);
                    }
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
            self.step(job, &mut active)?;
            let mut i = 0;
            while i < active.len() {
                if self.finished(&active[i], job) {
                    let seq = active.remove(i);
                    total += self.retire(seq, emit)?;
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

    /// Prefills the round's prompts, each into its table, together: each one's first token, or
    /// its first position's score. At batch 1 a prompt's clock starts here; at batch N at the
    /// request's start, so its time to first token includes the wait for its turn.
    fn admit(
        &mut self,
        job: Job<'_>,
        round: Vec<(usize, BlockTable)>,
        start: Instant,
    ) -> Result<Vec<Active>> {
        let origin = if job.batch() == 1 {
            Instant::now()
        } else {
            start
        };
        let prompts = job.prompts();
        let seqs: Vec<(&[u32], &BlockTable)> = round
            .iter()
            .map(|(i, t)| (prompts[*i].as_slice(), t))
            .collect();
        let firsts: Vec<(u32, Option<Scored>)> = match job {
            Job::Generate(_) => self
                .backend
                .prefill_many(&seqs)?
                .into_iter()
                .map(|t| (t, None))
                .collect(),
            Job::Verify(r) => {
                let next: Vec<u32> = round.iter().map(|(i, _)| r.forced[*i][0]).collect();
                self.backend
                    .prefill_many_scored(&seqs, &next)?
                    .into_iter()
                    .map(|s| (s.argmax, Some(s)))
                    .collect()
            }
        };
        drop(seqs);
        let ttft_s = origin.elapsed().as_secs_f64();
        Ok(round
            .into_iter()
            .zip(firsts)
            .map(|((index, table), (first, score))| Active {
                index,
                table,
                tokens: vec![first],
                scores: score.into_iter().collect(),
                prompt_len: prompts[index].len(),
                origin,
                ttft_s,
            })
            .collect())
    }

    /// One decode step for every active sequence, in one forward pass.
    fn step(&mut self, job: Job<'_>, active: &mut [Active]) -> Result<()> {
        let started = Instant::now();
        let items: Vec<DecodeItem<'_>> = active
            .iter()
            .map(|s| DecodeItem {
                token: s.fed(job),
                position: s.prompt_len + s.tokens.len() - 1,
                table: &s.table,
            })
            .collect();
        match job {
            Job::Generate(_) => {
                let next = self.backend.decode(&items)?;
                drop(items);
                for (s, t) in active.iter_mut().zip(next) {
                    s.tokens.push(t);
                }
            }
            Job::Verify(r) => {
                let forced: Vec<u32> = active
                    .iter()
                    .map(|s| r.forced[s.index][s.tokens.len()])
                    .collect();
                let scores = self.backend.decode_scored(&items, &forced)?;
                drop(items);
                for (s, sc) in active.iter_mut().zip(scores) {
                    s.tokens.push(sc.argmax);
                    s.scores.push(sc);
                }
            }
        }
        self.faults.after_step(started);
        Ok(())
    }

    fn finished(&self, s: &Active, job: Job<'_>) -> bool {
        match job {
            Job::Generate(req) => {
                s.tokens.len() >= req.max_tokens
                    || (!req.ignore_eos
                        && self.cfg.eos_token_ids.contains(s.tokens.last().unwrap()))
            }
            // EOS never stops a forced row.
            Job::Verify(req) => s.tokens.len() >= req.forced[s.index].len(),
        }
    }

    fn retire(
        &mut self,
        s: Active,
        emit: &mut dyn FnMut(SeqResult) -> Result<()>,
    ) -> Result<usize> {
        let elapsed_s = s.origin.elapsed().as_secs_f64();
        let n = s.tokens.len();
        self.alloc.release(s.table);
        emit(SeqResult {
            index: s.index,
            tokens: s.tokens,
            elapsed_s,
            ttft_s: s.ttft_s,
            scores: s.scores,
        })?;
        Ok(n)
    }
}

/// Positions a sequence writes into the cache: the prompt and every new token but the last,
/// which is never fed back.
fn kv_tokens(prompt_len: usize, max_tokens: usize) -> usize {
    prompt_len + max_tokens - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuBackend;
    use crate::kv::{resolve_pool, PoolSize};
    use crate::weights::Checkpoint;

    fn tiny_llama() -> (ModelConfig, Checkpoint) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/tiny-llama/model");
        let cfg = ModelConfig::load(&dir).unwrap();
        let ckpt = Checkpoint::open(&dir).unwrap();
        (cfg, ckpt)
    }

    fn cpu(cfg: &ModelConfig, ckpt: &Checkpoint) -> CpuBackend {
        let pool = resolve_pool(cfg, 16, PoolSize::Blocks(64), 4).unwrap();
        CpuBackend::load(cfg, ckpt, pool, &Faults::default()).unwrap()
    }

    fn prompts() -> Vec<Vec<i64>> {
        vec![
            vec![227],
            vec![291, 275, 89, 375, 360],
            (0..40).map(|i| (i * 37 + 11) % 500).collect(),
        ]
    }

    fn collect(results: &mut Vec<SeqResult>) -> impl FnMut(SeqResult) -> Result<()> + '_ {
        |r| {
            results.push(r);
            Ok(())
        }
    }

    /// The CPU backend, counting the prompts of each `prefill_many` call.
    struct Rounds {
        inner: CpuBackend,
        rounds: std::rc::Rc<std::cell::RefCell<Vec<usize>>>,
    }

    impl Backend for Rounds {
        fn prefill(&mut self, tokens: &[u32], table: &BlockTable) -> Result<u32> {
            self.inner.prefill(tokens, table)
        }
        fn decode(&mut self, items: &[DecodeItem<'_>]) -> Result<Vec<u32>> {
            self.inner.decode(items)
        }
        fn prefill_scored(&mut self, t: &[u32], b: &BlockTable, next: u32) -> Result<Scored> {
            self.inner.prefill_scored(t, b, next)
        }
        fn decode_scored(&mut self, i: &[DecodeItem<'_>], f: &[u32]) -> Result<Vec<Scored>> {
            self.inner.decode_scored(i, f)
        }
        fn prefill_many(&mut self, seqs: &[(&[u32], &BlockTable)]) -> Result<Vec<u32>> {
            self.rounds.borrow_mut().push(seqs.len());
            seqs.iter().map(|(t, b)| self.inner.prefill(t, b)).collect()
        }
        fn pool(&self) -> crate::kv::PoolShape {
            self.inner.pool()
        }
        fn features(&self) -> serde_json::Value {
            self.inner.features()
        }
    }

    #[test]
    fn the_prompts_admitted_together_are_prefilled_together_and_the_tokens_do_not_change() {
        let (cfg, ckpt) = tiny_llama();
        let many: Vec<Vec<i64>> = (0..7).map(|i| vec![10 + i, 20 + i, 30]).collect();
        let run = |batch: usize, max_tokens: usize| {
            let rounds = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let backend = Rounds {
                inner: cpu(&cfg, &ckpt),
                rounds: rounds.clone(),
            };
            let mut engine = Engine::new(Box::new(backend), cfg.clone(), 3, Faults::default());
            let req = engine.validate(&many, max_tokens, true, batch).unwrap();
            let mut got = Vec::new();
            engine.generate(&req, collect(&mut got)).unwrap();
            got.sort_by_key(|r| r.index);
            let tokens: Vec<Vec<u32>> = got.into_iter().map(|r| r.tokens).collect();
            let rounds = rounds.borrow().clone();
            (tokens, rounds)
        };
        // Batch 3 over 7 prompts that end together: rounds of 3, 3, 1; batch 1: one at a time.
        let (t3, r3) = run(3, 4);
        assert_eq!(r3, [3, 3, 1]);
        let (t1, r1) = run(1, 4);
        assert_eq!(r1, [1; 7]);
        assert_eq!(t3, t1);
        // Done at their first token: each round retires at once and the next fills the batch.
        let (t, r) = run(3, 1);
        assert_eq!(r, [3, 3, 1]);
        assert!(t.iter().all(|t| t.len() == 1));
    }

    #[test]
    fn verifying_its_own_tokens_finds_no_gap_at_batch_1_and_n() {
        let (cfg, ckpt) = tiny_llama();
        let mut engine = Engine::new(
            Box::new(cpu(&cfg, &ckpt)),
            cfg.clone(),
            3,
            Faults::default(),
        );
        let req = engine.validate(&prompts(), 12, true, 1).unwrap();
        let mut own = Vec::new();
        engine.generate(&req, collect(&mut own)).unwrap();
        own.sort_by_key(|r| r.index);
        let forced: Vec<Vec<i64>> = own
            .iter()
            .map(|r| r.tokens.iter().map(|&t| t as i64).collect())
            .collect();
        for batch in [1, 3] {
            let v = engine.validate_verify(&prompts(), &forced, batch).unwrap();
            let mut got = Vec::new();
            let summary = engine.verify(&v, collect(&mut got)).unwrap();
            assert_eq!(summary.tokens, 3 * 12);
            got.sort_by_key(|r| r.index);
            for (r, o) in got.iter().zip(&own) {
                assert_eq!(
                    r.tokens, o.tokens,
                    "batch {batch}: argmax is the forced token"
                );
                assert_eq!(r.scores.len(), 12);
                for s in &r.scores {
                    assert_eq!(s.gap, 0.0, "batch {batch} prompt {}", r.index);
                    assert!(s.scale > 0.0);
                }
            }
        }
    }

    #[test]
    fn forced_tokens_score_as_the_logits_of_a_prefill_over_prompt_and_prefix() {
        let (cfg, ckpt) = tiny_llama();
        let mut engine = Engine::new(
            Box::new(cpu(&cfg, &ckpt)),
            cfg.clone(),
            3,
            Faults::default(),
        );
        let mut reference = cpu(&cfg, &ckpt);
        // Tokens the model would not choose.
        let forced: Vec<Vec<i64>> = (0..3)
            .map(|p| (0..9).map(|j| (p * 101 + j * 53 + 7) % 512).collect())
            .collect();
        let v = engine.validate_verify(&prompts(), &forced, 3).unwrap();
        let mut got = Vec::new();
        engine.verify(&v, collect(&mut got)).unwrap();
        let table = BlockTable {
            blocks: (0..8).collect(),
            block_size: 16,
            state_slot: None,
        };
        let mut positive = 0;
        for r in &got {
            let prompt: Vec<u32> = prompts()[r.index].iter().map(|&t| t as u32).collect();
            let f = &v.forced[r.index];
            for (j, s) in r.scores.iter().enumerate() {
                let seq: Vec<u32> = prompt.iter().chain(&f[..j]).copied().collect();
                let logits = reference.next_logits(&seq, &table);
                let want = Scored::of(&logits, f[j]);
                assert_eq!(*s, want, "prompt {} position {j}", r.index);
                let l = |t: u32| logits[t as usize];
                assert_eq!(s.gap, l(s.argmax) - l(f[j]));
                assert_eq!(r.tokens[j], s.argmax);
                if s.argmax != f[j] {
                    assert!(s.gap > 0.0, "prompt {} position {j}", r.index);
                    positive += 1;
                }
            }
        }
        assert!(
            positive > 20,
            "only {positive} positions where forced is not the argmax"
        );
    }

    #[test]
    fn malformed_verify_requests_are_named() {
        let (cfg, ckpt) = tiny_llama();
        let engine = Engine::new(
            Box::new(cpu(&cfg, &ckpt)),
            cfg.clone(),
            2,
            Faults::default(),
        );
        let e = |p: &[Vec<i64>], f: &[Vec<i64>], b| engine.validate_verify(p, f, b).unwrap_err();
        let one = vec![vec![1, 2]];
        let m = e(&one, &[vec![1], vec![2]], 1).to_string();
        assert!(m.contains("forced has 2 lists for 1 prompts"), "{m}");
        let m = e(&one, &[vec![]], 1).to_string();
        assert!(m.contains("forced[0] is empty"), "{m}");
        let m = e(&one, &[vec![4, 512]], 1);
        assert_eq!(m.code(), "bad_token");
        assert!(
            m.to_string()
                .contains("forced tokens of prompt 0, position 1: token id 512"),
            "{m}"
        );
        let m = e(&one, &[vec![4; 511]], 1);
        assert_eq!(m.code(), "too_long");
        assert!(
            m.to_string()
                .contains("2 prompt tokens + 511 forced tokens = 513"),
            "{m}"
        );
        let m = e(&one, &[vec![4; 2000]], 1).code();
        assert_eq!(m, "too_long");
        assert_eq!(e(&one, &[vec![1]], 3).code(), "over_capacity");
        assert_eq!(e(&[vec![]], &[vec![1]], 1).code(), "empty_prompt");
        assert_eq!(e(&[vec![-1]], &[vec![1]], 1).code(), "bad_token");
    }
}
