//! What preflight reads from the model's config.json to check the data files against it: the
//! vocabulary every prompt and golden token must lie in, and the EOS ids a golden output
//! shorter than max_tokens must end at.

use serde_json::Value;
use std::path::Path;

use crate::unit::{Golden, Prompt};

/// What preflight reads from the model's config.json to check the data files against it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFacts {
    pub vocab_size: u64,
    /// `eos_token_id` (an int or a list); empty where config.json gives none.
    pub eos: Vec<u64>,
}

impl ModelFacts {
    /// None where config.json is unreadable or has no `vocab_size` (the model check says why).
    pub fn read(model_dir: &Path) -> Option<ModelFacts> {
        let text = std::fs::read_to_string(model_dir.join("config.json")).ok()?;
        let cfg: Value = serde_json::from_str(&text).ok()?;
        let vocab_size = cfg.get("vocab_size")?.as_u64()?;
        let eos = match cfg.get("eos_token_id") {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).collect(),
            Some(v) => v.as_u64().into_iter().collect(),
            None => vec![],
        };
        Some(ModelFacts { vocab_size, eos })
    }

    /// Every prompt token is in the vocabulary (else both legs fail with `bad_token`).
    pub fn check_prompts(&self, prompts: &[Prompt]) -> Result<String, String> {
        let v = self.vocab_size;
        let bad: Vec<(&str, usize, u32)> = prompts
            .iter()
            .flat_map(|p| {
                p.tokens
                    .iter()
                    .enumerate()
                    .filter(|(_, &t)| u64::from(t) >= v)
                    .map(|(i, &t)| (p.id.as_str(), i, t))
            })
            .collect();
        match bad.first() {
            None => Ok(format!("every prompt token is below vocab_size {v}")),
            Some((id, i, t)) => Err(format!(
                "{} prompt token(s) are outside the model's vocabulary [0, {v}) (config.json vocab_size), the first prompt {id:?} position {i}: {t}; both legs would refuse them (bad_token): the prompts were tokenized for another model",
                bad.len()
            )),
        }
    }

    /// The golden's tokens are in the vocabulary, and an output shorter than `max_tokens` (only
    /// allowed without ignore_eos, load_golden checks) ends at one of config.json's EOS ids.
    pub fn check_golden(&self, g: &Golden, max_tokens: u32) -> Result<(), String> {
        for o in &g.outputs {
            if let Some(t) = o.tokens.iter().find(|&&t| u64::from(t) >= self.vocab_size) {
                return Err(format!(
                    "the output for prompt {:?} holds token {t}, outside the model's vocabulary [0, {}): the golden is not of this model",
                    o.id, self.vocab_size
                ));
            }
            let short = o.tokens.len() < max_tokens as usize;
            let at_eos = o
                .tokens
                .last()
                .is_some_and(|&t| self.eos.contains(&u64::from(t)));
            if short && !g.ignore_eos && !self.eos.is_empty() && !at_eos {
                return Err(format!(
                    "the output for prompt {:?} holds {} token(s), fewer than max_tokens = {max_tokens}, and does not end at an EOS id {:?} of config.json: it was cut; recapture the golden",
                    o.id,
                    o.tokens.len(),
                    self.eos
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden(ignore_eos: bool, outputs: &[(&str, &[u32])]) -> Golden {
        serde_json::from_value(serde_json::json!({"schema": 1, "max_tokens": 4,
            "ignore_eos": ignore_eos, "capture": {},
            "outputs": outputs.iter().map(|(id, t)| serde_json::json!({"id": id, "tokens": t}))
                .collect::<Vec<_>>()}))
        .unwrap()
    }

    /// Token ids >= vocab passed preflight, then both legs failed with bad_token (exit 2); a
    /// golden cut short without ignore_eos blamed correct legs.
    #[test]
    fn data_files_are_checked_against_config_json() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("config.json"),
            r#"{"vocab_size": 512, "eos_token_id": [2, 7]}"#,
        )
        .unwrap();
        let f = ModelFacts::read(d.path()).unwrap();
        assert_eq!(
            f,
            ModelFacts {
                vocab_size: 512,
                eos: vec![2, 7]
            }
        );
        let p = |id: &str, t: &[u32]| Prompt {
            id: id.into(),
            tokens: t.to_vec(),
        };
        assert!(f.check_prompts(&[p("a", &[1, 511])]).is_ok());
        let e = f
            .check_prompts(&[p("a", &[1]), p("b", &[3, 512, 9000])])
            .unwrap_err();
        assert!(
            e.starts_with("2 prompt token(s) are outside the model's vocabulary [0, 512)"),
            "{e}"
        );
        assert!(e.contains("prompt \"b\" position 1: 512"), "{e}");

        assert!(f
            .check_golden(&golden(true, &[("a", &[1, 2, 3, 4])]), 4)
            .is_ok());
        let e = f
            .check_golden(&golden(true, &[("a", &[1, 600, 3, 4])]), 4)
            .unwrap_err();
        assert!(
            e.contains("holds token 600, outside the model's vocabulary [0, 512)"),
            "{e}"
        );
        // Without ignore_eos a short output is fine where it stopped at an EOS id, not elsewhere.
        assert!(f.check_golden(&golden(false, &[("a", &[1, 7])]), 4).is_ok());
        let e = f
            .check_golden(&golden(false, &[("a", &[1, 8])]), 4)
            .unwrap_err();
        assert!(e.contains("does not end at an EOS id [2, 7]"), "{e}");
    }
}
