//! The CPU backend reproduces every tiny unit's golden (transformers, f32, greedy) exactly:
//! through `engine generate`, and through `engine serve` at batch 1 and at batch N.

mod common;

use std::process::Command;

use common::{battery, model_dir, unit_dir, Leg, UNITS};

fn assert_matches(unit: &str, how: &str, got: &[Vec<u32>], golden: &[Vec<u32>]) {
    for (i, (g, want)) in got.iter().zip(golden).enumerate() {
        if g != want {
            let at = g.iter().zip(want).position(|(a, b)| a != b);
            panic!("{unit} {how}: prompt {i} differs from the golden at position {at:?}:\n ours   {g:?}\n golden {want:?}");
        }
    }
    assert_eq!(got.len(), golden.len());
}

#[test]
fn generate_command_reproduces_goldens() {
    for unit in UNITS {
        let (_, golden, max_tokens) = battery(unit);
        let out = Command::new(common::engine_bin())
            .arg("generate")
            .arg("--model")
            .arg(model_dir(unit))
            .arg("--prompts")
            .arg(unit_dir(unit).join("prompts.json"))
            .args(["--max-tokens", &max_tokens.to_string(), "--ignore-eos"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<Vec<u32>> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let (_, ids) = l.split_once(": ").expect("`id: tokens` lines");
                ids.split(',').map(|t| t.parse().unwrap()).collect()
            })
            .collect();
        assert_matches(unit, "engine generate", &got, &golden);
    }
}

#[test]
fn serve_reproduces_goldens_at_batch_1_and_n() {
    for unit in UNITS {
        let (prompts, golden, max_tokens) = battery(unit);
        let mut leg = Leg::start(&model_dir(unit), &["--max-batch", "4"]);
        let ready = leg.recv();
        assert_eq!(ready["type"], "ready", "{ready}");
        for batch in [1, 4] {
            let (results, done) = leg.generate(&format!("b{batch}"), &prompts, max_tokens, batch);
            let got: Vec<Vec<u32>> = results
                .iter()
                .map(|r| serde_json::from_value(r["tokens"].clone()).unwrap())
                .collect();
            assert_matches(unit, &format!("serve batch {batch}"), &got, &golden);
            assert_eq!(done["tokens"], prompts.len() * max_tokens);
        }
        assert!(leg.shutdown().success());
    }
}
