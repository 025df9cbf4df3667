//! What a refusal withholds: whose figures are marked refused, and which axes of the ratio table
//! it concerns. Each gate states its scope (`Gate::scope`); the run stores it beside the
//! verdict in the record, and the table, `report` and `compare` read it there, so that no code
//! outside a gate needs to know what the gate's refusal means.

use serde::{Deserialize, Serialize};

use crate::legs::LegName;

/// The axes a scope can name a note for (numbers/axes.rs builds the rows under these names).
pub const PEAK_HOST_MEMORY: &str = "peak host memory";
pub const KV_POOL: &str = "KV pool";
pub const PEAK_GPU_MEMORY: &str = "peak GPU memory";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scope {
    /// The legs whose figures the table prints "(refused)" on every axis: shown, never gated.
    pub timings_of: Vec<LegName>,
    /// The axes the refusal concerns: `report` and `compare` never call those gated.
    pub axes: Axes,
    /// Notes the refusal adds to named axes of the table (why a figure is not like-for-like).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<AxisNote>,
}

/// Which axes of the ratio table a refusal concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Axes {
    /// Every axis: the run itself is in question.
    All,
    /// The times and rates (what a GPU state moves).
    Speed,
    /// The memory and pool sizes (what unmatched pools make unlike).
    Memory,
    /// No axis: only the check the refusal names.
    None,
}

impl Axes {
    /// Whether an axis of this kind is concerned (`speed`: a time or a rate; `memory`: a
    /// memory or pool size, numbers/axes.rs says which each axis is).
    pub fn concern(self, speed: bool, memory: bool) -> bool {
        match self {
            Axes::All => true,
            Axes::Speed => speed,
            Axes::Memory => memory,
            Axes::None => false,
        }
    }
}

/// A note the table writes on one axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AxisNote {
    pub axis: String,
    pub note: String,
}

impl Scope {
    /// A refusal that concerns `axes` and marks no leg's figures.
    pub fn axes(axes: Axes) -> Scope {
        Scope {
            timings_of: vec![],
            axes,
            notes: vec![],
        }
    }

    /// A refusal of `leg`'s figures on every axis (its tokens, its run or its build).
    pub fn figures_of(leg: Option<LegName>) -> Scope {
        Scope {
            timings_of: leg.into_iter().collect(),
            axes: Axes::All,
            notes: vec![],
        }
    }

    /// The notes this scope adds to `axis`.
    pub fn notes_on<'a>(&'a self, axis: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.notes
            .iter()
            .filter(move |n| n.axis == axis)
            .map(|n| n.note.as_str())
    }
}
