//! The differential benchmark orchestrator: runs our engine and an oracle over one unit's
//! prompts on one leased machine, gates the result, and writes a record and a ratio table.
//! docs/UNIT.md, docs/GATES.md and docs/RECORD.md describe its inputs and outputs;
//! docs/LAYOUT.md how one run's data flows through these modules, stage by stage.

pub mod util;

pub mod unit;

pub mod legs;

pub mod gates;

pub mod numbers;

pub mod record;

pub mod render;

pub mod clock;
pub mod compare;
pub mod report;
pub mod run;
