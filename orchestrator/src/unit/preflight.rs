//! Preflight: everything that can be known wrong before a leg starts, each failure a named error
//! with its fix. `orchestrator check UNIT` runs it alone; `run` runs it first.

use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::unit::facts::ModelFacts;
use crate::unit::{self, Golden, LegChoice, Prompt, Unit};
use crate::util::term::sayln;

/// Architectures the engine serves (docs/UNIT.md keeps this list).
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "NemotronHForCausalLM",
];

/// One failed check: which, and the whole explanation.
#[derive(Debug, Clone)]
pub struct CheckFailure {
    pub check: &'static str,
    pub message: String,
}

impl std::fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.check, self.message)
    }
}

/// Where the oracle's interpreter comes from: --python, then env LLM_BENCH_PYTHON, then the unit.
pub fn oracle_python(unit: &Unit, cli: Option<&str>) -> String {
    cli.map(str::to_string)
        .or_else(|| {
            std::env::var("LLM_BENCH_PYTHON")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| unit.config.oracle.python.clone())
}

/// What a passed preflight hands to the run.
#[derive(Debug)]
pub struct Checked {
    pub unit: Unit,
    pub project_root: PathBuf,
    pub prompts: Vec<Prompt>,
    /// By `[[golden]].file` as written in the unit.
    pub goldens: BTreeMap<PathBuf, Golden>,
    pub engine_binary: PathBuf,
    pub python: String,
}

pub struct Report {
    pub lines: Vec<String>,
    pub failures: Vec<CheckFailure>,
    /// Each line also goes to stderr as it is decided.
    print: bool,
}

impl Report {
    fn say(&mut self, line: String) {
        if self.print {
            sayln!("[check] {line}");
        }
        self.lines.push(line);
    }
    fn ok(&mut self, check: &str, what: String) {
        self.say(format!("ok   {check}: {what}"));
    }
    fn fail(&mut self, check: &'static str, message: String) {
        self.say(format!("FAIL {check}: {message}"));
        self.failures.push(CheckFailure { check, message });
    }
    fn check(&mut self, check: &'static str, r: Result<String, String>) {
        match r {
            Ok(what) => self.ok(check, what),
            Err(m) => self.fail(check, m),
        }
    }
}

/// A pending SIGINT/SIGTERM/SIGHUP (util/interrupt.rs) becomes the `interrupted` failure.
fn interrupted(rep: &mut Report, when: &str) -> bool {
    match crate::util::interrupt::pending() {
        Some(sig) => {
            rep.fail("interrupted", format!("{sig} {when}; nothing was run"));
            true
        }
        None => false,
    }
}

/// The project root: the git top-level holding the unit, else the one holding the current
/// directory (a unit outside the repository, as in tests).
pub fn find_project_root(unit_dir: &Path) -> Option<PathBuf> {
    crate::util::git::project_root(unit_dir)
        .or_else(|| crate::util::git::project_root(Path::new(".")))
}

/// Runs every check (not stopping at the first failure, so one pass shows everything to fix).
/// `print` writes each line to stderr as it is decided.
pub fn preflight(
    unit_path: &Path,
    python_cli: Option<&str>,
    print: bool,
) -> (Report, Option<Checked>) {
    preflight_legs(unit_path, python_cli, print, LegChoice::Both)
}

/// [`preflight`] for a run of `legs` only: the absent leg's program is not checked.
pub fn preflight_legs(
    unit_path: &Path,
    python_cli: Option<&str>,
    print: bool,
    legs: LegChoice,
) -> (Report, Option<Checked>) {
    let mut rep = Report {
        lines: vec![],
        failures: vec![],
        print,
    };
    let unit = match Unit::load(unit_path) {
        Ok(u) => {
            rep.ok("unit", format!("{} parses", unit_path.display()));
            u
        }
        Err(e) => {
            rep.fail("unit", e.to_string());
            return (rep, None);
        }
    };
    let Some(root) = find_project_root(&unit.dir) else {
        rep.fail(
            "project",
            format!(
                "neither {} nor the current directory is inside a git repository; run from the project checkout (engine.binary and the record's tree hash come from it)",
                unit.dir.display()
            ),
        );
        return (rep, None);
    };
    let prompts = match unit::load_prompts(&unit.prompts_path()) {
        Ok(p) => {
            rep.ok("prompts", format!("{} prompt(s), schema 1", p.len()));
            Some(p)
        }
        Err(e) => {
            rep.fail("prompts", e.to_string());
            None
        }
    };
    rep.check("model", check_model(&unit.model_dir()));
    let facts = ModelFacts::read(&unit.model_dir());
    if let (Some(prompts), Some(facts)) = (&prompts, &facts) {
        rep.check("vocabulary", facts.check_prompts(prompts));
    }
    let goldens = match &prompts {
        Some(p) => load_goldens(&mut rep, &unit, p, facts.as_ref()),
        None => BTreeMap::new(),
    };
    let engine_binary = unit.engine_binary(&root);
    let not_run = || Ok(format!("not run ({})", legs.why_not()));
    rep.check(
        "engine",
        match legs.engine() {
            false => not_run(),
            true => check_executable(&engine_binary)
                .map(|()| format!("{} is executable", engine_binary.display()))
                .map_err(|m| format!(
                    "{m}; build it with `cargo build --release -p engine` (engine.binary is relative to the project root {})",
                    root.display()
                )),
        },
    );
    let python = oracle_python(&unit, python_cli);
    if legs.oracle() && !interrupted(&mut rep, "before the oracle check") {
        rep.check(
            "oracle",
            check_oracle(&python, unit.config.oracle.backend.as_str(), &root),
        );
        interrupted(&mut rep, "during the oracle check, which was stopped");
    } else if !legs.oracle() {
        rep.check("oracle", not_run());
    }
    let checked = (rep.failures.is_empty()).then(|| Checked {
        unit,
        project_root: root,
        prompts: prompts.unwrap_or_default(),
        goldens,
        engine_binary,
        python,
    });
    (rep, checked)
}

/// Each `[[golden]]` of the unit, loaded and checked against the battery and the model's
/// vocabulary and EOS ids (`facts`), by its file name.
fn load_goldens(
    rep: &mut Report,
    unit: &Unit,
    prompts: &[Prompt],
    facts: Option<&ModelFacts>,
) -> BTreeMap<PathBuf, Golden> {
    let mut goldens = BTreeMap::new();
    for g in &unit.config.golden {
        let path = unit.resolve(&g.file);
        let loaded = unit::load_golden(&path, &unit.config.battery, prompts)
            .map_err(|e| e.to_string())
            .and_then(|gold| match facts {
                Some(f) => f
                    .check_golden(&gold, unit.config.battery.max_tokens)
                    .map(|()| gold)
                    .map_err(|m| format!("{}: {m}", path.display())),
                None => Ok(gold),
            })
            .and_then(|gold| match g.wrong.iter().find(|w| !prompts.iter().any(|p| p.id == w.prompt)) {
                Some(w) => Err(format!(
                    "{}: [[golden]] wrong names prompt {:?}, which the battery's prompts file does not hold; name a prompt id from it",
                    g.file.display(),
                    w.prompt
                )),
                None => Ok(gold),
            });
        match loaded {
            Ok(gold) => {
                rep.ok(
                    "golden",
                    format!(
                        "{} ({} outputs, {} tokens, captured by {} on {} {})",
                        g.file.display(),
                        gold.outputs.len(),
                        gold.max_tokens,
                        gold.capture.backend.as_deref().unwrap_or("?"),
                        gold.capture.device.as_deref().unwrap_or("?"),
                        gold.capture.dtype.as_deref().unwrap_or("?")
                    ),
                );
                goldens.insert(g.file.clone(), gold);
            }
            Err(e) => rep.fail("golden", e),
        }
    }
    goldens
}

fn check_executable(p: &Path) -> Result<(), String> {
    let md = std::fs::metadata(p).map_err(|e| format!("{} does not exist ({e})", p.display()))?;
    if !md.is_file() {
        return Err(format!("{} is not a file", p.display()));
    }
    if md.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not executable (chmod +x it)", p.display()));
    }
    Ok(())
}

