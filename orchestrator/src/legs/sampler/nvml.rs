//! The real GPU, through NVML (nvml-wrapper). The library is dlopened at run time, so this builds
//! and runs on a machine with no driver: `open` then fails with the reason, once per process.

use std::sync::OnceLock;

use nvml_wrapper::enum_wrappers::device::{Clock, Sampling, TemperatureSensor};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::gpu::{Gpu, GpuInfo, GpuProc, GpuState};

/// One NVML handle per process: init is slow (tens of ms) and a device handle borrows it, so it
/// lives for the program. Err holds why NVML is unavailable, said once by whoever asks first.
static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();

fn nvml() -> Result<&'static Nvml, String> {
    NVML.get_or_init(|| {
        Nvml::init().map_err(|e| {
            format!("NVML is not available ({e}): no NVIDIA driver or GPU on this machine")
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

pub struct NvmlGpu {
    device: Device<'static>,
    index: u32,
}

/// Opens GPU `index`; Err is the sentence saying why there is no GPU to sample.
pub fn open(index: u32) -> Result<Box<dyn Gpu>, String> {
    let n = nvml()?;
    let device = n
        .device_by_index(index)
        .map_err(|e| format!("NVML has no GPU {index} ({e})"))?;
    Ok(Box::new(NvmlGpu { device, index }))
}

impl Gpu for NvmlGpu {
    fn info(&self) -> GpuInfo {
        let n = nvml().ok();
        GpuInfo {
            index: self.index,
            name: self.device.name().ok(),
            uuid: self.device.uuid().ok(),
            driver: n.and_then(|n| n.sys_driver_version().ok()),
            cuda: n
                .and_then(|n| n.sys_cuda_driver_version().ok())
                .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
            memory_total_bytes: self.device.memory_info().ok().map(|m| m.total),
        }
    }

    fn state(&mut self) -> GpuState {
        let d = &self.device;
        GpuState {
            sm_mhz: d.clock_info(Clock::SM).ok(),
            mem_mhz: d.clock_info(Clock::Memory).ok(),
            power_mw: d.power_usage().ok(),
            temp_c: d.temperature(TemperatureSensor::Gpu).ok(),
            throttle: d.current_throttle_reasons().ok().map(|r| r.bits()),
            persistence: d.is_in_persistent_mode().ok(),
            used_bytes: d.memory_info().ok().map(|m| m.used),
        }
    }

    fn utilization_samples(&mut self, since_us: u64) -> Result<Vec<(u64, u32)>, String> {
        match self.device.samples(Sampling::GpuUtilization, since_us) {
            Ok(v) => Ok(v
                .into_iter()
                .map(|s| {
                    let pct = match s.value {
                        SampleValue::U32(x) => x,
                        SampleValue::U64(x) => x as u32,
                        SampleValue::I64(x) => x.max(0) as u32,
                        SampleValue::F64(x) => x.max(0.0) as u32,
                    };
                    (s.timestamp, pct)
                })
                .collect()),
            // NVML says NotFound when nothing is newer than `since`: that is no news, not a fault.
            Err(NvmlError::NotFound) => Ok(vec![]),
            Err(e) => Err(e.to_string()),
        }
    }

    fn utilization_now(&mut self) -> Option<u32> {
        self.device.utilization_rates().ok().map(|u| u.gpu)
    }

    fn processes(&mut self) -> Vec<GpuProc> {
        let bytes = |m: UsedGpuMemory| match m {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        };
        let mut out: Vec<GpuProc> = self
            .device
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .map(|p| GpuProc {
                pid: p.pid,
                used_bytes: bytes(p.used_gpu_memory),
                compute: true,
            })
            .collect();
        for p in self.device.running_graphics_processes().unwrap_or_default() {
            if !out.iter().any(|q| q.pid == p.pid) {
                out.push(GpuProc {
                    pid: p.pid,
                    used_bytes: bytes(p.used_gpu_memory),
                    compute: false,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    /// On a machine without a driver (CI, this one) opening fails with a sentence, never panics;
    /// on a GPU machine it opens GPU 0.
    #[test]
    fn open_says_why_or_opens() {
        match super::open(0) {
            Ok(mut g) => assert!(g.state().sm_mhz.is_some()),
            Err(e) => assert!(e.contains("NVML") || e.contains("GPU"), "{e}"),
        }
    }
}
