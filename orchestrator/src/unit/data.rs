//! The unit's data files: the prompts (token ids) and the goldens, checked by their `schema`
//! number and the fields read here.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

use super::{err, Battery, UnitError};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prompt {
    pub id: String,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PromptsFile {
    pub schema: u32,
    pub prompts: Vec<Prompt>,
}

pub fn load_prompts(path: &Path) -> Result<Vec<Prompt>, UnitError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        err(
            path,
            format!("cannot read the prompts file ({e}); battery.prompts names it, relative to the unit's directory"),
        )
    })?;
    let f: PromptsFile = serde_json::from_str(&text).map_err(|e| {
        err(
            path,
            format!("not a prompts file ({e}); expected {{\"schema\": 1, \"prompts\": [{{\"id\": \"p0\", \"tokens\": [1, 2]}}]}}"),
        )
    })?;
    if f.schema != 1 {
        return Err(err(
            path,
            format!(
                "schema {} is not supported (this orchestrator reads schema 1)",
                f.schema
            ),
        ));
    }
    if f.prompts.is_empty() {
        return Err(err(path, "no prompts: the battery would measure nothing"));
    }
    for p in &f.prompts {
        if p.tokens.is_empty() {
            return Err(err(path, format!("prompt {:?} has no tokens", p.id)));
        }
    }
    let mut ids: Vec<&str> = f.prompts.iter().map(|p| p.id.as_str()).collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(err(path, format!("prompt id {:?} appears twice", w[0])));
    }
    Ok(f.prompts)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GoldenCapture {
    #[serde(default)]
    pub backend: Option<String>,
    #[serde(default)]
    pub versions: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub resolved: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GoldenOutput {
    pub id: String,
    pub tokens: Vec<u32>,
    /// Top-2 gap per position where known; `null` entries (or no list) where not.
    #[serde(default)]
    pub margins: Option<Vec<Option<f64>>>,
    /// The best token other than the one taken, per position, where known (goldens captured
    /// before it was recorded have none).
    #[serde(default)]
    pub runner_up: Option<Vec<Option<u32>>>,
    /// The largest |logit| per position, where the golden records it (none of today's goldens
    /// do): the token gate's last resort for a position's scale (docs/GATES.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scales: Option<Vec<Option<f64>>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Golden {
    pub schema: u32,
    pub max_tokens: u32,
    #[serde(default = "super::config::default_true")]
    pub ignore_eos: bool,
    pub capture: GoldenCapture,
    pub outputs: Vec<GoldenOutput>,
}

impl Golden {
    pub fn output(&self, id: &str) -> Option<&GoldenOutput> {
        self.outputs.iter().find(|o| o.id == id)
    }
}

/// Loads a golden and checks it covers the battery: every prompt, enough tokens, same EOS rule.
pub fn load_golden(
    path: &Path,
    battery: &Battery,
    prompts: &[Prompt],
) -> Result<Golden, UnitError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        err(
            path,
            format!("cannot read the golden ({e}); [[golden]].file names it, relative to the unit's directory"),
        )
    })?;
    let g: Golden = serde_json::from_str(&text).map_err(|e| {
        err(
            path,
            format!(
                "not a golden file ({e}); expected schema 1 with max_tokens, capture and outputs"
            ),
        )
    })?;
    if g.schema != 1 {
        return Err(err(
            path,
            format!(
                "schema {} is not supported (this orchestrator reads schema 1)",
                g.schema
            ),
        ));
    }
    if g.max_tokens < battery.max_tokens {
        return Err(err(
            path,
            format!(
                "the golden holds {} tokens per prompt but battery.max_tokens = {}: the token gate could not check the rest; lower battery.max_tokens or recapture the golden",
                g.max_tokens, battery.max_tokens
            ),
        ));
    }
    if g.ignore_eos != battery.ignore_eos {
        return Err(err(
            path,
            format!(
                "the golden was captured with ignore_eos = {} but battery.ignore_eos = {}; make them agree",
                g.ignore_eos, battery.ignore_eos
            ),
        ));
    }
    for p in prompts {
        let Some(out) = g.output(&p.id) else {
            return Err(err(
                path,
                format!(
                    "no output for prompt {:?}; recapture the golden over this prompts file",
                    p.id
                ),
            ));
        };
        // With ignore_eos every output runs to max_tokens; without, a shorter one must end at an
        // EOS id, which preflight checks against config.json.
        let n = out.tokens.len();
        if battery.ignore_eos && n < battery.max_tokens as usize {
            return Err(err(
                path,
                format!(
                    "the output for prompt {:?} holds {n} token(s) but battery.max_tokens = {} (with ignore_eos every output runs to max_tokens): the token gate would blame correct legs for the missing ones; recapture the golden",
                    p.id, battery.max_tokens
                ),
            ));
        }
    }
    Ok(g)
}
