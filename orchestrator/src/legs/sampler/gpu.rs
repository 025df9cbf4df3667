//! The GPU as the sampler, the idle gate and the straggler check see it. A trait, so that tests
//! play a GPU (and a process table) that this machine does not have; `sampler::nvml` is the real
//! one.

use serde::{Deserialize, Serialize};

/// What does not change during a run: recorded once (the record's `host.gpu`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuInfo {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub driver: Option<String>,
    /// The CUDA version the driver supports, as "13.0".
    pub cuda: Option<String>,
    pub memory_total_bytes: Option<u64>,
}

/// One poll of the device. Each field is None where the driver would not say (a query that is
/// not supported on this board is not a zero).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuState {
    pub sm_mhz: Option<u32>,
    pub mem_mhz: Option<u32>,
    pub power_mw: Option<u32>,
    pub temp_c: Option<u32>,
    /// NVML clock event (throttle) reasons, as the driver's bit set; [`THROTTLE_NAMES`] names them.
    pub throttle: Option<u64>,
    pub persistence: Option<bool>,
    pub used_bytes: Option<u64>,
}

/// A process holding a context on the GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProc {
    pub pid: u32,
    /// None where the driver does not account per process (it then says "not available").
    pub used_bytes: Option<u64>,
    /// A compute (CUDA) context, as opposed to a graphics one.
    pub compute: bool,
}

pub trait Gpu: Send {
    fn info(&self) -> GpuInfo;
    fn state(&mut self) -> GpuState;
    /// Utilization samples from the driver's own buffer newer than `since_us` (CPU timestamps in
    /// microseconds since the epoch), as (timestamp, percent). The buffer is filled by the driver
    /// at its own rate, so it sees busy periods shorter than our poll; Err where unsupported.
    fn utilization_samples(&mut self, since_us: u64) -> Result<Vec<(u64, u32)>, String>;
    /// The instantaneous utilization, the fallback where the buffer is unsupported.
    fn utilization_now(&mut self) -> Option<u32>;
    fn processes(&mut self) -> Vec<GpuProc>;
}

/// NVML's clock event reason bits (nvml.h `nvmlClocksEventReason*`), by the names the reference
/// report and nvidia-smi use.
pub const THROTTLE_NAMES: &[(u64, &str)] = &[
    (0x1, "GpuIdle"),
    (0x2, "ApplicationsClocksSetting"),
    (0x4, "SwPowerCap"),
    (0x8, "HwSlowdown"),
    (0x10, "SyncBoost"),
    (0x20, "SwThermalSlowdown"),
    (0x40, "HwThermalSlowdown"),
    (0x80, "HwPowerBrakeSlowdown"),
    (0x100, "DisplayClockSetting"),
];

/// The names of the bits set in `bits`; an undocumented bit is named by its value.
pub fn throttle_names(bits: u64) -> Vec<String> {
    let mut out = vec![];
    let mut rest = bits;
    for &(bit, name) in THROTTLE_NAMES {
        if bits & bit != 0 {
            out.push(name.to_string());
            rest &= !bit;
        }
    }
    let mut b = 1u64;
    while rest != 0 {
        if rest & b != 0 {
            out.push(format!("0x{b:x}"));
            rest &= !b;
        }
        b <<= 1;
    }
    out
}

/// A scripted GPU for tests: each `state()` returns the next scripted state (the last repeats),
/// `utilization_samples` hands out the scripted samples newer than `since` and not in the
/// future, and the process
/// table is whatever the test put there.
#[derive(Debug, Clone, Default)]
pub struct FakeGpu {
    pub info: GpuInfo,
    pub states: Vec<GpuState>,
    pub next: usize,
    pub util: Vec<(u64, u32)>,
    pub util_unsupported: bool,
    pub procs: Vec<GpuProc>,
}

impl Gpu for FakeGpu {
    fn info(&self) -> GpuInfo {
        self.info.clone()
    }
    fn state(&mut self) -> GpuState {
        let s = self
            .states
            .get(self.next.min(self.states.len().saturating_sub(1)))
            .cloned()
            .unwrap_or_default();
        self.next += 1;
        s
    }
    fn utilization_samples(&mut self, since_us: u64) -> Result<Vec<(u64, u32)>, String> {
        if self.util_unsupported {
            return Err("not supported".into());
        }
        // Like the driver's buffer, it holds only samples already taken.
        let now = super::now_us();
        Ok(self
            .util
            .iter()
            .copied()
            .filter(|&(t, _)| t > since_us && t <= now)
            .collect())
    }
    fn utilization_now(&mut self) -> Option<u32> {
        self.util.last().map(|&(_, u)| u)
    }
    fn processes(&mut self) -> Vec<GpuProc> {
        self.procs.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_bits_are_named_and_unknown_bits_kept() {
        assert_eq!(throttle_names(0x1 | 0x4), vec!["GpuIdle", "SwPowerCap"]);
        assert_eq!(throttle_names(0x2000), vec!["0x2000"]);
        assert!(throttle_names(0).is_empty());
    }
}
