//! `engine bench`: the engine's own speed, measured the way the orchestrator measures a leg
//! (docs/PROTOCOL.md's timing recipe), plus the bandwidth floor on a GPU. A benchmark, not a
//! test: it prints figures for a person and a JSON object for a record.

use std::time::Instant;

use crate::error::{Error, Result};
use crate::generate::{Engine, Request, SeqResult};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Lengths of the prompts timed for per-output-token.
    pub prompt_lens: Vec<usize>,
    pub max_tokens: usize,
    pub repeat: usize,
    pub ttft_len: usize,
    /// Batch sizes of the throughput figures.
    pub batches: Vec<usize>,
    pub batch_tokens: usize,
    pub seed: u64,
}

impl BenchOptions {
    /// The settings under which a figure would mean nothing, each named by its flag.
    pub fn check(&self) -> Result<()> {
        let why = if self.prompt_lens.is_empty() {
            "--prompt-lens names no length; give at least one, e.g. 16,1000".to_string()
        } else if self.prompt_lens.contains(&0) {
            "--prompt-lens has a length of 0; every prompt needs at least one token".to_string()
        } else if self.max_tokens < 2 {
            format!(
                "--max-tokens {}: per output token is what each token after the first adds \
                 ((elapsed(N) - elapsed(1)) / (N - 1)), so it needs at least 2",
                self.max_tokens
            )
        } else if self.repeat == 0 {
            "--repeat 0 times nothing; give at least 1".to_string()
        } else if self.ttft_len == 0 {
            "--ttft-len 0: time to first token needs a prompt of at least one token".to_string()
        } else if self.batches.contains(&0) {
            "--batch has a size of 0; every batch needs at least one prompt".to_string()
        } else if self.batch_tokens < 2 {
            format!(
                "--batch-tokens {}: a batch's decode step is what each token after the first \
                 adds, so it needs at least 2",
                self.batch_tokens
            )
        } else {
            return Ok(());
        };
        Err(Error::Config { message: why })
    }
}

/// Checks a request of the benchmark as the engine checks one it is sent (the model's context,
/// its vocabulary, the pool, `--max-batch`) before anything is timed, and, for a batch, that its
/// prompts fit the pool all at once: otherwise fewer of them would run together than the figure
/// is named for. `flags` names the settings that made the request.
fn check_request(
    engine: &Engine,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    batch: usize,
    flags: impl Fn() -> String,
) -> Result<()> {
    let ids: Vec<Vec<i64>> = prompts
        .iter()
        .map(|p| p.iter().map(|&t| i64::from(t)).collect())
        .collect();
    let bad = |why: String| Error::Config {
        message: format!("{}: {why}", flags()),
    };
    engine
        .validate(&ids, max_tokens, true, batch)
        .map_err(|e| bad(e.to_string()))?;
    if batch > 1 {
        let needed: usize = prompts
            .iter()
            .map(|p| engine.blocks_needed(p.len(), max_tokens))
            .sum();
        let pool = engine.backend().pool().num_blocks;
        if needed > pool {
            return Err(bad(format!(
                "its {} prompts need {needed} KV blocks at once and the pool holds {pool}, so \
                 fewer of them would run together than the batch is named for; raise \
                 --num-blocks (or --kv-cache-memory) or shorten the prompts",
                prompts.len()
            )));
        }
    }
    Ok(())
}

