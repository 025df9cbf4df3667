//! The unit file's tables, as serde reads them: every table denies unknown keys, and every
//! default lives in one `fn default_*` here, documented in docs/UNIT.md.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitFile {
    pub name: String,
    pub model: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub battery: Battery,
    #[serde(default)]
    pub golden: Vec<GoldenRef>,
    #[serde(default)]
    pub engine: EngineCfg,
    pub oracle: OracleCfg,
    #[serde(default)]
    pub gates: GatesCfg,
    #[serde(default)]
    pub lease: LeaseCfg,
    #[serde(default)]
    pub watchdog: WatchdogCfg,
    #[serde(default)]
    pub sampler: SamplerCfg,
}

/// How often the samplers poll during a leg (docs/UNIT.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplerCfg {
    #[serde(default = "default_nvml_period")]
    pub nvml_period_ms: u64,
    #[serde(default = "default_host_period")]
    pub host_period_ms: u64,
}

impl Default for SamplerCfg {
    fn default() -> Self {
        SamplerCfg {
            nvml_period_ms: default_nvml_period(),
            host_period_ms: default_host_period(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Battery {
    pub prompts: PathBuf,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    #[serde(default = "default_true")]
    pub ignore_eos: bool,
    #[serde(default = "default_warmup")]
    pub warmup: u32,
    #[serde(default = "default_repeat")]
    pub repeat: u32,
    #[serde(default = "default_batch_sizes")]
    pub batch_sizes: Vec<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldenRef {
    pub file: PathBuf,
    #[serde(default = "default_cpu")]
    pub device: String,
    #[serde(default = "default_float32")]
    pub dtype: String,
    /// Hold every leg and batch size to exact match against this golden (a trained model's
    /// sharp logits), instead of teacher forcing where the golden is another implementation's.
    #[serde(default, skip_serializing_if = "is_false")]
    pub exact: bool,
    /// Prompts whose output in this golden is known wrong (a bug of the implementation that
    /// captured it, shown by evidence the reason names): another leg is not teacher-forced
    /// against them; the golden's own implementation is still held to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wrong: Vec<WrongOutput>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WrongOutput {
    /// The prompt's id in the battery's prompts file.
    pub prompt: String,
    /// Why the golden is wrong there, with where the evidence is.
    pub reason: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineCfg {
    #[serde(default = "default_engine_binary")]
    pub binary: PathBuf,
    #[serde(default = "default_cpu")]
    pub device: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_blocks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_memory: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch: Option<u32>,
    /// Extra arguments appended to `engine serve` (a leg-specific flag the orchestrator
    /// does not know about).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

impl Default for EngineCfg {
    fn default() -> Self {
        EngineCfg {
            binary: default_engine_binary(),
            device: default_cpu(),
            block_size: None,
            num_blocks: None,
            kv_cache_memory: None,
            max_batch: None,
            args: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OracleCfg {
    /// The oracle's backend, as `python -m oracle` names it: the list is the oracle's own
    /// (oracle/backends/__init__.py), and preflight's `python -m oracle check --backend` refuses
    /// a name it does not know.
    pub backend: String,
    #[serde(default = "default_python")]
    pub python: String,
    #[serde(default = "default_cpu")]
    pub device: String,
    #[serde(default = "default_float32")]
    pub dtype: String,
    #[serde(default)]
    pub options: BTreeMap<String, toml::Value>,
}

/// Which leg the kv gate resizes when the two pools differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvMatch {
    /// Restart the engine with `--num-blocks` sized to the oracle's capacity (oracle runs first).
    Engine,
    /// Restart the oracle with `num_gpu_blocks_override` sized to the engine's (engine runs first).
    Oracle,
    /// Never resize: differing pools are refused as they are.
    Off,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatesCfg {
    #[serde(default = "default_kv_match")]
    pub kv_match: KvMatch,
    /// Pools within this many blocks (of the larger block size) count as the same.
    #[serde(default = "default_one")]
    pub kv_tolerance_blocks: u64,
    /// `resolved` keys the golden config gate does not compare (e.g. a path that differs by host).
    #[serde(default)]
    pub golden_config_ignore: Vec<String>,
    /// The clock gate (docs/GATES.md): each leg's GPU busy in at least this share of the battery.
    #[serde(default = "default_min_busy")]
    pub clock_min_busy_pct: f64,
    /// (p95 - p5) / median of the SM clock over the battery, at most this.
    #[serde(default = "default_max_spread")]
    pub clock_max_spread_pct: f64,
    /// Throttle (clock event) reasons that do not refuse a leg.
    #[serde(default = "default_allowed_throttle")]
    pub clock_allowed_throttle: Vec<String>,
    #[serde(default = "default_true")]
    pub clock_require_persistence: bool,
    #[serde(default = "default_true")]
    pub clock_require_same_boot: bool,
    /// The legs' median SM clocks within this percentage of each other.
    #[serde(default = "default_one_f")]
    pub clock_max_median_offset_pct: f64,
    /// Points of per-token time per point of SM clock: how much of a gap a clock offset explains.
    #[serde(default = "default_one_f")]
    pub clock_basis: f64,
}

impl Default for GatesCfg {
    fn default() -> Self {
        GatesCfg {
            kv_match: default_kv_match(),
            kv_tolerance_blocks: 1,
            golden_config_ignore: Vec::new(),
            clock_min_busy_pct: default_min_busy(),
            clock_max_spread_pct: default_max_spread(),
            clock_allowed_throttle: default_allowed_throttle(),
            clock_require_persistence: true,
            clock_require_same_boot: true,
            clock_max_median_offset_pct: default_one_f(),
            clock_basis: default_one_f(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseCfg {
    /// GPU index to lease; absent: taken from `engine.device` (`cuda:N`), else the "cpu" lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(default = "default_lock_dir")]
    pub lock_dir: PathBuf,
    /// GPU memory in use (MiB) above which the idle gate (gates/idle.rs) refuses to start a leg.
    #[serde(default = "default_idle_mib")]
    pub idle_max_used_mib: u64,
}

impl Default for LeaseCfg {
    fn default() -> Self {
        LeaseCfg {
            gpu: None,
            lock_dir: default_lock_dir(),
            idle_max_used_mib: default_idle_mib(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchdogCfg {
    #[serde(default = "default_load_s")]
    pub load_s: f64,
    #[serde(default = "default_warmup_s")]
    pub warmup_s: f64,
    #[serde(default = "default_battery_s")]
    pub battery_s: f64,
    /// The token gate's teacher-forced pass after the battery (docs/GATES.md, token).
    #[serde(default = "default_verify_s")]
    pub verify_s: f64,
    #[serde(default = "default_shutdown_s")]
    pub shutdown_s: f64,
    /// Seconds between SIGTERM and SIGKILL of a leg's process group.
    #[serde(default = "default_grace_s")]
    pub grace_s: f64,
    /// The progress deadline: once a leg has answered, it is stopped if it then emits nothing
    /// for max(stall_min_s, stall_factor x the longest interval between its events so far).
    #[serde(default = "default_stall_factor")]
    pub stall_factor: f64,
    #[serde(default = "default_stall_min_s")]
    pub stall_min_s: f64,
}

impl Default for WatchdogCfg {
    fn default() -> Self {
        WatchdogCfg {
            load_s: default_load_s(),
            warmup_s: default_warmup_s(),
            battery_s: default_battery_s(),
            verify_s: default_verify_s(),
            shutdown_s: default_shutdown_s(),
            grace_s: default_grace_s(),
            stall_factor: default_stall_factor(),
            stall_min_s: default_stall_min_s(),
        }
    }
}

fn default_max_tokens() -> u32 {
    32
}
pub(crate) fn default_true() -> bool {
    true
}
fn default_warmup() -> u32 {
    1
}
fn default_repeat() -> u32 {
    3
}
fn default_batch_sizes() -> Vec<u32> {
    vec![1]
}
fn default_cpu() -> String {
    "cpu".into()
}
fn default_float32() -> String {
    "float32".into()
}
fn default_engine_binary() -> PathBuf {
    "target/release/engine".into()
}
fn default_python() -> String {
    "python3".into()
}
fn default_kv_match() -> KvMatch {
    KvMatch::Engine
}
fn default_one() -> u64 {
    1
}
fn default_one_f() -> f64 {
    1.0
}
fn default_min_busy() -> f64 {
    50.0
}
fn default_max_spread() -> f64 {
    5.0
}
fn default_allowed_throttle() -> Vec<String> {
    vec!["GpuIdle".into(), "ApplicationsClocksSetting".into()]
}
fn default_nvml_period() -> u64 {
    20
}
fn default_host_period() -> u64 {
    100
}
fn default_lock_dir() -> PathBuf {
    "/tmp/llm-bench-locks".into()
}
fn default_idle_mib() -> u64 {
    1024
}
fn default_load_s() -> f64 {
    900.0
}
fn default_warmup_s() -> f64 {
    600.0
}
fn default_battery_s() -> f64 {
    3600.0
}
fn default_verify_s() -> f64 {
    600.0
}
fn default_shutdown_s() -> f64 {
    30.0
}
fn default_grace_s() -> f64 {
    5.0
}
fn default_stall_factor() -> f64 {
    10.0
}
fn default_stall_min_s() -> f64 {
    60.0
}
