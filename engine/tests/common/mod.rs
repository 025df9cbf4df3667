//! Helpers shared by the engine's integration tests: the tiny units, and `engine serve` driven
//! as a child process exactly as the orchestrator drives it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

use serde_json::{json, Value};

pub const UNITS: &[&str] = &[
    "tiny-llama",
    "tiny-qwen",
    "tiny-qwen3",
    "tiny-trained",
    "tiny-nemotron-h",
    "tiny-trained-h",
];

/// The faults that change the logits (fault.rs), each with the tiny unit it is planted in;
/// `nan_past_512` needs a longer context and `slow_step` changes only the timing.
pub const LOGIT_FAULTS: &[(&str, &str)] = &[
    ("rope_shift", "tiny-llama"),
    ("norm_skip", "tiny-llama"),
    ("attn_scale_d", "tiny-llama"),
    ("kv_group", "tiny-llama"),
    ("drop_bias", "tiny-qwen"),
];

/// The faults planted in the hybrid's blocks (its attention layers and a block norm), on the
/// CPU only until its CUDA backend exists.
pub const HYBRID_LOGIT_FAULTS: &[(&str, &str)] = &[
    ("norm_skip", "tiny-nemotron-h"),
    ("attn_scale_d", "tiny-nemotron-h"),
    ("kv_group", "tiny-nemotron-h"),
];

/// The repository root: `ENGINE_REPO_ROOT` when a test binary runs away from where it was built
/// (the GPU box), else the source tree it was built from.
pub fn repo() -> PathBuf {
    match std::env::var_os("ENGINE_REPO_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf(),
    }
}

/// The engine binary: `ENGINE_BIN` when set (see `repo`), else the one cargo built.
pub fn engine_bin() -> PathBuf {
    std::env::var_os("ENGINE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_engine")))
}

pub fn unit_dir(unit: &str) -> PathBuf {
    repo().join("goldens").join(unit)
}

pub fn model_dir(unit: &str) -> PathBuf {
    unit_dir(unit).join("model")
}

/// A copy of a single-file tiny unit's model in a temporary directory, its `config.json` changed
/// by `edit`.
pub fn model_with_config(unit: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(model_dir(unit).join(f), tmp.path().join(f)).unwrap();
    }
    let cfg_path = tmp.path().join("config.json");
    let mut cfg = read_json(&cfg_path);
    edit(&mut cfg);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    tmp
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// (prompt token lists, golden token lists, golden max_tokens), in the prompts file's order.
pub fn battery(unit: &str) -> (Vec<Vec<i64>>, Vec<Vec<u32>>, usize) {
    let (p, g, m, _) = battery_with_margins(unit, "golden.json");
    (p, g, m)
}

/// As `battery`, from a named golden file, with the golden's top-2 margins per position.
#[allow(clippy::type_complexity)]
pub fn battery_with_margins(
    unit: &str,
    golden_file: &str,
) -> (Vec<Vec<i64>>, Vec<Vec<u32>>, usize, Vec<Vec<f64>>) {
    let prompts = read_json(&unit_dir(unit).join("prompts.json"));
    let golden = read_json(&unit_dir(unit).join(golden_file));
    assert_eq!(golden["ignore_eos"], true, "{unit}: golden must ignore EOS");
    let mut ps = Vec::new();
    let mut gs = Vec::new();
    let mut ms = Vec::new();
    for p in prompts["prompts"].as_array().unwrap() {
        let id = p["id"].as_str().unwrap();
        let out = golden["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["id"] == id)
            .unwrap_or_else(|| panic!("{unit}: golden has no output for {id}"));
        ps.push(serde_json::from_value(p["tokens"].clone()).unwrap());
        gs.push(serde_json::from_value(out["tokens"].clone()).unwrap());
        ms.push(serde_json::from_value(out["margins"].clone()).unwrap_or_default());
    }
    (ps, gs, golden["max_tokens"].as_u64().unwrap() as usize, ms)
}

/// One prompt's `verified` event; a `null` gap or scale (NaN) is `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub argmax: Vec<u32>,
    pub gap: Vec<Option<f64>>,
    pub scale: Vec<Option<f64>>,
}

