use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use engine::load::{self, LoadOptions};

/// Our inference engine: Llama-family checkpoints, paged KV cache, greedy decoding.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the leg protocol (docs/PROTOCOL.md) on stdin/stdout; logs go to stderr.
    Serve(ModelArgs),
    /// Generate greedily for one or more prompts and print the new token ids.
    Generate(GenerateArgs),
    /// Measure the engine's speed (per output token, time to first token, batch throughput,
    /// load, peak host memory) and, on a GPU, the bandwidth floor; prints a JSON object.
    Bench(BenchArgs),
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Lengths of the synthetic prompts timed per output token.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256,1000")]
    prompt_lens: Vec<usize>,
    /// New tokens per prompt for the per-output-token recipe.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Timed repeats over one load.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Prompt length for time to first token.
    #[arg(long, default_value_t = 512)]
    ttft_len: usize,
    /// Batch sizes for the throughput figures (e.g. 8,32; each needs --max-batch at least as
    /// large).
    #[arg(long, value_delimiter = ',', default_value = "8")]
    batch: Vec<usize>,
    /// New tokens per prompt for the throughput figure.
    #[arg(long, default_value_t = 128)]
    batch_tokens: usize,
}

#[derive(Args)]
struct ModelArgs {
    /// Directory with config.json and model.safetensors (or its sharded index).
    #[arg(long)]
    model: PathBuf,
    /// Compute device.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// KV pool size in blocks (default: room for --max-batch sequences of the model's full
    /// context, at most 1 GiB).
    #[arg(long, conflicts_with = "kv_cache_memory")]
    num_blocks: Option<usize>,
    /// KV pool size in bytes, rounded down to whole blocks.
    #[arg(long)]
    kv_cache_memory: Option<usize>,
    /// Most sequences in flight together.
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt token ids, comma-separated; repeat for several prompts.
    #[arg(long, action = clap::ArgAction::Append, required_unless_present = "prompts")]
    prompt: Vec<String>,
    /// A prompts.json file (`{"schema": 1, "prompts": [{"id": ..., "tokens": [...]}]}`).
    #[arg(long, conflicts_with = "prompt")]
    prompts: Option<PathBuf>,
    #[arg(long, default_value_t = 32, value_parser = at_least_one())]
    max_tokens: usize,
    /// Do not stop at an EOS token.
    #[arg(long)]
    ignore_eos: bool,
    /// Prompts in flight together.
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    batch: usize,
}

/// A count of 1 or more, refused by clap with the flag's name (the engine's own refusal of a 0
/// speaks of the serve protocol's requests).
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..)
}

#[derive(Deserialize)]
struct PromptsFile {
    schema: u32,
    prompts: Vec<PromptEntry>,
}

#[derive(Deserialize)]
struct PromptEntry {
    id: String,
    tokens: Vec<i64>,
}

impl ModelArgs {
    fn options(&self) -> LoadOptions {
        LoadOptions {
            model: self.model.clone(),
            device: self.device.clone(),
            block_size: self.block_size,
            num_blocks: self.num_blocks,
            kv_cache_memory: self.kv_cache_memory,
            max_batch: self.max_batch,
            // Read once, here, for serve, generate and bench alike.
            fault: std::env::var_os(engine::fault::ENV).map(|v| v.to_string_lossy().into_owned()),
        }
    }

    fn init_threads(&self) {
        if let Some(n) = self.threads {
            // Only fails if a pool was built already, which cannot happen this early.
            let _ = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build_global();
        }
    }
}

fn main() -> ExitCode {
    let started = Instant::now();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            args.init_threads();
            let code = engine::serve::serve(
                &args.options(),
                started,
                std::io::stdin().lock(),
                std::io::stdout().lock(),
            );
            ExitCode::from(code as u8)
        }
        Command::Bench(args) => match bench(&args, started) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Generate(args) => match generate(&args, started) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

