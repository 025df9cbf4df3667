//! `engine serve` as the orchestrator sees it: the ready event, result/done, request errors that
//! leave the leg serving, EOS handling, and shutdown.

mod common;

use common::{battery, model_dir, Leg};
use serde_json::json;

#[test]
fn ready_describes_the_leg() {
    let mut leg = Leg::start(
        &model_dir("tiny-llama"),
        &[
            "--block-size",
            "8",
            "--num-blocks",
            "40",
            "--max-batch",
            "3",
        ],
    );
    let r = leg.recv();
    assert_eq!(r["type"], "ready");
    assert!(r["load_s"].as_f64().unwrap() > 0.0);
    assert_eq!(r["kv"]["block_size"], 8);
    assert_eq!(r["kv"]["num_blocks"], 40);
    assert_eq!(r["kv"]["capacity_tokens"], 320);
    // 3 layers x K,V x 2 KV heads x 16 dims x 4 bytes x 320 tokens.
    assert_eq!(r["kv"]["bytes"], 3 * 2 * 2 * 16 * 4 * 320);
    assert_eq!(r["features"]["backend"], "cpu");
    assert_eq!(r["features"]["degraded"], json!([]));
    // The CPU reference compiles and times nothing, so no load of it is warmer than another.
    assert_eq!(r["features"]["load_cache"]["state"], "none");
    assert_eq!(r["resolved"]["architecture"], "LlamaForCausalLM");
    assert_eq!(r["resolved"]["max_batch"], 3);
    assert!(r["versions"]["engine"].is_string());
    let pid = r["pid"].as_u64().unwrap();
    assert_eq!(r["pids"], json!([pid]));
    assert!(leg.shutdown().success());
}

#[test]
fn timings_follow_the_protocol() {
    let (prompts, _, _) = battery("tiny-llama");
    let mut leg = Leg::start(&model_dir("tiny-llama"), &[]);
    leg.recv();
    let (results, done) = leg.generate("t", &prompts, 8, 1);
    let mut sum = 0.0;
    for r in &results {
        let (e, t) = (
            r["elapsed_s"].as_f64().unwrap(),
            r["ttft_s"].as_f64().unwrap(),
        );
        assert!(t > 0.0 && t <= e, "ttft {t} elapsed {e}");
        sum += e;
    }
    // At batch 1 each prompt's clock starts at its own prefill, so they add up to about the wall.
    let wall = done["wall_s"].as_f64().unwrap();
    assert!(sum <= wall, "sum of elapsed {sum} > wall {wall}");
    let (results, done) = leg.generate("n", &prompts, 8, 4);
    let wall = done["wall_s"].as_f64().unwrap();
    // At batch N every clock starts at the request, so the longest is the wall.
    let longest = results
        .iter()
        .map(|r| r["elapsed_s"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(
        longest <= wall && longest > 0.5 * wall,
        "longest {longest} wall {wall}"
    );
    assert!(leg.shutdown().success());
}

#[test]
fn request_errors_are_named_and_the_leg_keeps_serving() {
    let mut leg = Leg::start(
        &model_dir("tiny-llama"),
        &["--num-blocks", "4", "--max-batch", "2"],
    );
    leg.recv();
    let cases = [
        ("this is not json", "malformed_request", "not JSON"),
        (r#"{"type":"dance","id":"d"}"#, "malformed_request", "unknown request type"),
        (
            r#"{"type":"generate","id":"m","prompts":[[1]],"ignore_eos":true,"batch":1}"#,
            "malformed_request",
            "missing field `max_tokens`",
        ),
        (
            r#"{"type":"generate","id":"v","prompts":[[1,2],[3,512]],"max_tokens":2,"ignore_eos":true,"batch":1}"#,
            "bad_token",
            "prompt 1, position 1: token id 512 is outside the vocabulary [0, 512)",
        ),
        (
            r#"{"type":"generate","id":"n","prompts":[[-3]],"max_tokens":2,"ignore_eos":true,"batch":1}"#,
            "bad_token",
            "token id -3",
        ),
        (
            r#"{"type":"generate","id":"e","prompts":[[1],[]],"max_tokens":2,"ignore_eos":true,"batch":1}"#,
            "empty_prompt",
            "prompt 1 has no tokens",
        ),
        (
            r#"{"type":"generate","id":"l","prompts":[[1]],"max_tokens":512,"ignore_eos":true,"batch":1}"#,
            "too_long",
            "exceeds the model's maximum context of 512 tokens",
        ),
        (
            // 60 prompt tokens + 10 new need 69 positions = 5 blocks of 16; the pool has 4.
            &json!({"type":"generate","id":"c","prompts":[vec![5; 60]],"max_tokens":10,
                    "ignore_eos":true,"batch":1}).to_string(),
            "over_capacity",
            "needs 69 tokens of KV cache (5 blocks of 16) but the whole pool holds 4 blocks (64 tokens)",
        ),
        (
            r#"{"type":"generate","id":"b","prompts":[[1]],"max_tokens":2,"ignore_eos":true,"batch":3}"#,
            "over_capacity",
            "batch 3 exceeds this engine's --max-batch 2",
        ),
    ];
    for (line, code, text) in cases {
        leg.send_line(line);
        let ev = leg.recv();
        assert_eq!(ev["type"], "error", "{line} -> {ev}");
        assert_eq!(ev["code"], code, "{line} -> {ev}");
        assert_eq!(ev["fatal"], false);
        let msg = ev["message"].as_str().unwrap();
        assert!(msg.contains(text), "{line}:\n{msg}\nlacks {text:?}");
    }
    // Still serving: a valid request is answered, and 4 blocks are enough when prompts take
    // turns (batch 2 of two 30-token sequences needs 2 x 3 blocks, so they run one by one).
    let (results, done) = leg.generate("ok", &[vec![5; 30], vec![6; 30]], 3, 2);
    assert_eq!(results.len(), 2);
    assert_eq!(done["tokens"], 6);
    assert!(leg.shutdown().success());
}

#[test]
fn eos_stops_generation_unless_ignored() {
    // Make the golden's 4th token of prompt p1 an EOS id; without ignore_eos generation must
    // stop at its first occurrence, including it.
    let (prompts, golden, _) = battery("tiny-llama");
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(model_dir("tiny-llama").join(f), tmp.path().join(f)).unwrap();
    }
    let eos = golden[1][3];
    let stop = golden[1].iter().position(|&t| t == eos).unwrap();
    let cfg_path = tmp.path().join("config.json");
    let mut cfg = common::read_json(&cfg_path);
    cfg["eos_token_id"] = json!(eos);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();

    let mut leg = Leg::start(tmp.path(), &[]);
    leg.recv();
    for (ignore_eos, want) in [(false, &golden[1][..=stop]), (true, &golden[1][..])] {
        leg.send(&json!({"type":"generate","id":"x","prompts":[prompts[1]],
            "max_tokens": golden[1].len(),"ignore_eos":ignore_eos,"batch":1}));
        let r = leg.recv();
        assert_eq!(r["type"], "result", "{r}");
        let got: Vec<u32> = serde_json::from_value(r["tokens"].clone()).unwrap();
        assert_eq!(got, want, "ignore_eos={ignore_eos}");
        assert_eq!(leg.recv()["type"], "done");
    }
    assert!(leg.shutdown().success());
}

#[test]
fn end_of_input_is_a_clean_exit() {
    let mut leg = Leg::start(&model_dir("tiny-qwen"), &[]);
    assert_eq!(leg.recv()["type"], "ready");
    assert!(leg.wait().success());
}
