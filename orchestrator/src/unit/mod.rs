//! `unit.toml` and the data files it names (`prompts.json`, `golden.json`), and the preflight
//! that checks all of them before a leg starts.
//!
//! The unit file is ours: every table denies unknown keys so a typo is an error, never a silent
//! default (config.rs). The JSON data files belong to the oracle side; they are checked by their
//! `schema` number and the fields we read, so that a field added there does not break a run
//! here (data.rs).

pub mod choice;
mod config;
mod data;
pub mod facts;
pub mod preflight;

pub use choice::LegChoice;
use std::fmt;
use std::path::{Path, PathBuf};

pub use config::{
    Battery, EngineCfg, GatesCfg, GoldenRef, KvMatch, LeaseCfg, OracleCfg, SamplerCfg, UnitFile,
    WatchdogCfg, WrongOutput,
};
pub use data::{
    load_golden, load_prompts, Golden, GoldenCapture, GoldenOutput, Prompt, PromptsFile,
};

/// A unit-file (or data-file) problem: the file, what is wrong, and how to fix it.
#[derive(Debug)]
pub struct UnitError {
    pub file: PathBuf,
    pub message: String,
}

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.message)
    }
}

impl std::error::Error for UnitError {}

pub(crate) fn err(file: &Path, message: impl Into<String>) -> UnitError {
    UnitError {
        file: file.to_path_buf(),
        message: message.into(),
    }
}

/// The longest deadline the watchdog takes, in seconds (a week): beyond it a number is a typo,
/// and 1e300 would not even convert to a duration.
pub const MAX_DEADLINE_S: f64 = 604_800.0;

/// The dtypes a leg runs in and a golden is captured in (as `ready.features.dtype` says them).
pub const DTYPES: &[&str] = &["float32", "bfloat16", "float16"];

/// A unit name: the directory of its records, so a plain file name (no newline, no '/', no
/// leading '.' or '-').
fn name_ok(name: &str) -> bool {
    (1..=100).contains(&name.len())
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'))
}

/// A parsed unit with its paths resolved.
#[derive(Debug, Clone)]
pub struct Unit {
    /// The unit file itself.
    pub path: PathBuf,
    /// The directory holding it: relative paths in the file are relative to this.
    pub dir: PathBuf,
    pub config: UnitFile,
}