fn read_prompts(args: &GenerateArgs) -> Result<Vec<(String, Vec<i64>)>, String> {
    if let Some(path) = &args.prompts {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file: PromptsFile = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a prompts file: {e}", path.display()))?;
        if file.schema != 1 {
            return Err(format!(
                "{} has schema {}; this engine reads schema 1",
                path.display(),
                file.schema
            ));
        }
        return Ok(file.prompts.into_iter().map(|p| (p.id, p.tokens)).collect());
    }
    let mut prompts = Vec::new();
    for (i, raw) in args.prompt.iter().enumerate() {
        let tokens = raw
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<i64>()
                    .map_err(|_| format!("--prompt: {s:?} is not a token id"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        prompts.push((i.to_string(), tokens));
    }
    Ok(prompts)
}

fn generate(args: &GenerateArgs, started: Instant) -> Result<(), String> {
    args.model.init_threads();
    let prompts = read_prompts(args)?;
    let opts = args.model.options();
    let mut engine = load::load(&opts).map_err(|e| e.to_string())?;
    let pool = engine.backend().pool();
    eprintln!(
        "loaded {} in {:.2} s; KV pool {} blocks x {} = {} tokens",
        opts.model.display(),
        started.elapsed().as_secs_f64(),
        pool.num_blocks,
        pool.block_size,
        pool.capacity_tokens()
    );
    let token_lists: Vec<Vec<i64>> = prompts.iter().map(|(_, t)| t.clone()).collect();
    let req = engine
        .validate(&token_lists, args.max_tokens, args.ignore_eos, args.batch)
        .map_err(|e| e.to_string())?;
    let mut results = Vec::new();
    let summary = engine
        .generate(&req, |r| {
            results.push(r);
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    results.sort_by_key(|r| r.index);
    let mut out = std::io::stdout().lock();
    for r in &results {
        let ids: Vec<String> = r.tokens.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "{}: {}", prompts[r.index].0, ids.join(","));
    }
    eprintln!(
        "{} new tokens in {:.3} s ({:.1} tokens/s)",
        summary.tokens,
        summary.wall_s,
        summary.tokens as f64 / summary.wall_s
    );
    Ok(())
}

fn bench(args: &BenchArgs, started: Instant) -> Result<(), String> {
    args.model.init_threads();
    let opts = args.model.options();
    let mut engine = load::load(&opts).map_err(|e| e.to_string())?;
    let load_s = started.elapsed().as_secs_f64();
    let cfg = engine.config().clone();
    eprintln!("loaded {} in {load_s:.2} s", opts.model.display());
    let bopts = engine::bench::BenchOptions {
        prompt_lens: args.prompt_lens.clone(),
        max_tokens: args.max_tokens,
        repeat: args.repeat,
        ttft_len: args.ttft_len,
        batches: args.batch.clone(),
        batch_tokens: args.batch_tokens,
        seed: 7,
    };
    let mut out = engine::bench::bench(&mut engine, &bopts).map_err(|e| e.to_string())?;
    out["load_s"] = load_s.into();
    out["peak_host_bytes"] = engine::bench::peak_rss_bytes().into();
    out["features"] = engine.features();
    out["model"] = opts.model.display().to_string().into();
    let per_token = out["per_output_token_s"].as_f64().unwrap_or(f64::NAN);
    if let Ok(load::Device::Cuda(ord)) = load::Device::parse(&opts.device) {
        drop(engine);
        let bw = engine::cuda::bench::copy_bandwidth(ord, 1 << 31).map_err(|e| e.to_string())?;
        let bytes = engine::cuda::bench::bytes_per_token(&cfg);
        let floor = bytes as f64 / bw;
        out["copy_bandwidth_bytes_s"] = bw.into();
        out["bytes_per_token"] = bytes.into();
        out["floor_s"] = floor.into();
        out["fraction_of_floor"] = (floor / per_token).into();
        eprintln!(
            "floor: {bytes} bytes per token / {:.0} GB/s copy = {:.3} ms",
            bw / 1e9,
            floor * 1e3
        );
        // Each batch's decode step against the bytes it must move at its rows' mean contexts.
        for &b in &args.batch {
            let contexts = engine::bench::step_contexts(&args.prompt_lens, b, args.batch_tokens);
            let bytes = engine::cuda::bench::bytes_per_step(&cfg, &contexts);
            let phase = &mut out["batch_phases"][b.to_string()];
            let step = phase["step_s"].as_f64().unwrap_or(f64::NAN);
            phase["step_bytes"] = bytes.into();
            phase["step_floor_s"] = (bytes as f64 / bw).into();
            phase["step_fraction_of_floor"] = (bytes as f64 / bw / step).into();
        }
    }
    let batches: Vec<String> = args
        .batch
        .iter()
        .map(|b| {
            let tps = out["batches"][b.to_string()].as_f64().unwrap_or(f64::NAN);
            let phase = |k: &str| {
                out["batch_phases"][b.to_string()][k]
                    .as_f64()
                    .unwrap_or(f64::NAN)
                    * 1e3
            };
            let floor = out["batch_phases"][b.to_string()]["step_fraction_of_floor"]
                .as_f64()
                .map(|f| format!(", {:.0}% of its floor", f * 100.0))
                .unwrap_or_default();
            format!(
                "batch {b} x {} tokens: {tps:.0} tok/s (prefill {:.2} ms, step {:.3} ms{floor})",
                args.batch_tokens,
                phase("prefill_s"),
                phase("step_s")
            )
        })
        .collect();
    // A warm load (caches an earlier start filled) is no measure of a cold one: say which.
    let warmth = match out["features"]["load_cache"]["state"].as_str() {
        Some(state) if state != "none" => format!(" ({state})"),
        _ => String::new(),
    };
    eprintln!(
        "per output token {:.3} ms (spread {:.1}%){}; ttft({}) {:.2} ms; {}; load {load_s:.2} s{warmth}; peak host {:.0} MiB{}",
        per_token * 1e3,
        out["per_output_token_spread"].as_f64().unwrap_or(0.0) * 100.0,
        by_prompt_len(&out["per_output_token_by_prompt_len"]),
        args.ttft_len,
        out["ttft_s"].as_f64().unwrap_or(f64::NAN) * 1e3,
        batches.join("; "),
        out["peak_host_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 20) as f64,
        out["fraction_of_floor"]
            .as_f64()
            .map(|f| format!("; {:.0}% of the bandwidth floor", f * 100.0))
            .unwrap_or_default()
    );
    println!("{out}");
    Ok(())
}

/// `; by prompt length 16: 0.914 ms (spread 0.2%), 1000: 0.960 ms (0.4%), the longest +5.0% on
/// the shortest`: what the overall median mixes (empty for one length).
fn by_prompt_len(rows: &serde_json::Value) -> String {
    let rows: Vec<(u64, f64, f64)> = rows
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| {
                    Some((
                        r["prompt_len"].as_u64()?,
                        r["median_s"].as_f64()?,
                        r["spread"].as_f64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    if rows.len() < 2 {
        return String::new();
    }
    let parts: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(i, (len, m, sp))| {
            let label = if i == 0 { "spread " } else { "" };
            format!("{len}: {:.3} ms ({label}{:.1}%)", m * 1e3, sp * 100.0)
        })
        .collect();
    let shortest = rows.iter().min_by_key(|r| r.0).expect("two rows");
    let longest = rows.iter().max_by_key(|r| r.0).expect("two rows");
    format!(
        "; by prompt length {}, the longest {:+.1}% on the shortest",
        parts.join(", "),
        (longest.1 / shortest.1 - 1.0) * 100.0
    )
}
