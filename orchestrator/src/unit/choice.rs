//! `orchestrator run --legs`: which legs a run starts.

/// Which legs `orchestrator run` starts (`--legs`): both, or one alone (a planted-fault run needs
/// only the engine; vLLM takes a minute to load). The gates that need the absent leg say "not
/// applicable" with why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LegChoice {
    #[default]
    Both,
    Engine,
    Oracle,
}

impl LegChoice {
    /// "both", "engine" or "oracle".
    pub fn parse(s: &str) -> Result<LegChoice, String> {
        match s {
            "both" => Ok(LegChoice::Both),
            "engine" => Ok(LegChoice::Engine),
            "oracle" => Ok(LegChoice::Oracle),
            _ => Err(format!(
                "--legs {s:?}: expected \"engine\", \"oracle\" or \"both\""
            )),
        }
    }
    pub fn engine(self) -> bool {
        self != LegChoice::Oracle
    }
    pub fn oracle(self) -> bool {
        self != LegChoice::Engine
    }
    /// How the absent leg's record says why it was not run.
    pub fn why_not(self) -> String {
        match self {
            LegChoice::Both => String::new(),
            LegChoice::Engine => "orchestrator run --legs engine".into(),
            LegChoice::Oracle => "orchestrator run --legs oracle".into(),
        }
    }
}