fn read_json(p: &Path) -> Result<Value, String> {
    let text =
        std::fs::read_to_string(p).map_err(|e| format!("cannot read {} ({e})", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON ({e})", p.display()))
}

/// The tensor names in a safetensors file's header (8-byte little-endian length, then JSON).
fn safetensors_names(p: &Path) -> Result<Vec<String>, String> {
    use std::io::Read;
    let mut f = std::fs::File::open(p).map_err(|e| format!("cannot open {} ({e})", p.display()))?;
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| format!("{} is too short to be a safetensors file", p.display()))?;
    let n = u64::from_le_bytes(len);
    if n == 0 || n > 100_000_000 || 8 + n > size {
        return Err(format!(
            "{} has a header length of {n} bytes in a {size}-byte file: truncated or not safetensors",
            p.display()
        ));
    }
    let mut buf = vec![0u8; n as usize];
    f.read_exact(&mut buf)
        .map_err(|e| format!("cannot read the header of {} ({e})", p.display()))?;
    let v: Value = serde_json::from_slice(&buf).map_err(|e| {
        format!(
            "the header of {} is not JSON ({e}): corrupt file",
            p.display()
        )
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| format!("the header of {} is not an object", p.display()))?;
    Ok(obj
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect())
}

/// config.json parses and names a supported architecture; the safetensors files named by the
/// index exist, their headers parse, hold the tensors the index places in them, and hold as
/// many decoder layers as config.json says.
pub fn check_model(dir: &Path) -> Result<String, String> {
    let cfg_path = dir.join("config.json");
    if !dir.is_dir() {
        return Err(format!(
            "{} is not a directory; `model` in the unit names a checkpoint directory, relative to the unit",
            dir.display()
        ));
    }
    let cfg = read_json(&cfg_path)?;
    let arch = cfg
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{} has no \"architectures\" list", cfg_path.display()))?;
    if !SUPPORTED_ARCHITECTURES.contains(&arch) {
        return Err(format!(
            "{} names architecture {arch:?}, which the engine does not serve (supported: {})",
            cfg_path.display(),
            SUPPORTED_ARCHITECTURES.join(", ")
        ));
    }
    let index_path = dir.join("model.safetensors.index.json");
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if index_path.exists() {
        let idx = read_json(&index_path)?;
        let map = idx
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| format!("{} has no weight_map", index_path.display()))?;
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| {
                format!(
                    "{}: weight_map[{tensor:?}] is not a file name",
                    index_path.display()
                )
            })?;
            files
                .entry(file.to_string())
                .or_default()
                .push(tensor.clone());
        }
    } else {
        let rd =
            std::fs::read_dir(dir).map_err(|e| format!("cannot list {} ({e})", dir.display()))?;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".safetensors") {
                files.insert(name, vec![]);
            }
        }
    }
    if files.is_empty() {
        return Err(format!(
            "{} holds no .safetensors file (and no model.safetensors.index.json)",
            dir.display()
        ));
    }
    let mut all = vec![];
    for (file, expected) in &files {
        let p = dir.join(file);
        if !p.exists() {
            return Err(format!(
                "{} names {file}, which does not exist in {}",
                index_path.display(),
                dir.display()
            ));
        }
        let names = safetensors_names(&p)?;
        if let Some(missing) = expected.iter().find(|t| !names.contains(t)) {
            return Err(format!(
                "{} places tensor {missing:?} in {file}, whose header does not hold it",
                index_path.display()
            ));
        }
        all.extend(names);
    }
    let layers = all
        .iter()
        .filter_map(|n| {
            let rest = n.split(".layers.").nth(1)?;
            rest.split('.').next()?.parse::<u64>().ok()
        })
        .max()
        .map(|m| m + 1);
    let want = unit::config_layers(&cfg);
    if let (Some(have), Some(want)) = (layers, want) {
        if have != want {
            return Err(format!(
                "config.json says the model has {want} layers but the safetensors files hold layers 0..{have}: the weights are not this config's"
            ));
        }
    }
    Ok(format!(
        "{arch}, {} safetensors file(s), {} tensors{}",
        files.len(),
        all.len(),
        want.map(|w| format!(", {w} layers")).unwrap_or_default()
    ))
}