/// Deterministic pseudo-random token ids in [0, vocab): no tokenizer needed, same prompts on
/// every run.
pub fn synthetic_prompt(len: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn run(
    engine: &mut Engine,
    prompts: Vec<Vec<u32>>,
    max_tokens: usize,
    batch: usize,
) -> Result<(Vec<SeqResult>, f64)> {
    let req = Request {
        prompts,
        max_tokens,
        ignore_eos: true,
        batch,
    };
    let mut out = Vec::new();
    let s = engine.generate(&req, |r| {
        out.push(r);
        Ok(())
    })?;
    out.sort_by_key(|r| r.index);
    Ok((out, s.wall_s))
}

/// The orchestrator's split of a batch's wall (docs/PROTOCOL.md): what each token after the
/// first added to the wall of one token per prompt. Two walls timed apart, so noise can make it
/// negative on a box busy enough.
fn decode_step_s(first_wall_s: f64, wall_s: f64, tokens: usize) -> f64 {
    (wall_s - first_wall_s) / (tokens.max(2) - 1) as f64
}

/// The prompt lengths of a batch of `batch` prompts: the timed lengths in turn.
pub fn batch_prompt_lens(prompt_lens: &[usize], batch: usize) -> Vec<usize> {
    (0..batch)
        .map(|i| prompt_lens[i % prompt_lens.len()])
        .collect()
}

/// Each row's context over a batch's decode steps, on average: a prompt of `len` reads `len + k`
/// positions at the step that makes its token `k + 1`, for k from 1 to `tokens - 1`, so
/// `len + tokens / 2` (rounded down). The bytes a step moves grow linearly with its rows'
/// contexts, so the mean step's bytes are those at these contexts.
pub fn step_contexts(prompt_lens: &[usize], batch: usize, tokens: usize) -> Vec<usize> {
    batch_prompt_lens(prompt_lens, batch)
        .into_iter()
        .map(|len| len + tokens.max(2) / 2)
        .collect()
}

/// Runs the benchmark; returns the figures as JSON.
pub fn bench(engine: &mut Engine, opts: &BenchOptions) -> Result<serde_json::Value> {
    opts.check()?;
    let vocab = engine.config().vocab_size;
    let prompts: Vec<Vec<u32>> = opts
        .prompt_lens
        .iter()
        .enumerate()
        .map(|(i, &n)| synthetic_prompt(n, vocab, opts.seed + i as u64))
        .collect();
    let ttft_prompt = synthetic_prompt(opts.ttft_len, vocab, opts.seed + 1000);
    // Each batch's prompts: the timed lengths in turn, all in flight at once.
    let batch_sets: Vec<(usize, Vec<Vec<u32>>)> = opts
        .batches
        .iter()
        .map(|&batch| {
            let prompts = batch_prompt_lens(&opts.prompt_lens, batch)
                .into_iter()
                .enumerate()
                .map(|(i, len)| synthetic_prompt(len, vocab, opts.seed + 2000 + i as u64))
                .collect();
            (batch, prompts)
        })
        .collect();
    // Every request before any is timed: a bad setting fails now, not minutes in.
    check_request(engine, &prompts, opts.max_tokens, 1, || {
        let lens: Vec<String> = opts.prompt_lens.iter().map(usize::to_string).collect();
        format!(
            "--prompt-lens {} at --max-tokens {} (prompt i is the i-th length)",
            lens.join(","),
            opts.max_tokens
        )
    })?;
    check_request(engine, std::slice::from_ref(&ttft_prompt), 1, 1, || {
        format!("--ttft-len {}", opts.ttft_len)
    })?;
    for (batch, batch_prompts) in &batch_sets {
        check_request(engine, batch_prompts, opts.batch_tokens, *batch, || {
            format!(
                "--batch {batch} at --batch-tokens {} (its prompts the --prompt-lens in turn)",
                opts.batch_tokens
            )
        })?;
    }
    // Warm-up: every shape the timed runs use.
    run(engine, prompts.clone(), opts.max_tokens, 1)?;
    let mut per_token = Vec::new();
    let started = Instant::now();
    for _ in 0..opts.repeat {
        let (one, _) = run(engine, prompts.clone(), 1, 1)?;
        let (n, _) = run(engine, prompts.clone(), opts.max_tokens, 1)?;
        for (a, b) in one.iter().zip(&n) {
            per_token.push((b.elapsed_s - a.elapsed_s) / (opts.max_tokens - 1) as f64);
        }
    }
    run(engine, vec![ttft_prompt.clone()], 1, 1)?;
    let mut ttft = Vec::new();
    for _ in 0..opts.repeat {
        let (r, _) = run(engine, vec![ttft_prompt.clone()], 1, 1)?;
        ttft.push(r[0].ttft_s);
    }
    // NaN for no samples, as JSON's null.
    let median = |v: &[f64]| stats::median(v).unwrap_or(f64::NAN);
    let mut batches = serde_json::Map::new();
    let mut phases = serde_json::Map::new();
    for (batch, batch_prompts) in batch_sets {
        run(engine, batch_prompts.clone(), opts.batch_tokens, batch)?;
        // The orchestrator's split of a batch (docs/PROTOCOL.md): its prefill is the wall of
        // max_tokens = 1, its decode step what each further token adds.
        let (mut tps, mut prefill, mut step) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..opts.repeat {
            let (_, first) = run(engine, batch_prompts.clone(), 1, batch)?;
            let (r, wall) = run(engine, batch_prompts.clone(), opts.batch_tokens, batch)?;
            let n: usize = r.iter().map(|x| x.tokens.len()).sum();
            tps.push(n as f64 / wall);
            prefill.push(first);
            step.push(decode_step_s(first, wall, opts.batch_tokens));
        }
        batches.insert(batch.to_string(), median(&tps).into());
        phases.insert(
            batch.to_string(),
            serde_json::json!({"prefill_s": median(&prefill), "step_s": median(&step)}),
        );
    }
    let spread = |v: &[f64]| {
        let m = median(v);
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (hi - lo) / m
    };
    // The samples are each repeat's prompts in turn. Their median mixes the lengths, and so does
    // its spread (a long prompt's tokens cost more): each length's own median and spread say
    // what a repeat moved and what the context costs.
    let by_len: Vec<serde_json::Value> = opts
        .prompt_lens
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let own: Vec<f64> = per_token
                .iter()
                .skip(i)
                .step_by(opts.prompt_lens.len())
                .copied()
                .collect();
            serde_json::json!({"prompt_len": len, "median_s": median(&own), "spread": spread(&own)})
        })
        .collect();
    Ok(serde_json::json!({
        "per_output_token_s": median(&per_token),
        "per_output_token_samples": per_token,
        "per_output_token_spread": spread(&per_token),
        "per_output_token_by_prompt_len": by_len,
        "ttft_s": median(&ttft),
        "ttft_prompt_len": opts.ttft_len,
        "batch_tokens": opts.batch_tokens,
        // Output tokens per second by batch size; the first also as batch_throughput_tok_s.
        "batch_throughput_tok_s": opts.batches.first().and_then(|b| batches.get(&b.to_string())).cloned(),
        "batches": batches,
        // By batch size: the median prefill (max_tokens = 1) and decode step.
        "batch_phases": phases,
        "timed_s": started.elapsed().as_secs_f64(),
        "prompt_lens": opts.prompt_lens,
        "max_tokens": opts.max_tokens,
        "repeat": opts.repeat,
    }))
}

