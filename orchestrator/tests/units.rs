//! Every committed unit parses (unknown keys are errors), its prompts load, every prompt id is
//! inside the model's vocabulary, and the longest prompt plus max_tokens fits the oracle's
//! max_model_len. A unit whose checkpoint is not committed (the random-weight real-config units
//! the GPU runbook makes) must be named after a scripts/make-checkpoint.py model: its config is
//! that script's (`--config-only`), and its prompts must avoid the special ids too.

use orchestrator::unit::{load_prompts, Unit};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn units() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("goldens"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("unit.toml"))
        .filter(|p| p.exists())
        .collect();
    v.sort();
    assert!(v.len() >= 7, "expected the committed units, found {v:?}");
    v
}

/// The model's config.json: the committed one, else make-checkpoint.py's for the unit's name.
fn config(unit: &Unit) -> (Value, bool) {
    let committed = unit.model_dir().join("config.json");
    if committed.exists() {
        let text = std::fs::read_to_string(&committed).unwrap();
        return (serde_json::from_str(&text).unwrap(), true);
    }
    let out = Command::new("python3")
        .current_dir(root())
        .args(["scripts/make-checkpoint.py", "--model", &unit.config.name])
        .arg("--config-only")
        .output()
        .expect("python3 runs scripts/make-checkpoint.py");
    assert!(
        out.status.success(),
        "{}: no committed model/config.json and make-checkpoint.py does not know {:?}: {}",
        unit.path.display(),
        unit.config.name,
        String::from_utf8_lossy(&out.stderr)
    );
    (serde_json::from_slice(&out.stdout).unwrap(), false)
}

fn ids(v: &Value) -> Vec<u64> {
    match v {
        Value::Number(n) => n.as_u64().into_iter().collect(),
        Value::Array(a) => a.iter().filter_map(Value::as_u64).collect(),
        _ => vec![],
    }
}

#[test]
fn every_unit_parses_and_its_prompts_fit_the_model() {
    for path in units() {
        let unit = Unit::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let name = path
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy();
        assert_eq!(
            unit.config.name,
            name,
            "{}: name is not its directory",
            path.display()
        );
        let prompts = load_prompts(&unit.prompts_path()).unwrap_or_else(|e| panic!("{e}"));
        let (cfg, committed) = config(&unit);
        let vocab = cfg["vocab_size"].as_u64().expect("vocab_size");
        let (mut lo, mut hi) = (0, vocab);
        if !committed {
            // Random ordinary ids, clear of every special (bos, eos, pad) id: below them where
            // they sit at the top of the vocabulary, above them where they sit at the bottom
            // (Nemotron-H: pad 0, bos 1, eos 2), as scripts/make-prompts.py draws them.
            let specials: Vec<u64> = ["bos_token_id", "eos_token_id", "pad_token_id"]
                .iter()
                .flat_map(|k| ids(&cfg[*k]))
                .collect();
            match specials.iter().max() {
                Some(&top) if top < vocab / 2 => lo = top + 1,
                _ => {
                    hi = specials
                        .iter()
                        .copied()
                        .filter(|&i| i > 0)
                        .fold(vocab, u64::min)
                }
            }
        }
        for p in &prompts {
            if let Some(t) = p
                .tokens
                .iter()
                .find(|&&t| u64::from(t) < lo || u64::from(t) >= hi)
            {
                panic!(
                    "{}: prompt {} holds id {t}, outside {lo}..{hi} (vocab_size {vocab})",
                    path.display(),
                    p.id
                );
            }
        }
        let longest = prompts.iter().map(|p| p.tokens.len()).max().unwrap() as i64;
        if let Some(len) = unit
            .config
            .oracle
            .options
            .get("max_model_len")
            .and_then(|v| v.as_integer())
        {
            let need = longest + i64::from(unit.config.battery.max_tokens);
            assert!(
                need <= len,
                "{}: the longest prompt ({longest}) plus max_tokens needs {need} > max_model_len {len}",
                path.display()
            );
        }
        if !committed {
            // The runbook makes it; git must not pick it up.
            let ignored = Command::new("git")
                .current_dir(root())
                .args(["check-ignore", "-q"])
                .arg(unit.model_dir().join("config.json"))
                .status()
                .map(|s| s.success());
            if let Ok(ignored) = ignored {
                assert!(ignored, "{}: model/ is not in .gitignore", path.display());
            }
        }
    }
}

/// A [[golden]] `wrong` entry must name a prompt of the battery.
#[test]
fn a_golden_wrong_at_a_prompt_the_battery_lacks_is_refused() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/tiny-trained-h");
    let d = tempfile::tempdir().unwrap();
    for f in ["prompts.json", "golden.json", "golden-cuda-bf16.json"] {
        std::fs::copy(src.join(f), d.path().join(f)).unwrap();
    }
    std::os::unix::fs::symlink(src.join("model"), d.path().join("model")).unwrap();
    let toml = std::fs::read_to_string(src.join("unit.toml")).unwrap();
    let check = |toml: &str| {
        std::fs::write(d.path().join("unit.toml"), toml).unwrap();
        let (rep, _) = orchestrator::unit::preflight::preflight_legs(
            &d.path().join("unit.toml"),
            None,
            false,
            orchestrator::unit::LegChoice::Engine,
        );
        rep.failures
            .iter()
            .map(|f| f.message.clone())
            .filter(|m| m.contains("wrong"))
            .collect::<Vec<_>>()
    };
    assert!(
        check(&toml).is_empty(),
        "the committed unit names p0, which exists"
    );
    let bad = check(&toml.replace("prompt = \"p0\"", "prompt = \"p9\""));
    assert!(
        bad.len() == 1
            && bad[0].contains("golden-cuda-bf16.json: [[golden]] wrong names prompt \"p9\""),
        "{bad:?}"
    );
}
