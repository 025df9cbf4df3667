//! The differential benchmark orchestrator: runs our engine and an oracle over one unit's
//! prompts on one leased machine, gates the result, and writes a record and a ratio table.
//! docs/UNIT.md, docs/GATES.md and docs/RECORD.md describe its inputs and outputs.

pub mod archive;
pub mod chart;
pub mod compare;
pub mod fleet;
pub mod gates;
pub mod lease;
pub mod leg;
pub mod noise;
pub mod placement;
pub mod preflight;
pub mod progress;
pub mod protocol;
pub mod record;
pub mod report;
pub mod run;
pub mod sampler;
pub mod stats;
pub mod svg;
pub mod table;
pub mod timeline;
pub mod timing;
pub mod unit;
pub mod watchdog;
