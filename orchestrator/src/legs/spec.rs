//! How each leg is started: its argument vector (never a shell), working directory,
//! environment, log file and sampler, built from the unit and what preflight found; and what
//! each pass over the battery asks it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::legs::lease::LeaseTarget;
use crate::legs::record::{LegName, RequestKind};
use crate::legs::sampler::SamplerSpec;
use crate::unit::preflight::{self, Checked};
use crate::unit::Unit;

/// How to start a leg.
#[derive(Debug, Clone)]
pub struct LegSpec {
    pub leg: LegName,
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub log_path: PathBuf,
    /// What to sample while it runs, and where the series goes.
    pub sampler: SamplerSpec,
    /// The lease's lock file, kept open in the leg so the lease is held until it is gone.
    pub lease_fd: Option<std::os::fd::RawFd>,
}

/// What each pass over the battery asks for.
#[derive(Debug, Clone)]
pub struct BatteryPlan {
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: u32,
    pub ignore_eos: bool,
    pub warmup: u32,
    pub repeat: u32,
    pub batch_sizes: Vec<u32>,
}

impl BatteryPlan {
    /// The requests of one pass: the timing recipe's max_tokens=1 and max_tokens=N at batch 1,
    /// then the same two at each batch size above 1 (its prefill, then its throughput and, by
    /// the difference, its decode step).
    pub fn pass(&self) -> Vec<(RequestKind, u32, u32)> {
        let mut v = vec![
            (RequestKind::FirstToken, 1, 1),
            (RequestKind::Decode, self.max_tokens, 1),
        ];
        let mut sizes: Vec<u32> = self
            .batch_sizes
            .iter()
            .copied()
            .filter(|&b| b > 1)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        for b in sizes {
            v.push((RequestKind::BatchFirstToken, 1, b));
            v.push((RequestKind::Batch, self.max_tokens, b));
        }
        v
    }

    /// The prompts of a request at `batch`: the battery's, repeated in order until there are
    /// at least `batch` of them, so that a batch larger than the battery has `batch` sequences
    /// in flight (a result's `index` names the battery prompt, its `copy` which repeat).
    pub fn prompts_for(&self, batch: u32) -> Vec<Vec<u32>> {
        filled(&self.prompts, batch)
    }

    pub fn prompts_per_pass(&self) -> usize {
        self.pass()
            .iter()
            .map(|&(_, _, batch)| self.prompts.len().max(batch as usize))
            .sum()
    }
}

/// Entry `i` of a request [`filled`] from `n` battery prompts: (its battery prompt, which repeat
/// of it it is).
pub fn battery_row(i: usize, n: usize) -> (usize, u32) {
    let n = n.max(1);
    (i % n, (i / n) as u32)
}

/// `items` repeated in order until there are at least `batch` of them: entry i is
/// `items[i % items.len()]`.
pub fn filled<T: Clone>(items: &[T], batch: u32) -> Vec<T> {
    if items.is_empty() {
        return Vec::new();
    }
    (0..items.len().max(batch as usize))
        .map(|i| items[i % items.len()].clone())
        .collect()
}

/// The engine's argv; `num_blocks` overrides the unit's pool size (the kv gate's resize).
pub fn engine_argv(unit: &Unit, binary: &Path, num_blocks: Option<u64>) -> Vec<String> {
    let e = &unit.config.engine;
    let mut v = vec![
        binary.display().to_string(),
        "serve".into(),
        "--model".into(),
        unit.model_dir().display().to_string(),
        "--device".into(),
        e.device.clone(),
    ];
    if let Some(b) = e.block_size {
        v.extend(["--block-size".into(), b.to_string()]);
    }
    match (num_blocks.or(e.num_blocks), e.kv_cache_memory) {
        (Some(n), _) => v.extend(["--num-blocks".into(), n.to_string()]),
        (None, Some(bytes)) => v.extend(["--kv-cache-memory".into(), bytes.to_string()]),
        (None, None) => {}
    }
    if let Some(m) = e.max_batch {
        v.extend(["--max-batch".into(), m.to_string()]);
    }
    v.extend(e.args.iter().cloned());
    v
}

/// The oracle's argv: `[oracle.options]` and `extra` (which wins: the kv gate's resize),
/// snake_case keys, become `--kebab-case VALUE` flags (a true boolean a bare flag, false
/// omitted), as `python -m oracle serve --help` lists them. The keys are the backend's own: the
/// orchestrator passes them through without knowing any.
pub fn oracle_argv(
    unit: &Unit,
    python: &str,
    extra: &BTreeMap<String, toml::Value>,
) -> Vec<String> {
    let o = &unit.config.oracle;
    let mut v = vec![
        python.to_string(),
        "-m".into(),
        "oracle".into(),
        "serve".into(),
        "--backend".into(),
        o.backend.clone(),
        "--model".into(),
        unit.model_dir().display().to_string(),
        "--device".into(),
        o.device.clone(),
        "--dtype".into(),
        o.dtype.clone(),
    ];
    let mut opts = o.options.clone();
    opts.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (k, val) in &opts {
        let flag = format!("--{}", k.replace('_', "-"));
        match val {
            toml::Value::Boolean(true) => v.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::String(s) => v.extend([flag, s.clone()]),
            other => v.extend([flag, other.to_string()]),
        }
    }
    v
}

/// The lease a unit needs: `[lease] gpu`, else the GPU of `engine.device`, else the cpu lease.
pub fn lease_target(unit: &Unit) -> LeaseTarget {
    if let Some(n) = unit.config.lease.gpu {
        return LeaseTarget::Gpu(n);
    }
    match crate::unit::parse_device(&unit.config.engine.device) {
        Ok(Some(n)) => LeaseTarget::Gpu(n),
        _ => LeaseTarget::Cpu,
    }
}

