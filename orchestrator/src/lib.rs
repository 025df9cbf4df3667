//! The differential benchmark orchestrator: runs our engine and an oracle over one unit's
//! prompts on one leased machine, gates the result, and writes a record and a ratio table.
//! docs/UNIT.md, docs/GATES.md and docs/RECORD.md describe its inputs and outputs;
//! docs/LAYOUT.md how one run's data flows through these modules, stage by stage.

// A closed stdout or stderr must never panic a run: every line goes through util/term.rs.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod util;

pub mod unit;

pub mod legs;

pub mod gates;

pub mod numbers;

pub mod record;

pub mod render;

pub mod clock;
pub mod compare;
pub mod faults;
pub mod fleet;
pub mod report;
pub mod run;
