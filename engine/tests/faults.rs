//! The test-only fault injector (`ENGINE_FAULT`, docs/ENGINE.md) on the CPU backend: each fault
//! is reported in `ready.features.fault` and changes the logits against the clean run (verified
//! against the clean run's own tokens), `nan_past_512` only past position 511, `slow_step` only
//! the timing; a fault that does not apply, or an unknown name, is a load error; the clean leg
//! reports no fault.

mod common;

use std::path::Path;
use std::process::Command;

use common::{battery, model_dir, Leg, Verified};
use serde_json::{json, Value};

/// Starts a leg with `ENGINE_FAULT=fault` (none when empty) and returns it with `ready`.
fn leg(model: &Path, fault: &str) -> (Leg, Value) {
    let env: &[(&str, &str)] = if fault.is_empty() {
        &[]
    } else {
        &[("ENGINE_FAULT", fault)]
    };
    let mut leg = Leg::start_with_env(model, &["--max-batch", "4"], env);
    let ready = leg.recv();
    assert_eq!(ready["type"], "ready", "{fault}: {ready}");
    (leg, ready)
}

/// The unit's battery verified against its golden (the clean CPU backend's own tokens).
fn verify_golden(unit: &str, fault: &str) -> (Value, Vec<Verified>) {
    let (prompts, golden, _) = battery(unit);
    let (mut leg, ready) = leg(&model_dir(unit), fault);
    let (got, _) = leg.verify("v", &prompts, &golden, 4);
    assert!(leg.shutdown().success());
    (ready["features"].clone(), got)
}

#[test]
fn the_clean_leg_reports_no_fault() {
    let (features, got) = verify_golden("tiny-llama", "");
    assert!(features.get("fault").is_none(), "{features}");
    assert!(got.iter().all(|v| v.gap.iter().all(|g| *g == Some(0.0))));
}

#[test]
fn each_fault_changes_the_logits_against_the_clean_run() {
    for &(fault, unit) in common::LOGIT_FAULTS
        .iter()
        .chain(common::HYBRID_LOGIT_FAULTS)
    {
        let (_, clean) = verify_golden(unit, "");
        let (features, planted) = verify_golden(unit, fault);
        assert_eq!(features["fault"], json!([fault]), "{features}");
        assert_eq!(
            features["degraded"],
            json!([]),
            "a fault is not a degraded feature"
        );
        let (mut positions, mut changed, mut refused) = (0, 0, 0);
        for (c, p) in clean.iter().zip(&planted) {
            for j in 0..c.scale.len() {
                positions += 1;
                changed += usize::from(c.scale[j] != p.scale[j]);
                refused += usize::from(p.gap[j] != Some(0.0));
            }
        }
        eprintln!("{fault} on {unit}: logits changed at {changed}/{positions} positions, the golden not chosen at {refused}");
        if fault == "rope_shift" {
            // Only decode steps rotate one ahead: every prefill position (0) is clean.
            for (c, p) in clean.iter().zip(&planted) {
                assert_eq!((c.scale[0], p.gap[0]), (p.scale[0], Some(0.0)), "{fault}");
            }
            assert!(
                changed * 10 >= (positions - clean.len()) * 9,
                "{fault}: {changed}"
            );
        } else {
            assert!(
                changed * 10 >= positions * 9,
                "{fault}: {changed}/{positions}"
            );
        }
        assert!(
            refused > 0,
            "{fault}: the golden is still chosen everywhere"
        );
    }
}

#[test]
fn nan_past_512_poisons_only_positions_past_511() {
    // tiny-llama with room for contexts past 512.
    let tmp = common::model_with_config("tiny-llama", |c| {
        c["max_position_embeddings"] = json!(1024);
    });
    let long: Vec<i64> = (0..500).map(|i| (i * 7 + 3) % 512).collect();
    let (short, _, _) = battery("tiny-llama");
    let prompts = vec![long, short[5].clone()];

    let (mut clean, _) = leg(tmp.path(), "");
    let (results, _) = clean.generate("g", &prompts, 30, 1);
    let forced: Vec<Vec<u32>> = results
        .iter()
        .map(|r| serde_json::from_value(r["tokens"].clone()).unwrap())
        .collect();
    let (want, _) = clean.verify("c", &prompts, &forced, 2);
    assert!(clean.shutdown().success());

    let (mut planted, ready) = leg(tmp.path(), "nan_past_512");
    assert_eq!(ready["features"]["fault"], json!(["nan_past_512"]));
    let (got, _) = planted.verify("p", &prompts, &forced, 2);
    assert!(planted.shutdown().success());
    // Position j of the 500-token prompt comes from the row at 499 + j: clean up to j = 12.
    for j in 0..30 {
        if 499 + j < 512 {
            assert_eq!(got[0].gap[j], Some(0.0), "position {j}");
            assert_eq!(got[0].scale[j], want[0].scale[j], "position {j}");
        } else {
            assert_eq!(
                (got[0].gap[j], got[0].scale[j]),
                (None, None),
                "position {j}: NaN is null"
            );
        }
    }
    // A context under 512 is the clean run's.
    assert_eq!(got[1], want[1]);
}

#[test]
fn slow_step_changes_the_timing_only() {
    let (prompts, golden, max_tokens) = battery("tiny-llama");
    let (mut leg, ready) = leg(&model_dir("tiny-llama"), "slow_step");
    assert_eq!(ready["features"]["fault"], json!(["slow_step"]));
    let (results, _) = leg.generate("g", &prompts, max_tokens, 2);
    for (r, want) in results.iter().zip(&golden) {
        let got: Vec<u32> = serde_json::from_value(r["tokens"].clone()).unwrap();
        assert_eq!(&got, want);
    }
    assert!(leg.shutdown().success());
}

