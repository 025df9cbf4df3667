//! The token gate: each leg's tokens against the golden that applies to it, as grand totals over
//! every battery repeat and batch size, so a leg that matched once and diverged later cannot pass.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

use super::{each_leg, golden_config, Gate, GateInput, GateResult, Scope};
use crate::legs::record::{LegName, LegRecord, RequestKind};
use crate::unit::{Golden, Unit};
use crate::util::fmt::{capitalise_first, fmt_num};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Mismatch {
    pub prompt: String,
    /// Which request showed it first: battery pass and batch size.
    pub pass: u32,
    pub batch: u32,
    pub position: usize,
    /// None: the leg stopped before this position.
    pub got: Option<u32>,
    pub want: u32,
    pub margin: Option<f64>,
    /// The golden's best other token there, where the golden records it.
    #[serde(default)]
    pub runner_up: Option<u32>,
    /// The margin is under `near_tie_margin` and the leg took the golden's runner-up (or the
    /// golden does not say which that was): what two correct implementations can differ by.
    pub near_tie: bool,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let got = match self.got {
            Some(t) => format!("got {t}"),
            None => "got nothing (the leg stopped early)".into(),
        };
        write!(
            f,
            "prompt {} first differs at position {} (repeat {}, batch {}): {got}, golden {}",
            self.prompt,
            self.position,
            self.pass + 1,
            self.batch,
            self.want
        )?;
        match (self.margin, self.near_tie, self.runner_up) {
            (Some(m), true, None) => {
                write!(f, ", at a recorded near-tie (golden margin {})", fmt_num(m))
            }
            (Some(m), true, Some(_)) => write!(
                f,
                ", at a recorded near-tie (golden margin {}), on the golden's runner-up",
                fmt_num(m)
            ),
            (Some(m), false, Some(r)) if self.got != Some(r) => write!(
                f,
                ", not a near-tie (golden margin {}; the golden's runner-up there is {r}, not the \
                 token the leg took)",
                fmt_num(m)
            ),
            (Some(m), false, _) => write!(f, ", not a near-tie (golden margin {})", fmt_num(m)),
            (None, _, _) => write!(f, ", no margin recorded there"),
        }
    }
}

/// Why a leg's tokens are refused. Display is the whole sentence.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum TokenReason {
    TokenMismatch {
        leg: LegName,
        summary: String,
        golden: PathBuf,
        mismatches: Vec<Mismatch>,
    },
    NoGolden {
        leg: LegName,
        device: String,
        dtype: String,
    },
}

impl fmt::Display for TokenReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenReason::TokenMismatch {
                leg,
                summary,
                golden,
                mismatches,
            } => {
                write!(
                    f,
                    "The {leg} leg's tokens do not match the golden {}: {summary}; its timings are printed but refused.",
                    golden.display()
                )?;
                for m in mismatches {
                    write!(f, " {}: {m}.", capitalise_first(leg.as_str()))?;
                }
                write!(
                    f,
                    " Hint: a mismatch at a near-tie is reduction-order noise that a golden captured on this device and dtype would absorb; one that is not is a correctness bug to bisect."
                )
            }
            TokenReason::NoGolden { leg, device, dtype } => write!(
                f,
                "No [[golden]] in the unit applies to the {leg} leg (device {device}, dtype {dtype}), so its tokens could not be checked and its timings are refused. Hint: capture a golden on this device and dtype and add a [[golden]] entry for it."
            ),
        }
    }
}

/// Grand totals of one leg against one golden.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenTally {
    /// Positions matched before each row's first difference, summed over rows.
    pub matched: u64,
    /// Golden positions compared, summed over rows.
    pub expected: u64,
    /// Distinct prompts compared.
    pub prompts: usize,
    /// Rows (prompt x repeat x batch size) equal to the golden.
    pub full_rows: u64,
    /// Rows that stopped before the golden did (what they produced may still match).
    pub short_rows: u64,
    pub rows: u64,
    /// The first mismatch per failing prompt (earliest position over all its rows).
    pub mismatches: Vec<Mismatch>,
}