/// Peak resident set of this process (VmHWM), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::cpu::CpuBackend;
    use crate::fault::Faults;
    use crate::kv::{resolve_pool, PoolSize};
    use crate::weights::Checkpoint;

    /// tiny-llama (a context of 512 positions) on the CPU, its pool `blocks` blocks of 16.
    fn tiny_llama(blocks: usize, max_batch: usize) -> Engine {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/tiny-llama/model");
        let cfg = ModelConfig::load(&dir).unwrap();
        let ckpt = Checkpoint::open(&dir).unwrap();
        let pool = resolve_pool(&cfg, 16, PoolSize::Blocks(blocks), max_batch).unwrap();
        let backend = CpuBackend::load(&cfg, &ckpt, pool, &Faults::default()).unwrap();
        Engine::new(Box::new(backend), cfg, max_batch, Faults::default())
    }

    fn small() -> BenchOptions {
        BenchOptions {
            prompt_lens: vec![3, 40],
            max_tokens: 3,
            repeat: 3,
            ttft_len: 8,
            batches: vec![2],
            batch_tokens: 6,
            seed: 1,
        }
    }

    /// Each setting under which a figure would mean nothing is refused by its flag, before the
    /// engine runs anything; as are requests the engine itself would refuse and a batch whose
    /// prompts do not fit the pool at once.
    #[test]
    fn a_bench_that_would_mean_nothing_is_refused_naming_its_flag() {
        let mut engine = tiny_llama(64, 2);
        let refused = |engine: &mut Engine, opts: BenchOptions| {
            let e = bench(engine, &opts).unwrap_err();
            assert!(matches!(e, Error::Config { .. }), "{e:?}");
            e.to_string()
        };
        for (opts, says) in [
            (
                BenchOptions {
                    prompt_lens: vec![],
                    ..small()
                },
                "--prompt-lens names no length",
            ),
            (
                BenchOptions {
                    prompt_lens: vec![3, 0],
                    ..small()
                },
                "--prompt-lens has a length of 0",
            ),
            (
                BenchOptions {
                    max_tokens: 1,
                    ..small()
                },
                "--max-tokens 1: per output token",
            ),
            (
                BenchOptions {
                    repeat: 0,
                    ..small()
                },
                "--repeat 0",
            ),
            (
                BenchOptions {
                    ttft_len: 0,
                    ..small()
                },
                "--ttft-len 0",
            ),
            (
                BenchOptions {
                    batches: vec![2, 0],
                    ..small()
                },
                "--batch has a size of 0",
            ),
            (
                BenchOptions {
                    batch_tokens: 1,
                    ..small()
                },
                "--batch-tokens 1",
            ),
        ] {
            let m = refused(&mut engine, opts);
            assert!(m.contains(says), "{m}");
        }
        // Past the model's 512 positions: the engine's own refusal, with the flags that asked.
        let m = refused(
            &mut engine,
            BenchOptions {
                prompt_lens: vec![3, 510],
                ..small()
            },
        );
        assert!(
            m.starts_with("--prompt-lens 3,510 at --max-tokens 3")
                && m.contains("prompt 1: 510 prompt tokens + max_tokens 3 = 513")
                && m.contains("max_position_embeddings"),
            "{m}"
        );
        let m = refused(
            &mut engine,
            BenchOptions {
                ttft_len: 600,
                ..small()
            },
        );
        assert!(
            m.starts_with("--ttft-len 600: prompt 0: 600 prompt tokens"),
            "{m}"
        );
        let m = refused(
            &mut engine,
            BenchOptions {
                batches: vec![2, 4],
                ..small()
            },
        );
        assert!(
            m.starts_with("--batch 4 at --batch-tokens 6")
                && m.contains("exceeds this engine's --max-batch 2"),
            "{m}"
        );
        // Two prompts of 300 and 40 tokens to 100 each: 399 + 139 positions, 25 + 9 blocks of
        // 16, where a pool of 32 blocks holds each alone but not both.
        let m = refused(
            &mut tiny_llama(32, 2),
            BenchOptions {
                prompt_lens: vec![300, 40],
                batch_tokens: 100,
                ..small()
            },
        );
        assert!(
            m.contains("its 2 prompts need 34 KV blocks at once and the pool holds 32")
                && m.contains("--num-blocks"),
            "{m}"
        );
    }

    #[test]
    fn per_token_figures_are_given_per_prompt_length_from_that_lengths_samples() {
        let mut engine = tiny_llama(64, 2);
        let opts = small();
        let out = bench(&mut engine, &opts).unwrap();
        // Batch 2's wall split: its prefill, and the step each of its 5 further tokens added. The
        // step is a difference of two walls, whose sign a busy test box can flip: only finite.
        let phases = &out["batch_phases"]["2"];
        let (prefill, step) = (
            phases["prefill_s"].as_f64().unwrap(),
            phases["step_s"].as_f64().unwrap(),
        );
        assert!(prefill > 0.0 && step.is_finite(), "{phases}");
        let samples: Vec<f64> = out["per_output_token_samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(samples.len(), 6);
        let by_len = out["per_output_token_by_prompt_len"].as_array().unwrap();
        assert_eq!(by_len.len(), 2);
        for (i, (row, len)) in by_len.iter().zip([3, 40]).enumerate() {
            assert_eq!(row["prompt_len"], len);
            // Repeat r's sample of prompt i is sample r * 2 + i.
            let own = [samples[i], samples[2 + i], samples[4 + i]];
            assert_eq!(row["median_s"].as_f64(), stats::median(&own), "{row}");
            let (lo, hi) = (
                own.iter().copied().fold(f64::INFINITY, f64::min),
                own.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            );
            let spread = row["spread"].as_f64().unwrap();
            assert!(
                (spread - (hi - lo) / stats::median(&own).unwrap()).abs() < 1e-12,
                "{row}"
            );
        }
    }

    #[test]
    fn the_decode_step_is_the_walls_difference_over_the_further_tokens() {
        assert!((decode_step_s(0.010, 0.060, 6) - 0.010).abs() < 1e-15);
        // One token a prompt has no further token: its wall difference is not divided by zero.
        assert!((decode_step_s(0.010, 0.012, 1) - 0.002).abs() < 1e-15);
        assert!(decode_step_s(0.010, 0.009, 3) < 0.0);
    }

    /// A batch's prompts are the timed lengths in turn, and each row's mean context over the
    /// steps is what the steps' own contexts average to.
    #[test]
    fn a_batch_rows_step_context_is_its_prompt_plus_half_its_tokens() {
        assert_eq!(batch_prompt_lens(&[5, 17], 3), [5, 17, 5]);
        assert_eq!(step_contexts(&[5, 17], 3, 128), [69, 81, 69]);
        for (len, tokens) in [(5usize, 128usize), (1000, 128), (16, 2), (3, 6)] {
            // The step making token k + 1 reads len + k positions, k = 1 ..= tokens - 1.
            let steps: Vec<usize> = (1..tokens).map(|k| len + k).collect();
            let mean = steps.iter().sum::<usize>() as f64 / steps.len() as f64;
            assert_eq!(step_contexts(&[len], 1, tokens)[0] as f64, mean);
        }
        // One token a prompt has no step; its context is still defined.
        assert_eq!(step_contexts(&[7], 1, 1), [8]);
    }

    #[test]
    fn synthetic_prompts_are_deterministic_and_in_vocab() {
        let a = synthetic_prompt(100, 37, 5);
        assert_eq!(a, synthetic_prompt(100, 37, 5));
        assert_ne!(a, synthetic_prompt(100, 37, 6));
        assert!(a.iter().all(|&t| t < 37));
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 20);
    }
}
