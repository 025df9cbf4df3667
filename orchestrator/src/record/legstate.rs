//! What `compare` reads of each leg's state beyond its timings: the host probe timed before
//! it, its SM clock and utilization over its battery, and whether it ran at all. Every field
//! has a default, so records written before these existed still read (as "not recorded").

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProbeView {
    pub best_ms: f64,
    #[serde(default)]
    pub cpu_model: String,
    #[serde(default)]
    pub kernel: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplerView {
    #[serde(default)]
    pub summary: Option<SummaryView>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct SummaryView {
    #[serde(default)]
    pub sm_mhz: Option<ClockView>,
    #[serde(default)]
    pub util_mean_pct: Option<f64>,
    #[serde(default)]
    pub host_bound: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClockView {
    pub median: f64,
}