impl TokenTally {
    pub fn passed(&self) -> bool {
        self.rows > 0 && self.full_rows == self.rows && self.matched == self.expected
    }

    /// The reference report's wording.
    pub fn summary(&self) -> String {
        format!(
            "TOKEN MATCH: {}/{} over {} prompt(s) (full rows={}, short rows={})",
            self.matched, self.expected, self.prompts, self.full_rows, self.short_rows
        )
    }
}

/// Compares every max_tokens=N battery row of `leg` with `golden`.
pub fn tally(
    leg: &LegRecord,
    prompt_ids: &[String],
    golden: &Golden,
    max_tokens: u32,
    near_tie_margin: f64,
) -> TokenTally {
    let mut t = TokenTally {
        prompts: prompt_ids.len(),
        ..Default::default()
    };
    let mut first: Vec<Option<Mismatch>> = vec![None; prompt_ids.len()];
    for req in leg
        .battery_requests()
        .filter(|r| matches!(r.kind, RequestKind::Decode | RequestKind::Batch))
    {
        for res in &req.results {
            let Some(id) = prompt_ids.get(res.index) else {
                continue;
            };
            let Some(out) = golden.output(id) else {
                continue;
            };
            let want = &out.tokens[..out.tokens.len().min(max_tokens as usize)];
            let got = &res.tokens;
            let prefix = want.iter().zip(got).take_while(|(a, b)| a == b).count();
            t.rows += 1;
            t.expected += want.len() as u64;
            t.matched += prefix as u64;
            if got.as_slice() == want {
                t.full_rows += 1;
                continue;
            }
            if got.len() < want.len() {
                t.short_rows += 1;
            }
            // A row longer than the golden differs at the golden's end: report the golden's last
            // position as the place (there is no golden token beyond it).
            let position = prefix.min(want.len().saturating_sub(1));
            let margin = out
                .margins
                .as_ref()
                .and_then(|m| m.get(position).copied().flatten());
            let runner_up = out
                .runner_up
                .as_ref()
                .and_then(|r| r.get(position).copied().flatten());
            let got_here = got.get(position).copied();
            let m = Mismatch {
                prompt: id.clone(),
                pass: req.pass,
                batch: req.batch,
                position,
                got: got_here,
                want: want.get(position).copied().unwrap_or(0),
                margin,
                runner_up,
                // A wrong token can fall on a near-tie too (an H200 build's NaN gave token 0 at
                // margin 0.016): where the golden names its runner-up, only that one is noise.
                near_tie: margin.is_some_and(|m| m.abs() < near_tie_margin)
                    && runner_up.is_none_or(|r| got_here == Some(r)),
            };
            let slot = &mut first[res.index];
            if slot.as_ref().is_none_or(|s| m.position < s.position) {
                *slot = Some(m);
            }
        }
    }
    t.mismatches = first.into_iter().flatten().collect();
    t
}

/// The device and dtype a leg ran with: what it reported, else what the unit asked for.
pub fn leg_device_dtype(unit: &Unit, leg: &LegRecord) -> (String, String) {
    let c = &unit.config;
    let (dev, dt) = match leg.leg {
        LegName::Engine => (c.engine.device.as_str(), "float32"),
        LegName::Oracle => (c.oracle.device.as_str(), c.oracle.dtype.as_str()),
    };
    let ready = leg.ready.as_ref();
    // A device the goldens cannot be matched by (e.g. a GPU's name) falls back to the unit's.
    let reported = ready
        .and_then(|r| r.device())
        .filter(|d| matches!(crate::unit::device_kind(d), "cpu" | "cuda"));
    (
        reported.unwrap_or(dev).to_string(),
        ready.and_then(|r| r.dtype()).unwrap_or(dt).to_string(),
    )
}

