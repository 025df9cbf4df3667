//! The engine's loader, fuzzed: tiny-llama's or tiny-nemotron-h's config.json with a size, an
//! epsilon, a RoPE block, a layer pattern or a type made hostile, and its safetensors file with
//! the header's JSON edited, bytes changed or the file cut. `engine serve` must answer `ready` (and then serve) or one bounded
//! `load_failed` naming the cause, within seconds and a 4 GiB address space, never crash.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::tally::{self, check_orphans, End, Tally};
use crate::{clip, root, Rng};

const CONFIG_KEYS: &[&str] = &[
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "vocab_size",
    "max_position_embeddings",
    "rope_parameters",
    "eos_token_id",
    "architectures",
    "tie_word_embeddings",
    "hidden_act",
    "dtype",
    "attention_bias",
    "mlp_bias",
    // The hybrid's (Nemotron-H); each family ignores the other's keys.
    "layers_block_type",
    "hybrid_override_pattern",
    "mamba_num_heads",
    "mamba_head_dim",
    "n_groups",
    "ssm_state_size",
    "conv_kernel",
    "time_step_min",
    "layer_norm_epsilon",
    "mlp_hidden_act",
    "num_nextn_predict_layers",
    "use_conv_bias",
    "use_bias",
];

fn hostile_value(rng: &mut Rng) -> Value {
    let v = [
        json!(0),
        json!(-1),
        json!(1),
        json!(3),
        json!(7),
        json!(64),
        json!(65),
        json!(1u64 << 20),
        json!(1u64 << 31),
        json!(u64::MAX),
        json!(1e300),
        json!(-1e-5),
        json!(0.0),
        json!("x"),
        json!(null),
        json!([]),
        json!({}),
        json!(true),
        json!(["GPT2LMHeadModel"]),
        json!({"rope_type": "llama3", "factor": 0, "rope_theta": -1}),
        json!({"rope_type": "yarn"}),
        json!([2, 1u64 << 40]),
        json!("M*-E"),
        json!("MMMM"),
        json!(["moe", "mlp"]),
        json!(["linear_attention"]),
        json!("relu2"),
    ];
    rng.pick(&v).clone()
}

/// The header (as JSON) and the data section of a safetensors file.
fn split(bytes: &[u8]) -> (Value, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[8..8 + n]).unwrap(),
        bytes[8 + n..].to_vec(),
    )
}

fn join(header: &Value, data: &[u8]) -> Vec<u8> {
    let h = header.to_string();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

/// One hostile change to the model directory `d`; returns what it did.
fn mutate(rng: &mut Rng, d: &Path) -> String {
    let cfg_path = d.join("config.json");
    let st_path = d.join("model.safetensors");
    match rng.below(6) {
        0..=2 => {
            let mut cfg: Value =
                serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
            let k = *rng.pick(CONFIG_KEYS);
            let v = hostile_value(rng);
            let what = format!("config.json {k} = {}", clip(&v.to_string(), 60));
            if rng.chance(5) {
                cfg.as_object_mut().unwrap().remove(k);
            } else {
                cfg[k] = v;
            }
            std::fs::write(&cfg_path, cfg.to_string()).unwrap();
            what
        }
        3 => {
            let bytes = std::fs::read(&st_path).unwrap();
            let (mut h, data) = split(&bytes);
            let names: Vec<String> = h.as_object().unwrap().keys().cloned().collect();
            let name = rng.pick(&names).clone();
            let field = *rng.pick(&["dtype", "shape", "data_offsets"]);
            let v = match field {
                "dtype" => json!(*rng.pick(&["F64", "I8", "BOOL", "x", "BF16"])),
                "shape" => {
                    json!(*rng.pick(&[vec![0u64], vec![1 << 40, 1 << 40], vec![], vec![7, 7]]))
                }
                _ => json!(*rng.pick(&[vec![0u64, 1 << 62], vec![5, 3], vec![0, 0]])),
            };
            h[&name][field] = v;
            std::fs::write(&st_path, join(&h, &data)).unwrap();
            format!("safetensors {name}.{field} changed")
        }
        4 => {
            let mut bytes = std::fs::read(&st_path).unwrap();
            let i = rng.below(bytes.len());
            bytes[i] = rng.below(256) as u8;
            std::fs::write(&st_path, bytes).unwrap();
            format!("safetensors byte {i} changed")
        }
        _ => {
            let len = std::fs::metadata(&st_path).unwrap().len() as usize;
            let cut = rng.below(len);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&st_path)
                .unwrap();
            f.set_len(cut as u64).unwrap();
            format!("safetensors cut at {cut} of {len} bytes")
        }
    }
}

/// Loads `d` with `engine serve` under a 4 GiB address space; on `ready`, asks for one prompt.
fn load(engine: &Path, d: &Path, marker: &str) -> End {
    let mut c = Command::new(engine);
    c.args(["serve", "--model"])
        .arg(d)
        .args(["--max-batch", "2", "--num-blocks", "16"])
        .env("LLM_BENCH_TEST_MARK", marker)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 4 << 30,
                rlim_max: 4 << 30,
            };
            libc::setrlimit(libc::RLIMIT_AS, &lim);
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let _ = stdin.write_all(b"{\"type\":\"generate\",\"id\":\"g\",\"prompts\":[[1,2,3]],\"max_tokens\":4,\"ignore_eos\":true,\"batch\":1}\n{\"type\":\"shutdown\"}\n");
    drop(stdin);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut stderr = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
        err
    });
    std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_line(&mut out);
        let mut rest = String::new();
        while stdout.read_line(&mut rest).is_ok_and(|n| n > 0) {}
        let err = err_reader.join().unwrap_or_default();
        let _ = tx.send((out, rest, err));
    });
    let Ok((first, rest, err)) = rx.recv_timeout(Duration::from_secs(30)) else {
        let _ = child.kill();
        let _ = child.wait();
        return End::Hang("no ready or error in 30 s".into());
    };
    let st = child.wait().unwrap();
    let ran = tally::Ran {
        status: Some(st),
        stdout: first.clone(),
        stderr: err,
    };
    if let Some(c) = ran.crashed() {
        return End::Panic(c);
    }
    let ev: Value = serde_json::from_str(&first).unwrap_or_default();
    match ev["type"].as_str() {
        Some("ready")
            if st.success() && (rest.contains("\"done\"") || rest.contains("\"error\"")) =>
        {
            End::Accepted
        }
        Some("error") if ev["code"] == "load_failed" && st.code() == Some(1) => {
            let m = ev["message"].as_str().unwrap_or("");
            if m.len() > 4200 {
                End::Unnamed(format!("a load error of {} bytes", m.len()))
            } else {
                End::Named
            }
        }
        _ => End::Unnamed(format!(
            "exit {st}; first line {}; then {}",
            clip(&first, 200),
            clip(&rest, 200)
        )),
    }
}

pub fn run(rng: &mut Rng, t: &mut Tally) {
    let Some(engine) = crate::engine_binary() else {
        return;
    };
    for i in 0..120 {
        let unit = if i % 2 == 0 {
            "tiny-llama"
        } else {
            "tiny-nemotron-h"
        };
        let src = root().join("goldens").join(unit).join("model");
        let dir = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        let what: Vec<String> = (0..1 + rng.below(2))
            .map(|_| mutate(rng, dir.path()))
            .collect();
        let marker = format!("hostile-loader-{}-{i}", std::process::id());
        let end = load(&engine, dir.path(), &marker);
        t.add(
            "engine loader",
            &format!("{unit}: {}", what.join("; ")),
            end,
        );
        check_orphans(t, "engine loader", &marker);
    }
}