/// The pool the kv gate's resize asks a leg for: `blocks` blocks. The engine takes
/// `--num-blocks`; the oracle takes it through the option of its backend's that its
/// `ready.kv.resize_option` named (`option`).
#[derive(Debug, Clone)]
pub struct Resize {
    pub blocks: u64,
    pub option: Option<String>,
}

/// The environment variable that tells the oracle which GPU the run leased (a backend that runs
/// on "the visible GPU", as vLLM does, makes it the visible one; docs/PROTOCOL.md).
pub const LEASED_GPU_ENV: &str = "LLM_BENCH_LEASED_GPU";

/// A leg's spec: its argv (`resize`: the kv gate's resize), its log and series files beside the
/// record's `stem` (with `suffix`, e.g. "-resized"), its environment and what the samplers
/// watch.
pub fn leg_spec(
    checked: &Checked,
    leg: LegName,
    stem: &Path,
    lease: &LeaseTarget,
    resize: Option<&Resize>,
    suffix: &str,
) -> LegSpec {
    let c = checked;
    let argv = match leg {
        LegName::Engine => engine_argv(&c.unit, &c.engine_binary, resize.map(|r| r.blocks)),
        LegName::Oracle => {
            let extra = resize
                .and_then(|r| Some((r.option.clone()?, toml::Value::Integer(r.blocks as i64))))
                .into_iter()
                .collect();
            oracle_argv(&c.unit, &c.python, &extra)
        }
    };
    let beside = |what: &str| {
        let mut p = stem.as_os_str().to_owned();
        p.push(format!(".{leg}{suffix}.{what}"));
        PathBuf::from(p)
    };
    let sc = &c.unit.config.sampler;
    let sampler = SamplerSpec {
        gpu: match lease {
            LeaseTarget::Gpu(n) => Some(*n),
            LeaseTarget::Cpu => None,
        },
        nvml_period_ms: sc.nvml_period_ms,
        host_period_ms: sc.host_period_ms,
        series: Some(beside("samples.jsonl.gz")),
    };
    let mut env = vec![(
        "PYTHONPATH".to_string(),
        preflight::pythonpath(&c.project_root),
    )];
    // The oracle's backend decides what the leased GPU means to it. (The engine names its GPU
    // in --device cuda:N.)
    if let (LegName::Oracle, LeaseTarget::Gpu(n)) = (leg, lease) {
        env.push((LEASED_GPU_ENV.into(), n.to_string()));
    }
    LegSpec {
        leg,
        argv,
        cwd: c.project_root.clone(),
        env,
        log_path: beside("log"),
        sampler,
        lease_fd: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal unit with an engine on GPU 1 and a vLLM oracle with options.
    fn unit() -> Unit {
        let text = crate::unit::tests::MINIMAL.replace(
            "[oracle]\nbackend = \"transformers\"\n",
            r#"[engine]
device = "cuda:1"
block_size = 16
kv_cache_memory = 1000000
[oracle]
backend = "vllm"
device = "cuda"
dtype = "bfloat16"
[oracle.options]
enforce_eager = true
seed = 0
gpu_memory_utilization = 0.3
attention_backend = "FLASH_ATTN"
"#,
        );
        Unit::parse(Path::new("/u/unit.toml"), &text).unwrap()
    }

    #[test]
    fn a_batch_larger_than_the_battery_is_filled_with_its_prompts_in_turn() {
        let plan = BatteryPlan {
            prompts: vec![vec![1], vec![2, 2], vec![3]],
            max_tokens: 4,
            ignore_eos: true,
            warmup: 0,
            repeat: 1,
            batch_sizes: vec![1, 2, 8],
        };
        assert_eq!(plan.prompts_for(1), plan.prompts);
        assert_eq!(plan.prompts_for(2), plan.prompts);
        let eight = plan.prompts_for(8);
        assert_eq!(eight.len(), 8);
        for (i, p) in eight.iter().enumerate() {
            assert_eq!(p, &plan.prompts[i % 3]);
        }
        // A pass: n1 and n4 at batch 1 (3 each), n1 and n4 at batch 2 (3 each) and 8 (8 each).
        assert_eq!(plan.prompts_per_pass(), 3 + 3 + 2 * 3 + 2 * 8);
        assert!(filled::<u32>(&[], 8).is_empty());
        // Entry 7 of eight from three prompts: prompt 1, its third run (copy 2).
        assert_eq!(battery_row(7, 3), (1, 2));
        assert_eq!(battery_row(2, 3), (2, 0));
    }

    #[test]
    fn argv_follow_the_legs_command_lines() {
        let u = unit();
        let e = engine_argv(&u, Path::new("/r/engine"), None).join(" ");
        assert_eq!(e, "/r/engine serve --model /u/model --device cuda:1 --block-size 16 --kv-cache-memory 1000000");
        // A kv resize replaces the byte budget by a block count.
        let e = engine_argv(&u, Path::new("/r/engine"), Some(40)).join(" ");
        assert!(e.ends_with("--block-size 16 --num-blocks 40"), "{e}");
        let resize = BTreeMap::from([(
            "num_gpu_blocks_override".to_string(),
            toml::Value::Integer(99),
        )]);
        let o = oracle_argv(&u, "py", &resize).join(" ");
        assert_eq!(
            o,
            "py -m oracle serve --backend vllm --model /u/model --device cuda --dtype bfloat16 \
             --attention-backend FLASH_ATTN --enforce-eager --gpu-memory-utilization 0.3 \
             --num-gpu-blocks-override 99 --seed 0"
        );
        assert_eq!(lease_target(&u), LeaseTarget::Gpu(1));
    }
}