/// The golden (path as written in the unit, and content) that applies to a leg.
pub fn golden_for<'a>(
    input: &'a GateInput,
    leg: &LegRecord,
) -> Result<(PathBuf, &'a Golden), TokenReason> {
    let (device, dtype) = leg_device_dtype(input.unit, leg);
    input
        .unit
        .golden_for(&device, &dtype)
        .and_then(|g| {
            input
                .goldens
                .get(&g.file)
                .map(|gold| (g.file.clone(), gold))
        })
        .ok_or(TokenReason::NoGolden {
            leg: leg.leg,
            device,
            dtype,
        })
}

pub struct TokenGate;

impl Gate for TokenGate {
    fn name(&self) -> &'static str {
        "token"
    }

    /// Wrong tokens (or none checked) make the leg's timings not a measure of the model.
    fn scope(&self, leg: Option<LegName>) -> Scope {
        Scope::figures_of(leg)
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        each_leg(input, |leg, rec| self.judge_leg(input, leg, rec))
    }
}

impl TokenGate {
    fn judge_leg(&self, input: &GateInput, leg: LegName, rec: &LegRecord) -> GateResult {
        if !rec.measured() {
            return GateResult::not_applicable(
                self,
                Some(leg),
                format!("the {leg} leg did not complete its battery"),
            );
        }
        let (file, golden) = match golden_for(input, rec) {
            Ok(g) => g,
            Err(r) => return GateResult::refused(self, Some(leg), &r),
        };
        let c = &input.unit.config;
        let t = tally(
            rec,
            input.prompt_ids,
            golden,
            c.battery.max_tokens,
            c.gates.near_tie_margin,
        );
        // The oracle is judged against its golden only if it ran the golden's config.
        let diffs = if leg == LegName::Oracle {
            golden_config::diffs(rec, golden, &c.gates.golden_config_ignore)
        } else {
            vec![]
        };
        if !diffs.is_empty() {
            let keys: Vec<&str> = diffs.iter().map(|d| d.key.as_str()).collect();
            return GateResult::not_applicable(
                self,
                Some(leg),
                format!(
                    "{} against {}, but the golden was captured under another oracle config (differing keys: {}), so the oracle-vs-golden check does not apply",
                    t.summary(),
                    file.display(),
                    keys.join(", ")
                ),
            );
        }
        if t.passed() {
            return GateResult::pass(
                self,
                Some(leg),
                format!("{} against {}", t.summary(), file.display()),
            );
        }
        let reason = TokenReason::TokenMismatch {
            leg,
            summary: t.summary(),
            golden: file,
            mismatches: t.mismatches,
        };
        GateResult::refused(self, Some(leg), &reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legs::protocol::PromptResult;
    use crate::legs::record::{PhaseTime, RequestRecord};
    use crate::legs::watchdog::Phase;
    use crate::unit::{GoldenCapture, GoldenOutput};

    fn golden() -> Golden {
        Golden {
            schema: 1,
            max_tokens: 4,
            ignore_eos: true,
            capture: GoldenCapture {
                backend: None,
                versions: Default::default(),
                dtype: None,
                device: None,
                resolved: Default::default(),
            },
            outputs: vec![
                GoldenOutput {
                    id: "p0".into(),
                    tokens: vec![1, 2, 3, 4],
                    margins: Some(vec![Some(1.0), Some(1.0), Some(0.0001), Some(1.0)]),
                    runner_up: None,
                },
                GoldenOutput {
                    id: "p1".into(),
                    tokens: vec![5, 6, 7, 8],
                    margins: None,
                    runner_up: None,
                },
            ],
        }
    }

    fn with_ready(mut leg: LegRecord, ready: serde_json::Value) -> LegRecord {
        leg.ready = Some(serde_json::from_value(ready).unwrap());
        leg
    }

    #[test]
    fn a_device_that_is_no_device_kind_falls_back_to_the_units() {
        let unit = Unit::parse(
            std::path::Path::new("/u/unit.toml"),
            "name = \"u\"\nmodel = \"m\"\n[battery]\nprompts = \"p.json\"\n\
             [[golden]]\nfile = \"g.json\"\ndevice = \"cuda\"\ndtype = \"bfloat16\"\n\
             [engine]\ndevice = \"cuda:0\"\n[oracle]\nbackend = \"vllm\"\n",
        )
        .unwrap();
        let named = with_ready(
            leg(vec![]),
            serde_json::json!({"type": "ready", "load_s": 1.0, "kv": null,
                "features": {"device": "NVIDIA H200", "dtype": "bfloat16"}}),
        );
        assert_eq!(
            leg_device_dtype(&unit, &named),
            ("cuda:0".to_string(), "bfloat16".to_string())
        );
        let cpu = with_ready(
            leg(vec![]),
            serde_json::json!({"type": "ready", "load_s": 1.0, "kv": null,
                "features": {"device": "cpu", "dtype": "float32"}}),
        );
        assert_eq!(leg_device_dtype(&unit, &cpu).0, "cpu");
    }

    #[test]
    fn golden_config_compares_env_members_but_never_the_visible_gpu() {
        let mut g = golden();
        g.capture.resolved = serde_json::from_value(serde_json::json!({
            "seed": 0, "engine": "multi-process",
            "env": {"CUDA_VISIBLE_DEVICES": null, "VLLM_ENABLE_V1_MULTIPROCESSING": null,
                    "VLLM_ATTENTION_BACKEND": null}}))
        .unwrap();
        let ready = |engine: &str, mp: &str, attn: serde_json::Value| {
            with_ready(
                leg(vec![]),
                serde_json::json!({"type": "ready", "load_s": 1.0, "kv": null,
                    "resolved": {"seed": 0.0, "engine": engine,
                        "env": {"CUDA_VISIBLE_DEVICES": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": mp,
                                "VLLM_ATTENTION_BACKEND": attn}}}),
            )
        };
        let keys = |rec: &LegRecord, ignore: &[&str]| -> Vec<String> {
            let ignore: Vec<String> = ignore.iter().map(|s| s.to_string()).collect();
            golden_config::diffs(rec, &g, &ignore)
                .into_iter()
                .map(|d| d.key)
                .collect()
        };
        let mp_off = ready("in-process", "0", serde_json::Value::Null);
        assert_eq!(keys(&mp_off, &[]), vec!["engine", "env"]);
        // Only the named member of env is ignored; another member still counts.
        assert!(keys(&mp_off, &["engine", "env.VLLM_ENABLE_V1_MULTIPROCESSING"]).is_empty());
        let attn = ready("in-process", "0", "FLASH_ATTN".into());
        assert_eq!(
            keys(&attn, &["engine", "env.VLLM_ENABLE_V1_MULTIPROCESSING"]),
            vec!["env"]
        );
        // The same config on another visible GPU: no difference.
        let same = ready("multi-process", "x", serde_json::Value::Null);
        assert_eq!(
            keys(&same, &["env.VLLM_ENABLE_V1_MULTIPROCESSING"]),
            Vec::<String>::new()
        );
    }

    fn leg(rows: Vec<(u32, Vec<Vec<u32>>)>) -> LegRecord {
        let requests = rows
            .into_iter()
            .map(|(pass, toks)| RequestRecord {
                id: format!("r{pass}"),
                phase: Phase::Battery,
                pass,
                kind: RequestKind::Decode,
                batch: 1,
                max_tokens: 4,
                wall_s: 1.0,
                results: toks
                    .into_iter()
                    .enumerate()
                    .map(|(i, tokens)| PromptResult {
                        id: format!("r{pass}"),
                        index: i,
                        tokens,
                        elapsed_s: 0.1,
                        ttft_s: None,
                    })
                    .collect(),
            })
            .collect();
        LegRecord {
            leg: LegName::Engine,
            argv: vec![],
            log: "x".into(),
            ready: None,
            phases: vec![PhaseTime {
                phase: Phase::Battery,
                elapsed_s: 1.0,
                ok: true,
            }],
            requests,
            watchdog: None,
            stragglers: vec![],
            exit_status: Some(0),
            failure: None,
            host_mem: Default::default(),
            sampler: Default::default(),
            gpu_stragglers: vec![],
            gpu_checked: false,
            prior_starts: vec![],
        }
    }

    fn ids() -> Vec<String> {
        vec!["p0".into(), "p1".into()]
    }

    #[test]
    fn all_rows_match_text_is_exact() {
        let l = leg(vec![
            (0, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]]),
            (1, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]]),
        ]);
        let t = tally(&l, &ids(), &golden(), 4, 1e-3);
        assert!(t.passed());
        assert_eq!(
            t.summary(),
            "TOKEN MATCH: 16/16 over 2 prompt(s) (full rows=4, short rows=0)"
        );
    }

    #[test]
    fn a_second_repeat_that_diverges_fails_the_grand_total() {
        let l = leg(vec![
            (0, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]]),
            (1, vec![vec![1, 2, 9, 9], vec![5, 6, 7]]),
        ]);
        let t = tally(&l, &ids(), &golden(), 4, 1e-3);
        assert!(!t.passed());
        assert_eq!(
            t.summary(),
            "TOKEN MATCH: 13/16 over 2 prompt(s) (full rows=2, short rows=1)"
        );
        assert_eq!(t.mismatches.len(), 2);
        let m0 = &t.mismatches[0];
        assert_eq!(
            (m0.prompt.as_str(), m0.position, m0.got, m0.want, m0.pass),
            ("p0", 2, Some(9), 3, 1)
        );
        assert!(m0.near_tie, "margin 1e-4 < 1e-3 is a near-tie");
        assert!(m0.to_string().contains("at a recorded near-tie"), "{m0}");
        let m1 = &t.mismatches[1];
        assert_eq!((m1.position, m1.got, m1.margin), (3, None, None));
        assert!(m1.to_string().contains("stopped early"), "{m1}");
    }

    #[test]
    fn at_a_near_tie_only_the_goldens_runner_up_is_noise() {
        // p0's position 2 is a near-tie (margin 1e-4) whose runner-up was 9.
        let mut g = golden();
        g.outputs[0].runner_up = Some(vec![Some(5), Some(5), Some(9), Some(5)]);
        // The leg's p0 with `token` at position 2; its one mismatch.
        let at_2 = |token: u32| {
            let t = tally(
                &leg(vec![(0, vec![vec![1, 2, token, 4], vec![5, 6, 7, 8]])]),
                &ids(),
                &g,
                4,
                1e-3,
            );
            assert_eq!(t.mismatches.len(), 1);
            t.mismatches.into_iter().next().unwrap()
        };
        let m = at_2(9);
        assert!(m.near_tie, "{m}");
        assert!(m.to_string().contains("on the golden's runner-up"), "{m}");
        // The same position, a token that was neither of the golden's two best: a wrong token
        // (what a NaN's token 0 looked like on the H200), not reduction-order noise.
        let m = at_2(0);
        assert!(!m.near_tie, "{m}");
        assert!(
            m.to_string().contains(
                "not a near-tie (golden margin 0.0001000; the golden's runner-up there is 9"
            ),
            "{m}"
        );
    }

    #[test]
    fn mismatch_off_a_near_tie_is_said_so() {
        let l = leg(vec![(0, vec![vec![7, 2, 3, 4], vec![5, 6, 7, 8]])]);
        let t = tally(&l, &ids(), &golden(), 4, 1e-3);
        assert_eq!(
            t.summary(),
            "TOKEN MATCH: 4/8 over 2 prompt(s) (full rows=1, short rows=0)"
        );
        assert!(!t.mismatches[0].near_tie);
        assert!(t.mismatches[0].to_string().contains("not a near-tie"));
    }

    #[test]
    fn golden_longer_than_battery_compares_only_max_tokens() {
        let l = leg(vec![(0, vec![vec![1, 2], vec![5, 6]])]);
        let t = tally(&l, &ids(), &golden(), 2, 1e-3);
        assert!(t.passed());
        assert_eq!(
            t.summary(),
            "TOKEN MATCH: 4/4 over 2 prompt(s) (full rows=2, short rows=0)"
        );
    }

    #[test]
    fn no_rows_never_passes() {
        let l = leg(vec![]);
        assert!(!tally(&l, &ids(), &golden(), 4, 1e-3).passed());
    }
}