/// `PYTHON -m oracle check --backend B` from the project root; its FAIL lines are quoted.
fn check_oracle(python: &str, backend: &str, root: &Path) -> Result<String, String> {
    let shown = format!("{python} -m oracle check --backend {backend}");
    let mut cmd = Command::new(python);
    cmd.args(["-m", "oracle", "check", "--backend", backend])
        .current_dir(root)
        .env("PYTHONPATH", pythonpath(root))
        .stdin(std::process::Stdio::null());
    let out = run_with_timeout(cmd, Duration::from_secs(600)).map_err(|e| {
        match crate::util::interrupt::pending() {
            Some(sig) => format!("`{shown}` was stopped by {sig}"),
            None => format!("`{shown}` could not be run ({e}); set [oracle] python, --python or LLM_BENCH_PYTHON to an interpreter with the oracle's requirements"),
        }
    })?;

    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        let oks = text
            .lines()
            .filter(|l| l.trim_start().starts_with("ok"))
            .count();
        return Ok(format!("`{shown}` passed ({oks} ok line(s))"));
    }
    let fails: Vec<&str> = text.lines().filter(|l| l.contains("FAIL")).collect();
    let quoted: Vec<&str> = if fails.is_empty() {
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(8)..].to_vec()
    } else {
        fails
    };
    Err(format!(
        "`{shown}` exited with {}:\n    | {}",
        out.status,
        quoted.join("\n    | ")
    ))
}

