//! Helpers every stage uses and none owns: number formatting, UTC time, /proc, git, output that
//! survives a closed stream, children tied to the orchestrator's life, SIGINT/SIGTERM.

pub mod child;
pub mod fmt;
pub mod git;
pub mod interrupt;
pub mod procfs;
pub mod term;
pub mod time;