pub struct Leg {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Leg {
    pub fn start(model: &Path, extra: &[&str]) -> Self {
        Self::start_with_env(model, extra, &[])
    }

    pub fn start_with_env(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(engine_bin())
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("engine binary starts");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    pub fn send(&mut self, v: &Value) {
        self.send_line(&v.to_string());
    }

    /// The next event; panics on end of output or a line that is not JSON.
    pub fn recv(&mut self) -> Value {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).unwrap();
        assert!(n > 0, "the leg closed stdout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"))
    }

    /// Sends a generate request and collects results by index, then `done`.
    pub fn generate(
        &mut self,
        id: &str,
        prompts: &[Vec<i64>],
        max_tokens: usize,
        batch: usize,
    ) -> (Vec<Value>, Value) {
        self.send(&json!({"type": "generate", "id": id, "prompts": prompts,
            "max_tokens": max_tokens, "ignore_eos": true, "batch": batch}));
        let mut results = vec![Value::Null; prompts.len()];
        loop {
            let ev = self.recv();
            match ev["type"].as_str() {
                Some("result") => {
                    assert_eq!(ev["id"], id);
                    let i = ev["index"].as_u64().unwrap() as usize;
                    assert!(results[i].is_null(), "two results for prompt {i}");
                    results[i] = ev;
                }
                Some("done") => {
                    assert!(
                        results.iter().all(|r| !r.is_null()),
                        "done before all results"
                    );
                    return (results, ev);
                }
                _ => panic!("unexpected event {ev}"),
            }
        }
    }

    /// Sends a verify request and collects `verified` events by index, then `done`.
    pub fn verify(
        &mut self,
        id: &str,
        prompts: &[Vec<i64>],
        forced: &[Vec<u32>],
        batch: usize,
    ) -> (Vec<Verified>, Value) {
        self.send(
            &json!({"type": "verify", "id": id, "prompts": prompts, "forced": forced,
            "batch": batch}),
        );
        let mut results: Vec<Option<Verified>> = vec![None; prompts.len()];
        loop {
            let ev = self.recv();
            match ev["type"].as_str() {
                Some("verified") => {
                    assert_eq!(ev["id"], id);
                    assert_eq!(ev["path"], "decode");
                    let i = ev["index"].as_u64().unwrap() as usize;
                    assert!(results[i].is_none(), "two verified events for prompt {i}");
                    let v = Verified {
                        argmax: serde_json::from_value(ev["argmax"].clone()).unwrap(),
                        gap: serde_json::from_value(ev["gap"].clone()).unwrap(),
                        scale: serde_json::from_value(ev["scale"].clone()).unwrap(),
                    };
                    assert_eq!(v.argmax.len(), forced[i].len(), "{ev}");
                    assert_eq!(v.gap.len(), forced[i].len(), "{ev}");
                    assert_eq!(v.scale.len(), forced[i].len(), "{ev}");
                    results[i] = Some(v);
                }
                Some("done") => {
                    let all: Option<Vec<Verified>> = results.into_iter().collect();
                    let all = all.expect("done before every verified event");
                    let n: usize = forced.iter().map(Vec::len).sum();
                    assert_eq!(ev["tokens"], n, "{ev}");
                    return (all, ev);
                }
                _ => panic!("unexpected event {ev}"),
            }
        }
    }

    pub fn shutdown(mut self) -> ExitStatus {
        self.send(&json!({"type": "shutdown"}));
        self.wait()
    }

    /// Closes stdin and waits; asserts nothing more was printed.
    pub fn wait(mut self) -> ExitStatus {
        drop(self.stdin.take());
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        assert!(rest.is_empty(), "output after the last event: {rest:?}");
        self.child.wait().unwrap()
    }
}