impl Unit {
    /// The model's layer count from its config.json, where it can be read ([`config_layers`]).
    pub fn model_layers(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.model_dir().join("config.json")).ok()?;
        let cfg: serde_json::Value = serde_json::from_str(&text).ok()?;
        u32::try_from(config_layers(&cfg)?).ok()
    }

    pub fn load(path: &Path) -> Result<Unit, UnitError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            err(
                path,
                format!(
                    "cannot read the unit file ({e}); pass the path of a goldens/<unit>/unit.toml"
                ),
            )
        })?;
        let unit = Unit::parse(path, &text)?;
        Ok(unit)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Unit, UnitError> {
        removed_keys(path, text)?;
        let config: UnitFile = toml::from_str(text).map_err(|e| {
            // toml's message names the key and line; add the fix for the common case.
            let msg = e.to_string();
            let hint = if msg.contains("unknown field") {
                "; every key is listed with its default in docs/UNIT.md (a typo is an error, never a default)"
            } else if msg.contains("missing field") {
                "; add the key (docs/UNIT.md lists the required ones)"
            } else {
                ""
            };
            err(path, format!("{}{hint}", msg.trim_end()))
        })?;
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let dir = abs
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let unit = Unit {
            path: abs,
            dir,
            config,
        };
        unit.validate()?;
        Ok(unit)
    }

    fn validate(&self) -> Result<(), UnitError> {
        let c = &self.config;
        let p = &self.path;
        if !name_ok(&c.name) {
            return Err(err(
                p,
                format!("name = {:?} is not usable as a directory name under reports/records/: letters, digits, '.', '_' and '-' only, 1 to 100 of them, not starting with '.' or '-'; use e.g. \"tiny-llama\"", c.name),
            ));
        }
        if c.battery.max_tokens < 2 {
            return Err(err(
                p,
                format!("battery.max_tokens = {} but the timing recipe needs at least 2 ((elapsed(N) - elapsed(1)) / (N - 1)); set it to 32", c.battery.max_tokens),
            ));
        }
        if c.battery.repeat == 0 {
            return Err(err(
                p,
                "battery.repeat = 0 measures nothing; set it to 1 or more",
            ));
        }
        if c.battery.batch_sizes.is_empty() || c.battery.batch_sizes.contains(&0) {
            return Err(err(
                p,
                format!("battery.batch_sizes = {:?}: each must be >= 1 and the list non-empty; e.g. [1, 4]", c.battery.batch_sizes),
            ));
        }
        if c.engine.num_blocks.is_some() && c.engine.kv_cache_memory.is_some() {
            return Err(err(
                p,
                "engine.num_blocks and engine.kv_cache_memory are both set; the pool is sized by one of them, remove the other",
            ));
        }
        if c.golden.is_empty() {
            return Err(err(
                p,
                "no [[golden]] entry: the token gate needs one (file, device, dtype); see docs/UNIT.md",
            ));
        }
        for (name, v) in [
            ("load_s", c.watchdog.load_s),
            ("warmup_s", c.watchdog.warmup_s),
            ("battery_s", c.watchdog.battery_s),
            ("verify_s", c.watchdog.verify_s),
            ("shutdown_s", c.watchdog.shutdown_s),
            ("grace_s", c.watchdog.grace_s),
            ("stall_min_s", c.watchdog.stall_min_s),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= MAX_DEADLINE_S) {
                return Err(err(
                    p,
                    format!(
                        "watchdog.{name} = {v}: a deadline must be a positive number of seconds, at most {MAX_DEADLINE_S} (a week)"
                    ),
                ));
            }
        }
        let f = c.watchdog.stall_factor;
        if !(1.0..=1000.0).contains(&f) {
            return Err(err(
                p,
                format!("watchdog.stall_factor = {f}: it multiplies a leg's slowest interval between events, so 1 to 1000"),
            ));
        }
        for (name, v, min) in [
            ("nvml_period_ms", c.sampler.nvml_period_ms, 1),
            ("host_period_ms", c.sampler.host_period_ms, 10),
        ] {
            if !(min..=60_000).contains(&v) {
                return Err(err(
                    p,
                    format!("sampler.{name} = {v}: a poll period must be {min} to 60000 ms (0 would poll in a busy loop, taking a core from the legs)"),
                ));
            }
        }
        parse_device(&c.engine.device).map_err(|m| err(p, format!("engine.device: {m}")))?;
        parse_device(&c.oracle.device).map_err(|m| err(p, format!("oracle.device: {m}")))?;
        self.validate_engine()?;
        self.validate_dtypes()
    }

    /// The engine's pool and batch settings: zero is never a size, and the largest batch of the
    /// battery must fit `max_batch` (the engine would refuse it at run time).
    fn validate_engine(&self) -> Result<(), UnitError> {
        let (e, p) = (&self.config.engine, &self.path);
        for (name, v) in [
            ("block_size", e.block_size.map(u64::from)),
            ("num_blocks", e.num_blocks),
            ("kv_cache_memory", e.kv_cache_memory),
            ("max_batch", e.max_batch.map(u64::from)),
        ] {
            if v == Some(0) {
                return Err(err(p, format!("engine.{name} = 0 holds nothing; give 1 or more, or remove the key for the engine's default")));
            }
        }
        let largest = self
            .config
            .battery
            .batch_sizes
            .iter()
            .max()
            .copied()
            .unwrap_or(1);
        if let Some(m) = e.max_batch.filter(|&m| m < largest) {
            return Err(err(
                p,
                format!("engine.max_batch = {m} but battery.batch_sizes asks for batch {largest}, which the engine would refuse; raise max_batch to {largest} or drop that batch size"),
            ));
        }
        Ok(())
    }

    /// Every dtype named is one a leg can run and a golden can be captured in.
    fn validate_dtypes(&self) -> Result<(), UnitError> {
        let c = &self.config;
        let mut named = vec![("oracle.dtype".to_string(), &c.oracle.dtype)];
        for (i, g) in c.golden.iter().enumerate() {
            named.push((format!("golden[{i}].dtype"), &g.dtype));
            parse_device(&g.device)
                .map_err(|m| err(&self.path, format!("golden[{i}].device: {m}")))?;
        }
        for (key, d) in named {
            if !DTYPES.contains(&d.as_str()) {
                return Err(err(
                    &self.path,
                    format!(
                        "{key} = {d:?} is not a dtype a leg runs in; use one of {}",
                        DTYPES.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A path from the unit file, relative to the unit's directory unless absolute.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(p)
        }
    }

    pub fn model_dir(&self) -> PathBuf {
        self.resolve(&self.config.model)
    }

    pub fn prompts_path(&self) -> PathBuf {
        self.resolve(&self.config.battery.prompts)
    }

    /// `engine.binary` is relative to the project root (the git top-level), not the unit.
    pub fn engine_binary(&self, project_root: &Path) -> PathBuf {
        let b = &self.config.engine.binary;
        if b.is_absolute() {
            b.clone()
        } else {
            project_root.join(b)
        }
    }

    /// The golden that applies to a leg that ran on `device` with `dtype`: the first match wins.
    pub fn golden_for(&self, device: &str, dtype: &str) -> Option<&GoldenRef> {
        let kind = device_kind(device);
        self.config
            .golden
            .iter()
            .find(|g| device_kind(&g.device) == kind && g.dtype == dtype)
    }
}

/// Keys this orchestrator no longer reads, each refused with what replaced it (a typo is an
/// error, and so is a setting that would silently do nothing).
fn removed_keys(path: &Path, text: &str) -> Result<(), UnitError> {
    let Ok(v) = text.parse::<toml::Table>() else {
        return Ok(()); // the parse proper names the syntax error
    };
    if v.get("gates")
        .and_then(|g| g.get("near_tie_margin"))
        .is_some()
    {
        return Err(err(
            path,
            "[gates] near_tie_margin was removed: the token gate no longer classifies a free-running mismatch by a hand-set margin; it teacher-forces the golden's tokens and judges each differing position by a tolerance that follows from the dtype and the logits' magnitude (docs/GATES.md, token). Delete the line (and its comment); a golden that should be matched exactly says so with exact = true in its [[golden]] entry",
        ));
    }
    Ok(())
}

/// "cpu" -> None, "cuda" / "cuda:N" -> Some(N).
pub fn parse_device(device: &str) -> Result<Option<u32>, String> {
    if device == "cpu" {
        return Ok(None);
    }
    if device == "cuda" {
        return Ok(Some(0));
    }
    if let Some(n) = device.strip_prefix("cuda:") {
        return n
            .parse()
            .map(Some)
            .map_err(|_| format!("{device:?} is not \"cpu\" or \"cuda:N\""));
    }
    Err(format!("{device:?} is not \"cpu\" or \"cuda:N\""))
}

/// "cuda:1" -> "cuda": goldens are per kind of device, not per index.
pub fn device_kind(device: &str) -> &str {
    device.split(':').next().unwrap_or(device)
}

/// A config.json's layer count: `num_hidden_layers`, or for a hybrid (Nemotron-H) the length of
/// its layer pattern, in either spelling (`layers_block_type`, `hybrid_override_pattern`), which
/// transformers 5 takes over `num_hidden_layers`.
pub fn config_layers(cfg: &serde_json::Value) -> Option<u64> {
    if let Some(list) = cfg.get("layers_block_type").and_then(|v| v.as_array()) {
        return Some(list.len() as u64);
    }
    if let Some(p) = cfg.get("hybrid_override_pattern").and_then(|v| v.as_str()) {
        return Some(p.chars().count() as u64);
    }
    cfg.get("num_hidden_layers")?.as_u64()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_hybrids_layer_count_is_its_patterns_length_in_either_spelling() {
        use serde_json::json;
        let list = json!({"layers_block_type": ["linear_attention", "mlp", "full_attention"],
            "num_hidden_layers": 52});
        assert_eq!(super::config_layers(&list), Some(3));
        assert_eq!(
            super::config_layers(&json!({"hybrid_override_pattern": "M-M*-"})),
            Some(5)
        );
        assert_eq!(
            super::config_layers(&json!({"num_hidden_layers": 16})),
            Some(16)
        );
        assert_eq!(super::config_layers(&json!({})), None);
    }

    /// The smallest unit that parses: every other key takes its default.
    pub const MINIMAL: &str = r#"
name = "t"
model = "model"
[battery]
prompts = "prompts.json"
[[golden]]
file = "golden.json"
[oracle]
backend = "transformers"
"#;

    #[test]
    fn minimal_unit_gets_documented_defaults() {
        let u = Unit::parse(Path::new("/x/unit.toml"), MINIMAL).unwrap();
        let c = &u.config;
        assert_eq!(c.battery.max_tokens, 32);
        assert_eq!(c.battery.repeat, 3);
        assert_eq!(c.battery.warmup, 1);
        assert_eq!(c.battery.batch_sizes, vec![1]);
        assert_eq!(c.engine.binary, PathBuf::from("target/release/engine"));
        assert_eq!(c.watchdog.load_s, 900.0);
        assert_eq!(c.watchdog.shutdown_s, 30.0);
        assert_eq!(c.lease.lock_dir, PathBuf::from("/tmp/llm-bench-locks"));
        assert_eq!(c.gates.kv_match, KvMatch::Engine);
        assert_eq!(u.model_dir(), PathBuf::from("/x/model"));
        assert_eq!(
            u.engine_binary(Path::new("/root")),
            PathBuf::from("/root/target/release/engine")
        );
    }

    /// docs/UNIT.md's example must parse, and show the same defaults the code applies.
    #[test]
    fn the_documented_unit_parses_with_the_documented_defaults() {
        let doc = include_str!("../../../docs/UNIT.md");
        let start = doc.find("```toml\n").expect("a toml block in docs/UNIT.md") + 8;
        let block = &doc[start..start + doc[start..].find("```").unwrap()];
        let documented = Unit::parse(Path::new("/x/unit.toml"), block).unwrap();
        let minimal = Unit::parse(Path::new("/x/unit.toml"), MINIMAL).unwrap();
        let json = |u: &Unit| {
            let c = &u.config;
            serde_json::json!([
                c.battery.max_tokens,
                c.battery.ignore_eos,
                c.battery.warmup,
                c.battery.repeat,
                c.battery.batch_sizes,
                c.engine,
                c.gates,
                c.lease,
                c.watchdog,
                c.sampler,
                c.oracle.python,
                c.oracle.device,
                c.oracle.dtype
            ])
        };
        assert_eq!(json(&documented), json(&minimal));
    }

    #[test]
    fn unknown_key_is_an_error_naming_file_key_and_fix() {
        let text = MINIMAL.replace("[battery]", "[battery]\nrepeats = 2");
        let e = Unit::parse(Path::new("/x/unit.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/x/unit.toml:"), "{e}");
        assert!(e.contains("repeats"), "{e}");
        assert!(e.contains("docs/UNIT.md"), "{e}");
    }

    #[test]
    fn the_removed_near_tie_margin_is_refused_naming_its_replacement() {
        let text = format!("{MINIMAL}\n[gates]\nnear_tie_margin = 0.07\n");
        let e = Unit::parse(Path::new("/x/unit.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/x/unit.toml: [gates] near_tie_margin was removed")
                && e.contains("teacher-forces")
                && e.contains("exact = true"),
            "{e}"
        );
    }

    #[test]
    fn unknown_key_in_watchdog_is_an_error() {
        let text = format!("{MINIMAL}\n[watchdog]\nload = 5\n");
        let e = Unit::parse(Path::new("/x/unit.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("load"), "{e}");
    }

    #[test]
    fn both_pool_sizes_is_an_error() {
        let text = format!("{MINIMAL}\n[engine]\nnum_blocks = 4\nkv_cache_memory = 100\n");
        let e = Unit::parse(Path::new("/x/unit.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("remove the other"), "{e}");
    }

    #[test]
    fn max_tokens_one_is_refused_by_the_recipe() {
        let text = MINIMAL.replace("[battery]", "[battery]\nmax_tokens = 1");
        let e = Unit::parse(Path::new("/x/unit.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 2"), "{e}");
    }

    fn refused(text: &str) -> String {
        Unit::parse(Path::new("/x/unit.toml"), text)
            .unwrap_err()
            .to_string()
    }

    /// Values that parsed and then panicked or misbehaved at run time are named at preflight.
    #[test]
    fn hostile_values_are_refused_by_name() {
        for (key, table, v) in [
            ("battery_s", "watchdog", "1e300"),
            ("grace_s", "watchdog", "1e300"),
            ("load_s", "watchdog", "inf"),
        ] {
            let e = refused(&format!("{MINIMAL}\n[{table}]\n{key} = {v}\n"));
            assert!(
                e.contains(&format!("watchdog.{key} = ")) && e.contains("a week"),
                "{e}"
            );
        }
        let e = refused(&format!("{MINIMAL}\n[sampler]\nhost_period_ms = 0\n"));
        assert!(
            e.contains("sampler.host_period_ms = 0") && e.contains("busy loop"),
            "{e}"
        );
        for name in ["a\\nb", "", ".hidden", "-x", "a/b", "a b"] {
            let e = refused(&MINIMAL.replace("name = \"t\"", &format!("name = \"{name}\"")));
            assert!(e.contains("not usable as a directory name"), "{name}: {e}");
        }
        let e = refused(&format!("{MINIMAL}\n[engine]\nmax_batch = 0\n"));
        assert!(e.contains("engine.max_batch = 0 holds nothing"), "{e}");
        let e = refused(
            &MINIMAL
                .replace("[battery]", "[battery]\nbatch_sizes = [1, 8]")
                .replace("[oracle]", "[engine]\nmax_batch = 4\n[oracle]"),
        );
        assert!(
            e.contains("engine.max_batch = 4 but battery.batch_sizes asks for batch 8"),
            "{e}"
        );
        let e = refused(&MINIMAL.replace(
            "file = \"golden.json\"",
            "file = \"golden.json\"\ndtype = \"float64\"",
        ));
        assert!(
            e.contains("golden[0].dtype = \"float64\" is not a dtype"),
            "{e}"
        );
        let e = refused(&MINIMAL.replace(
            "backend = \"transformers\"",
            "backend = \"transformers\"\ndevice = \"tpu\"",
        ));
        assert!(e.contains("oracle.device"), "{e}");
    }

    /// A golden cut to 10 tokens against max_tokens = 32 passed preflight, then the token gate
    /// refused both legs ("first differs at position 9: got 511, golden 511").
    #[test]
    fn a_golden_shorter_than_max_tokens_is_refused_at_load() {
        let d = tempfile::tempdir().unwrap();
        let g = |n: usize| {
            serde_json::json!({"schema": 1, "max_tokens": 32, "ignore_eos": true,
                "capture": {}, "outputs": [{"id": "p0", "tokens": vec![5; n]}]})
            .to_string()
        };
        let path = d.path().join("golden.json");
        let u = Unit::parse(Path::new("/x/unit.toml"), MINIMAL).unwrap();
        let prompts = vec![Prompt {
            id: "p0".into(),
            tokens: vec![1],
        }];
        std::fs::write(&path, g(32)).unwrap();
        assert!(load_golden(&path, &u.config.battery, &prompts).is_ok());
        std::fs::write(&path, g(10)).unwrap();
        let e = load_golden(&path, &u.config.battery, &prompts)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("prompt \"p0\" holds 10 token(s) but battery.max_tokens = 32"),
            "{e}"
        );
    }

    #[test]
    fn golden_choice_by_device_kind_and_dtype() {
        let text = MINIMAL.replace(
            "[[golden]]\nfile = \"golden.json\"",
            "[[golden]]\nfile = \"g-cpu.json\"\n[[golden]]\nfile = \"g-gpu.json\"\ndevice = \"cuda\"\ndtype = \"bfloat16\"",
        );
        let u = Unit::parse(Path::new("/x/unit.toml"), &text).unwrap();
        assert_eq!(
            u.golden_for("cuda:1", "bfloat16").unwrap().file,
            PathBuf::from("g-gpu.json")
        );
        assert_eq!(
            u.golden_for("cpu", "float32").unwrap().file,
            PathBuf::from("g-cpu.json")
        );
        assert!(u.golden_for("cuda:0", "float32").is_none());
    }
}
