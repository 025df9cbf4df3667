//! A broken checkpoint is a `load_failed` error event that names the cause, then exit status 1:
//! never a panic, never an out-of-bounds read.

mod common;

use std::path::Path;

use common::{model_dir, Leg};
use serde_json::json;

/// Copies a tiny unit's model into a temporary directory to break it there.
fn copy_model(unit: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(model_dir(unit)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
    }
    tmp
}

/// Starts `engine serve` on `model` and returns the message of the fatal error it must send.
fn load_error(model: &Path) -> String {
    let mut leg = Leg::start(model, &[]);
    let ev = leg.recv();
    assert_eq!(ev["type"], "error", "{ev}");
    assert_eq!(ev["code"], "load_failed", "{ev}");
    assert_eq!(ev["fatal"], true);
    let status = leg.wait();
    assert_eq!(status.code(), Some(1));
    ev["message"].as_str().unwrap().to_string()
}

/// The header (as JSON) and the data section of a safetensors file.
fn split(path: &Path) -> (serde_json::Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

fn join(header: &serde_json::Value, data: &[u8]) -> Vec<u8> {
    let h = header.to_string();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn missing_and_misshapen_tensors_are_all_listed() {
    let tmp = copy_model("tiny-llama");
    let file = tmp.path().join("model.safetensors");
    let (mut header, data) = split(&file);
    // Drop one tensor (its bytes stay, renamed, so the file is still consistent) and give
    // another a wrong shape with the same element count.
    let t = header
        .as_object_mut()
        .unwrap()
        .remove("model.layers.1.mlp.up_proj.weight")
        .unwrap();
    header["model.layers.1.mlp.up_proj.unused"] = t;
    header["model.layers.0.self_attn.q_proj.weight"]["shape"] = json!([32, 128]);
    std::fs::write(&file, join(&header, &data)).unwrap();
    let msg = load_error(tmp.path());
    assert!(msg.contains("2 problem(s)"), "{msg}");
    assert!(
        msg.contains("model.layers.1.mlp.up_proj.weight: missing"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "model.layers.0.self_attn.q_proj.weight: shape [32, 128], config.json implies [64, 64]"
        ),
        "{msg}"
    );
}

#[test]
fn truncated_file_is_refused() {
    let tmp = copy_model("tiny-llama");
    let file = tmp.path().join("model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len - 1000)
        .unwrap();
    let msg = load_error(tmp.path());
    assert!(msg.contains("is not a valid safetensors file"), "{msg}");
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn header_that_lies_about_offsets_is_refused() {
    let tmp = copy_model("tiny-llama");
    let file = tmp.path().join("model.safetensors");
    let (mut header, data) = split(&file);
    // Point the last tensor past the end of the data.
    let last = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .max_by_key(|(_, v)| v["data_offsets"][1].as_u64().unwrap())
        .map(|(k, _)| k.clone())
        .unwrap();
    let end = header[&last]["data_offsets"][1].as_u64().unwrap();
    header[&last]["data_offsets"][1] = json!(end + 4096);
    std::fs::write(&file, join(&header, &data)).unwrap();
    let msg = load_error(tmp.path());
    assert!(msg.contains("is not a valid safetensors file"), "{msg}");

    // A header length larger than the file.
    let mut bytes = join(&header, &data);
    bytes[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let msg = load_error(tmp.path());
    assert!(msg.contains("is not a valid safetensors file"), "{msg}");
}

#[test]
fn unknown_architecture_is_named() {
    let tmp = copy_model("tiny-llama");
    let cfg_path = tmp.path().join("config.json");
    let mut cfg = common::read_json(&cfg_path);
    cfg["architectures"] = json!(["MambaForCausalLM"]);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let msg = load_error(tmp.path());
    assert!(
        msg.contains("unknown architecture \"MambaForCausalLM\""),
        "{msg}"
    );
    assert!(msg.contains("LlamaForCausalLM"), "{msg}");
}

#[test]
fn missing_shard_is_named() {
    let tmp = copy_model("tiny-qwen");
    let index = common::read_json(&tmp.path().join("model.safetensors.index.json"));
    let shard = index["weight_map"]["model.norm.weight"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::remove_file(tmp.path().join(&shard)).unwrap();
    let msg = load_error(tmp.path());
    assert!(msg.contains("names shard(s) that are not in"), "{msg}");
    assert!(msg.contains(&shard), "{msg}");
}

#[test]
fn missing_model_directory_is_named() {
    let msg = load_error(Path::new("/nonexistent/model"));
    assert!(msg.contains("/nonexistent/model/config.json"), "{msg}");
}

/// A config asking for far more layers than the checkpoint holds is refused by comparing it
/// with the tensors present, before anything is sized by it: at once, in one short line (it
/// grew to 11 GB in 20 s for 2^31 layers, and printed a 505 MB line for 2^20).
#[test]
fn a_config_with_millions_of_layers_is_refused_quickly_in_one_short_line() {
    for layers in [1u64 << 20, 1 << 31, 4] {
        let tmp = copy_model("tiny-llama");
        let cfg_path = tmp.path().join("config.json");
        let mut cfg = common::read_json(&cfg_path);
        cfg["num_hidden_layers"] = json!(layers);
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let t = std::time::Instant::now();
        let msg = load_error(tmp.path());
        assert!(t.elapsed().as_secs_f64() < 5.0, "{:?}", t.elapsed());
        assert!(msg.len() < 600, "{} characters: {}", msg.len(), &msg[..600]);
        assert!(
            msg.contains(&format!("num_hidden_layers = {layers}")),
            "{msg}"
        );
        if layers < 1 << 24 {
            assert!(
                msg.contains("the checkpoint holds 3 decoder layer(s)"),
                "{msg}"
            );
        } else {
            assert!(msg.contains("is outside [1, 16777216]"), "{msg}");
        }
    }
}

/// Many problems are listed up to a bound, then counted.
#[test]
fn a_long_list_of_problems_is_cut_and_counted() {
    let tmp = copy_model("tiny-llama");
    let file = tmp.path().join("model.safetensors");
    let (mut header, data) = split(&file);
    // Rename every tensor of layers 0 and 1 (18 of them); layer 2 keeps the count at 3.
    let names: Vec<String> = header
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("model.layers.0.") || k.starts_with("model.layers.1."))
        .cloned()
        .collect();
    assert_eq!(names.len(), 18);
    for n in &names {
        let t = header.as_object_mut().unwrap().remove(n).unwrap();
        header[format!("unused.{n}")] = t;
    }
    std::fs::write(&file, join(&header, &data)).unwrap();
    let msg = load_error(tmp.path());
    assert!(msg.contains("(18 problem(s))"), "{msg}");
    assert_eq!(msg.matches(": missing").count(), 12, "{msg}");
    assert!(msg.ends_with("and 6 more"), "{msg}");
}

/// rms_norm_eps = -1 loaded, and --max-batch 0 became 1: both are refused by name.
#[test]
fn a_negative_epsilon_and_max_batch_zero_are_refused() {
    let tmp = copy_model("tiny-llama");
    let cfg_path = tmp.path().join("config.json");
    let mut cfg = common::read_json(&cfg_path);
    cfg["rms_norm_eps"] = json!(-1);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let msg = load_error(tmp.path());
    assert!(
        msg.contains("rms_norm_eps = -1 must be a positive number"),
        "{msg}"
    );

    let mut leg = Leg::start(&model_dir("tiny-llama"), &["--max-batch", "0"]);
    let ev = leg.recv();
    assert_eq!(ev["code"], "load_failed", "{ev}");
    assert!(
        ev["message"].as_str().unwrap().contains("--max-batch 0"),
        "{ev}"
    );
    assert_eq!(leg.wait().code(), Some(1));
}

/// `engine generate` refuses a count of 0 by its flag, before loading anything, rather than
/// with the serve protocol's malformed-request text.
#[test]
fn generate_refuses_zero_tokens_or_batch_by_the_flag() {
    for flag in ["--max-tokens", "--batch"] {
        let out = std::process::Command::new(common::engine_bin())
            .args(["generate", "--prompt", "1,2", flag, "0", "--model"])
            .arg(model_dir("tiny-llama"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("invalid value '0' for '{flag}")) && !err.contains("protocol"),
            "{err}"
        );
    }
}

#[test]
fn a_hybrid_missing_a_mamba_tensor_or_asked_for_cuda_is_named() {
    let tmp = copy_model("tiny-nemotron-h");
    let file = tmp.path().join("model.safetensors");
    let (mut header, data) = split(&file);
    let t = header
        .as_object_mut()
        .unwrap()
        .remove("backbone.layers.0.mixer.A_log")
        .unwrap();
    header["unused.A_log"] = t;
    std::fs::write(&file, join(&header, &data)).unwrap();
    let m = load_error(tmp.path());
    // Named as the engine reads it (backbone.* is read as model.*).
    assert!(m.contains("model.layers.0.mixer.A_log: missing"), "{m}");
}

#[test]
fn a_hybrid_state_pool_beyond_the_hosts_memory_is_refused() {
    let mut leg = Leg::start(
        &model_dir("tiny-nemotron-h"),
        &["--max-batch", "1000000000000"],
    );
    let ev = leg.recv();
    assert_eq!(ev["type"], "error", "{ev}");
    let m = ev["message"].as_str().unwrap();
    assert!(
        m.contains("recurrent-state slots") && m.contains("give a smaller --max-batch"),
        "{m}"
    );
    assert_eq!(leg.wait().code(), Some(1));
}

#[test]
fn a_hybrid_ready_event_reports_its_state_slots() {
    let mut leg = Leg::start(&model_dir("tiny-nemotron-h"), &["--max-batch", "3"]);
    let ready = leg.recv();
    assert_eq!(ready["type"], "ready", "{ready}");
    let kv = &ready["kv"];
    assert_eq!(kv["state_slots"], 3, "{kv}");
    // 3 Mamba layers x (conv window: conv_dim x (kernel 4 - 1), SSM: inner x d_state) in f32.
    let cfg = common::read_json(&model_dir("tiny-nemotron-h").join("config.json"));
    let (heads, hd, n, g) = (
        cfg["mamba_num_heads"].as_u64().unwrap(),
        cfg["mamba_head_dim"].as_u64().unwrap(),
        cfg["ssm_state_size"].as_u64().unwrap(),
        cfg["n_groups"].as_u64().unwrap(),
    );
    let conv_dim = heads * hd + 2 * g * n;
    let per_layer = conv_dim * 3 + heads * hd * n;
    assert_eq!(kv["state_bytes"], 3 * 3 * per_layer * 4, "{kv}");
    // The pool's blocks hold the 2 attention layers only: K and V, 2 KV heads x 16, f32.
    assert_eq!(
        kv["bytes"],
        kv["num_blocks"].as_u64().unwrap() * 16 * 2 * 2 * 2 * 16 * 4
    );
    assert!(leg.shutdown().success());
}