/// The project root first on PYTHONPATH, so `-m oracle` finds this checkout's package.
pub fn pythonpath(root: &Path) -> String {
    match std::env::var("PYTHONPATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", root.display()),
        _ => root.display().to_string(),
    }
}

/// Runs `cmd` to its end, in a process group of its own tied to the orchestrator
/// (util/child.rs); the group is killed at `limit`, or when a SIGINT/SIGTERM/SIGHUP arrives.
fn run_with_timeout(mut cmd: Command, limit: Duration) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    crate::util::child::tie(&mut cmd, None);
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let guard = crate::util::child::GroupGuard::start(child.id() as i32).ok();
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let t_out = std::thread::spawn(move || {
        let mut b = vec![];
        let _ = so.read_to_end(&mut b);
        b
    });
    let t_err = std::thread::spawn(move || {
        let mut b = vec![];
        let _ = se.read_to_end(&mut b);
        b
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        let why = if start.elapsed() > limit {
            Some(format!("no answer in {} s", limit.as_secs()))
        } else {
            crate::util::interrupt::pending().map(|sig| format!("stopped by {sig}"))
        };
        if let Some(why) = why {
            if let Some(g) = guard {
                g.fire();
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The child is gone; anything it left in its group (which would hold the pipes open) goes.
    let pgid = child.id() as i32;
    match guard {
        Some(g) if crate::util::procfs::group_members(pgid).is_empty() => g.release(),
        Some(g) => g.fire(),
        None => {}
    }
    Ok(std::process::Output {
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_st(p: &Path, names: &[&str]) {
        let mut hdr = serde_json::Map::new();
        for n in names {
            hdr.insert(
                n.to_string(),
                serde_json::json!({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}),
            );
        }
        let h = serde_json::to_vec(&Value::Object(hdr)).unwrap();
        let mut b = (h.len() as u64).to_le_bytes().to_vec();
        b.extend(h);
        b.extend([0u8; 4]);
        std::fs::write(p, b).unwrap();
    }

    /// The backends are the oracle's list (oracle/backends/__init__.py), not a second one here:
    /// a unit names any backend, and the oracle's own check refuses one it does not serve.
    #[test]
    fn an_unknown_backend_is_refused_by_the_oracles_own_check() {
        let unit = Unit::parse(
            Path::new("/x/unit.toml"),
            "name = \"t\"\nmodel = \"m\"\n[battery]\nprompts = \"p.json\"\n[[golden]]\nfile = \"g.json\"\n[oracle]\nbackend = \"tensorrt\"\n",
        )
        .unwrap();
        assert_eq!(unit.config.oracle.backend, "tensorrt");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let e = check_oracle("python3", &unit.config.oracle.backend, root).unwrap_err();
        assert!(
            e.contains("invalid choice") && e.contains("tensorrt") && e.contains("vllm"),
            "{e}"
        );
    }

    #[test]
    fn model_checks_name_what_disagrees() {
        let d = tempfile::tempdir().unwrap();
        let cfg = |arch: &str, layers: u32| {
            std::fs::write(
                d.path().join("config.json"),
                format!(r#"{{"architectures": ["{arch}"], "num_hidden_layers": {layers}}}"#),
            )
            .unwrap()
        };
        cfg("LlamaForCausalLM", 2);
        assert!(check_model(d.path())
            .unwrap_err()
            .contains("no .safetensors"));
        write_st(
            &d.path().join("model.safetensors"),
            &["model.layers.0.w", "model.layers.1.w"],
        );
        assert!(check_model(d.path()).unwrap().contains("2 layers"));
        cfg("LlamaForCausalLM", 3);
        assert!(check_model(d.path())
            .unwrap_err()
            .contains("the model has 3 layers"));
        cfg("GPT2LMHeadModel", 2);
        assert!(check_model(d.path())
            .unwrap_err()
            .contains("does not serve"));
        cfg("LlamaForCausalLM", 2);
        std::fs::write(
            d.path().join("model.safetensors.index.json"),
            r#"{"weight_map": {"model.layers.0.w": "model.safetensors", "model.layers.1.w": "model-00002.safetensors"}}"#,
        )
        .unwrap();
        assert!(check_model(d.path())
            .unwrap_err()
            .contains("model-00002.safetensors, which does not exist"));
        std::fs::write(
            d.path().join("model-00002.safetensors"),
            b"\x05\0\0\0\0\0\0\0{",
        )
        .unwrap();
        assert!(check_model(d.path())
            .unwrap_err()
            .contains("truncated or not safetensors"));
    }
}