#[test]
fn several_faults_at_once_are_listed() {
    let (features, _) = verify_golden("tiny-llama", "slow_step, rope_shift");
    assert_eq!(features["fault"], json!(["rope_shift", "slow_step"]));
}

/// The fatal error `engine serve` sends for `ENGINE_FAULT=fault` on `unit`.
fn serve_load_error(unit: &str, fault: &str) -> String {
    let mut leg = Leg::start_with_env(&model_dir(unit), &[], &[("ENGINE_FAULT", fault)]);
    let ev = leg.recv();
    assert_eq!(ev["type"], "error", "{ev}");
    assert_eq!(
        (&ev["code"], &ev["fatal"]),
        (&json!("load_failed"), &json!(true))
    );
    assert_eq!(leg.wait().code(), Some(1));
    ev["message"].as_str().unwrap().to_string()
}

#[test]
fn unknown_or_inapplicable_faults_are_load_errors() {
    let m = serve_load_error("tiny-llama", "rope_shift,nan_past512");
    assert!(
        m.contains("ENGINE_FAULT=\"nan_past512\" is not a fault"),
        "{m}"
    );
    for name in [
        "rope_shift",
        "norm_skip",
        "attn_scale_d",
        "kv_group",
        "drop_bias",
        "nan_past_512",
        "slow_step",
    ] {
        assert!(m.contains(name), "{m} lacks {name}");
    }
    let m = serve_load_error("tiny-llama", "drop_bias");
    assert!(
        m.contains("ENGINE_FAULT=drop_bias does not apply to this model"),
        "{m}"
    );
    assert!(m.contains("no q/k/v biases"), "{m}");
    // The hybrid has no RoPE to shift and no biases to drop.
    let m = serve_load_error("tiny-nemotron-h", "rope_shift");
    assert!(
        m.contains("rope_shift does not apply") && m.contains("has no RoPE"),
        "{m}"
    );
    let m = serve_load_error("tiny-nemotron-h", "drop_bias");
    assert!(m.contains("no q/k/v biases"), "{m}");
    // `engine generate` and `engine bench` read it too.
    for args in [
        &["generate", "--prompt", "1,2", "--max-tokens", "2"][..],
        &["bench", "--repeat", "1"][..],
    ] {
        let out = Command::new(common::engine_bin())
            .args(args)
            .arg("--model")
            .arg(model_dir("tiny-llama"))
            .env("ENGINE_FAULT", "bogus")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("ENGINE_FAULT=\"bogus\" is not a fault"),
            "{args:?}: {err}"
        );
    }
}

/// tiny-qwen's checkpoint (sharded) with every q/k/v bias set to zero and layer num_layers/2's
/// input norm to ones, as a random-weight checkpoint made like transformers' initialisation has them.
fn tiny_qwen_initialised_like_transformers() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let src = model_dir("tiny-qwen");
    let layers = common::read_json(&src.join("config.json"))["num_hidden_layers"]
        .as_u64()
        .unwrap();
    let ones_norm = format!("model.layers.{}.input_layernorm.weight", layers / 2);
    for entry in std::fs::read_dir(&src).unwrap() {
        let from = entry.unwrap().path();
        let to = tmp.path().join(from.file_name().unwrap());
        if from.extension().is_none_or(|e| e != "safetensors") {
            std::fs::copy(&from, &to).unwrap();
            continue;
        }
        let bytes = std::fs::read(&from).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut data = Vec::new();
        for (name, view) in st.tensors() {
            let mut raw = view.data().to_vec();
            if name.ends_with("_proj.bias") {
                raw.fill(0);
            } else if name == ones_norm {
                raw = match view.dtype() {
                    safetensors::Dtype::F32 => 1.0f32.to_le_bytes().repeat(raw.len() / 4),
                    safetensors::Dtype::BF16 => half::bf16::ONE.to_le_bytes().repeat(raw.len() / 2),
                    other => panic!("{name}: {other:?}"),
                };
            }
            data.push((name, view.dtype(), view.shape().to_vec(), raw));
        }
        let views = data.iter().map(|(n, dtype, shape, raw)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), raw);
            (n.clone(), view.unwrap())
        });
        std::fs::write(&to, safetensors::serialize(views, None).unwrap()).unwrap();
    }
    tmp
}

#[test]
fn weight_faults_that_would_change_nothing_are_refused() {
    let dir = tiny_qwen_initialised_like_transformers();
    for (fault, why) in [
        (
            "norm_skip",
            "is all ones, so taking it as ones changes nothing",
        ),
        ("drop_bias", "every q/k/v bias of the checkpoint is zero"),
    ] {
        let mut leg = Leg::start_with_env(dir.path(), &[], &[("ENGINE_FAULT", fault)]);
        let ev = leg.recv();
        assert_eq!(ev["code"], "load_failed", "{fault}: {ev}");
        let m = ev["message"].as_str().unwrap();
        assert!(
            m.contains(&format!("ENGINE_FAULT={fault} does not apply")) && m.contains(why),
            "{m}"
        );
        assert_eq!(leg.wait().code(), Some(1));
    }
    // The same checkpoint takes the other faults, and the clean build loads.
    let (leg, ready) = leg(dir.path(), "rope_shift");
    assert_eq!(ready["features"]["fault"], json!(["rope_shift"]));
    leg.shutdown();
}
