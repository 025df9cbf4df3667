//! What the tests that run the orchestrator over tests/fake_leg.py share: the files of a unit
//! whose two legs are the fake.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// The fake's tokens, as tests/fake_leg.py computes them.
pub fn token(prompt: &[u32], i: u32) -> u32 {
    (prompt.iter().sum::<u32>() * 7 + i * 3) % 500 + 10
}

/// The unit.toml of a [`write_fake_unit`] directory whose engine is `engine` (the batteries at
/// batch 1 and 2, two repeats, 20 s watchdogs), with `extra` appended.
#[allow(dead_code)] // faults.rs and reliability.rs; the other tests write units of their own
pub fn fake_unit_toml(engine: &Path, extra: &str) -> String {
    format!(
        r#"name = "fake"
model = "model"
[battery]
prompts = "prompts.json"
max_tokens = 8
warmup = 1
repeat = 2
batch_sizes = [1, 2]
[[golden]]
file = "golden.json"
[engine]
binary = "{}"
block_size = 16
num_blocks = 64
[oracle]
backend = "transformers"
[watchdog]
load_s = 20
warmup_s = 20
battery_s = 20
shutdown_s = 5
grace_s = 1
{extra}
"#,
        engine.display()
    )
}

/// Writes into `d` a one-layer model the preflight accepts, `prompts.json`, a `golden.json` of
/// the fake's 8 tokens per prompt, and `engine.sh` / `python.sh` running the fake with
/// `engine_args` / `oracle_args`. Returns the engine wrapper's path; unit.toml is the caller's.
pub fn write_fake_unit(
    d: &Path,
    prompts: &[&[u32]],
    engine_args: &str,
    oracle_args: &str,
) -> PathBuf {
    std::fs::create_dir_all(d.join("model")).unwrap();
    std::fs::write(
        d.join("model/config.json"),
        r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}"#,
    )
    .unwrap();
    let hdr = br#"{"model.layers.0.w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut st = (hdr.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(hdr);
    st.extend_from_slice(&[0; 4]);
    std::fs::write(d.join("model/model.safetensors"), st).unwrap();
    let ps: Vec<Value> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| serde_json::json!({"id": format!("p{i}"), "tokens": p}))
        .collect();
    std::fs::write(
        d.join("prompts.json"),
        serde_json::json!({"schema": 1, "prompts": ps}).to_string(),
    )
    .unwrap();
    let outputs: Vec<Value> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let toks: Vec<u32> = (0..8).map(|j| token(p, j)).collect();
            serde_json::json!({"id": format!("p{i}"), "tokens": toks, "margins": vec![0.5; 8]})
        })
        .collect();
    std::fs::write(
        d.join("golden.json"),
        serde_json::json!({"schema": 1, "max_tokens": 8, "ignore_eos": true,
            "capture": {"backend": "fake", "device": "cpu", "dtype": "float32", "resolved": {"fake": true}},
            "outputs": outputs})
        .to_string(),
    )
    .unwrap();
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_leg.py");
    for (name, args) in [("engine.sh", engine_args), ("python.sh", oracle_args)] {
        let p = d.join(name);
        std::fs::write(
            &p,
            format!("#!/bin/sh\nexec python3 {} {args} \"$@\"\n", fake.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    d.join("engine.sh")
}
