//! The figures: the timing recipe over both legs' requests, the axes of the ratio table, each
//! leg's A/A noise, and the statistics `compare` rests on.

pub mod axes;
pub mod noise;
pub mod stats;
pub mod timing;
