//! How each leg is started: its argument vector (never a shell), working directory,
//! environment, log file and sampler, built from the unit and what preflight found; and what
//! each pass over the battery asks it.

use std::path::{Path, PathBuf};

use crate::legs::lease::LeaseTarget;
use crate::legs::record::{LegName, RequestKind};
use crate::legs::sampler::SamplerSpec;
use crate::unit::preflight::{self, Checked};
use crate::unit::{OracleBackend, Unit};

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
    /// then max_tokens=N at each batch size above 1.
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
            v.push((RequestKind::Batch, self.max_tokens, b));
        }
        v
    }

    pub fn prompts_per_pass(&self) -> usize {
        self.pass().len() * self.prompts.len()
    }
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

/// The oracle's argv: `[oracle.options]` snake_case keys become `--kebab-case VALUE` flags (a
/// true boolean a bare flag, false omitted), as `python -m oracle serve --help` lists them.
pub fn oracle_argv(unit: &Unit, python: &str, blocks_override: Option<u64>) -> Vec<String> {
    let o = &unit.config.oracle;
    let mut v = vec![
        python.to_string(),
        "-m".into(),
        "oracle".into(),
        "serve".into(),
        "--backend".into(),
        o.backend.as_str().into(),
        "--model".into(),
        unit.model_dir().display().to_string(),
        "--device".into(),
        o.device.clone(),
        "--dtype".into(),
        o.dtype.clone(),
    ];
    let mut opts = o.options.clone();
    if let Some(n) = blocks_override {
        opts.insert(
            "num_gpu_blocks_override".into(),
            toml::Value::Integer(n as i64),
        );
    }
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

/// A leg's spec: its argv (`resize`: the pool size the kv gate's resize asks for), its log
/// and series files beside the record's `stem` (with `suffix`, e.g. "-resized"), its
/// environment and what the samplers watch.
pub fn leg_spec(
    checked: &Checked,
    leg: LegName,
    stem: &Path,
    lease: &LeaseTarget,
    resize: Option<u64>,
    suffix: &str,
) -> LegSpec {
    let c = checked;
    let argv = match leg {
        LegName::Engine => engine_argv(&c.unit, &c.engine_binary, resize),
        LegName::Oracle => oracle_argv(&c.unit, &c.python, resize),
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
        series: Some(beside("samples.jsonl")),
    };
    let mut env = vec![(
        "PYTHONPATH".to_string(),
        preflight::pythonpath(&c.project_root),
    )];
    // vLLM takes "the visible GPU": make that the leased one. (The engine names its GPU in
    // --device cuda:N, which a narrowed CUDA_VISIBLE_DEVICES would renumber.)
    if let (LegName::Oracle, OracleBackend::Vllm, LeaseTarget::Gpu(n)) =
        (leg, c.unit.config.oracle.backend, lease)
    {
        env.push(("CUDA_VISIBLE_DEVICES".into(), n.to_string()));
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

    const UNIT: &str = r#"
name = "t"
model = "model"
[battery]
prompts = "prompts.json"
[[golden]]
file = "golden.json"
[engine]
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
"#;

    #[test]
    fn argv_follow_the_legs_command_lines() {
        let u = Unit::parse(Path::new("/u/unit.toml"), UNIT).unwrap();
        let e = engine_argv(&u, Path::new("/r/engine"), None).join(" ");
        assert_eq!(e, "/r/engine serve --model /u/model --device cuda:1 --block-size 16 --kv-cache-memory 1000000");
        // A kv resize replaces the byte budget by a block count.
        let e = engine_argv(&u, Path::new("/r/engine"), Some(40)).join(" ");
        assert!(e.ends_with("--block-size 16 --num-blocks 40"), "{e}");
        let o = oracle_argv(&u, "py", Some(99)).join(" ");
        assert_eq!(
            o,
            "py -m oracle serve --backend vllm --model /u/model --device cuda --dtype bfloat16 \
             --attention-backend FLASH_ATTN --enforce-eager --gpu-memory-utilization 0.3 \
             --num-gpu-blocks-override 99 --seed 0"
        );
        assert_eq!(lease_target(&u), LeaseTarget::Gpu(1));
    }
}
