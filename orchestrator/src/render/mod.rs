//! Everything drawn from records: tables (terminal and Markdown), BENCHMARKS.md, the timeline
//! and ratio-history pictures.

pub mod chart;
pub mod compare;
pub mod report;
pub mod run;
pub mod svg;
pub mod table;
pub mod timeline;
