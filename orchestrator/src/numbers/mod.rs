//! The figures: the timing recipe over both legs' requests, the axes of the ratio table, each
//! leg's A/A noise, where a batch's time goes, and the statistics `compare` rests on.

pub mod axes;
pub mod explain;
pub mod load;
pub mod noise;
pub mod regress;
pub mod split;
pub mod stats;
pub mod timing;
