//! The `verify` request (teacher forcing) through `engine serve` on the CPU backend: forced with
//! its own greedy tokens the leg agrees everywhere with no gap, at batch 1 and batch N; forced
//! with other tokens it reports gaps; EOS never stops a forced row; malformed verify requests are
//! named and leave the leg serving.

mod common;

use common::{battery, model_dir, Leg, UNITS};
use serde_json::json;

#[test]
fn own_tokens_verify_with_no_gap_at_batch_1_and_n() {
    for unit in UNITS {
        let (prompts, golden, _) = battery(unit);
        let mut leg = Leg::start(&model_dir(unit), &["--max-batch", "4"]);
        assert_eq!(leg.recv()["type"], "ready");
        // The CPU backend reproduces the golden (golden.rs), so the golden is its own output.
        for batch in [1, 4] {
            let (got, _) = leg.verify(&format!("v{batch}"), &prompts, &golden, batch);
            for (i, (v, want)) in got.iter().zip(&golden).enumerate() {
                assert_eq!(&v.argmax, want, "{unit} batch {batch} prompt {i}");
                assert!(
                    v.gap.iter().all(|g| *g == Some(0.0)),
                    "{unit} batch {batch} prompt {i}: {:?}",
                    v.gap
                );
                assert!(v.scale.iter().all(|s| s.unwrap() > 0.0));
            }
        }
        assert!(leg.shutdown().success());
    }
}

#[test]
fn other_tokens_show_gaps_and_eos_does_not_stop_a_forced_row() {
    let (prompts, golden, _) = battery("tiny-llama");
    let mut leg = Leg::start(&model_dir("tiny-llama"), &[]);
    leg.recv();
    // Each golden shifted by one id, with the EOS ids (2 and 7) in the middle.
    let forced: Vec<Vec<u32>> = golden
        .iter()
        .map(|g| {
            let mut f: Vec<u32> = g.iter().map(|&t| (t + 1) % 512).collect();
            f[3] = 2;
            f[4] = 7;
            f
        })
        .collect();
    let (got, _) = leg.verify("o", &prompts, &forced, 2);
    let (g, _) = leg.verify("g", &prompts, &golden, 2);
    for (i, v) in got.iter().enumerate() {
        // Position 0 comes from the prefill, before any forced token: the same choice.
        assert_eq!(v.argmax[0], golden[i][0]);
        // The shifted token there is not the choice: a positive gap, from the same logits.
        assert!(v.gap[0].unwrap() > 0.0, "prompt {i}: {:?}", v.gap[0]);
        assert_eq!(
            v.scale[0], g[i].scale[0],
            "prompt {i}: the prefill's logits are the same"
        );
        for (j, (&a, gap)) in v.argmax.iter().zip(&v.gap).enumerate() {
            let gap = gap.unwrap();
            assert!(gap >= 0.0);
            assert_eq!(
                gap == 0.0,
                a == forced[i][j],
                "prompt {i} position {j}: gap {gap}"
            );
        }
    }
    assert!(leg.shutdown().success());
}

#[test]
fn malformed_verify_requests_are_named_and_the_leg_keeps_serving() {
    let mut leg = Leg::start(
        &model_dir("tiny-llama"),
        &["--num-blocks", "4", "--max-batch", "2"],
    );
    leg.recv();
    let v = |prompts: serde_json::Value, forced: serde_json::Value, batch: usize| {
        json!({"type":"verify","id":"x","prompts":prompts,"forced":forced,"batch":batch})
            .to_string()
    };
    let cases = [
        (
            r#"{"type":"verify","id":"x","prompts":[[1]],"batch":1}"#.to_string(),
            "malformed_request",
            "verify: missing field `forced`",
        ),
        (
            v(json!([[1]]), json!([[1], [2]]), 1),
            "malformed_request",
            "forced has 2 lists for 1 prompts",
        ),
        (
            v(json!([[1], [2]]), json!([[1], []]), 1),
            "malformed_request",
            "forced[1] is empty",
        ),
        (
            v(json!([[1]]), json!([[3, -1]]), 1),
            "bad_token",
            "forced tokens of prompt 0, position 1: token id -1",
        ),
        (
            v(json!([[1]]), json!([[600]]), 1),
            "bad_token",
            "token id 600 is outside the vocabulary [0, 512)",
        ),
        (
            v(json!([[600]]), json!([[1]]), 1),
            "bad_token",
            "prompt 0, position 0: token id 600",
        ),
        (
            v(json!([[]]), json!([[1]]), 1),
            "empty_prompt",
            "prompt 0 has no tokens",
        ),
        (
            v(json!([[1, 2]]), json!([vec![5; 511]]), 1),
            "too_long",
            "2 prompt tokens + 511 forced tokens = 513 exceeds the model's maximum context of 512",
        ),
        (
            v(json!([vec![5; 60]]), json!([vec![5; 10]]), 1),
            "over_capacity",
            "needs 69 tokens of KV cache (5 blocks of 16)",
        ),
        (
            v(json!([[1]]), json!([[1]]), 3),
            "over_capacity",
            "batch 3 exceeds this engine's --max-batch 2",
        ),
        (
            v(json!([[1]]), json!([[1]]), 0),
            "malformed_request",
            "batch must be at least 1",
        ),
    ];
    for (line, code, text) in cases {
        leg.send_line(&line);
        let ev = leg.recv();
        assert_eq!(ev["type"], "error", "{line} -> {ev}");
        assert_eq!(ev["code"], code, "{line} -> {ev}");
        assert_eq!(ev["id"], "x", "{line} -> {ev}");
        assert_eq!(ev["fatal"], false);
        let msg = ev["message"].as_str().unwrap();
        assert!(msg.contains(text), "{line}:\n{msg}\nlacks {text:?}");
    }
    let (got, done) = leg.verify(
        "ok",
        &[vec![5; 30], vec![6; 30]],
        &[vec![1, 2, 3], vec![4]],
        2,
    );
    assert_eq!(got.len(), 2);
    assert_eq!(done["tokens"], 4);
    assert!(leg.shutdown().success());
}
