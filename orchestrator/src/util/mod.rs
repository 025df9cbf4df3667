//! Helpers every stage uses and none owns: number formatting, UTC time, /proc, git.

pub mod fmt;
pub mod git;
pub mod procfs;
pub mod time;
