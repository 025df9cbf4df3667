//! `engine bench`'s figures from the device: the copy bandwidth a decode step can approach and
//! the bytes a step must read, whose ratio is the bandwidth floor.

use cudarc::driver::{sys, CudaContext};

use super::backend::BF16;
use super::device::{driver_err, DevBuf};
use super::plan;
use crate::config::ModelConfig;
use crate::error::Result;

/// Device-to-device copy bandwidth of `ordinal`, bytes read plus bytes written per second: the
/// ceiling a decode step that streams its weights can approach. Median of 10 timed copies of
/// `bytes` after a warm-up.
pub fn copy_bandwidth(ordinal: usize, bytes: usize) -> Result<f64> {
    use cudarc::driver::result as dr;
    let ctx = CudaContext::new(ordinal).map_err(driver_err("context"))?;
    let stream = ctx.new_stream().map_err(driver_err("stream"))?;
    let src = DevBuf::zeroed(bytes)?;
    let dst = DevBuf::zeroed(bytes)?;
    // Not zeros: a copy of zeros can be cheaper than real data.
    let pattern: Vec<u32> = (0..(1 << 20))
        .map(|i: u32| i.wrapping_mul(2_654_435_761))
        .collect();
    for off in (0..bytes / 4).step_by(pattern.len()) {
        let n = pattern.len().min(bytes / 4 - off);
        src.write(off, &pattern[..n])?;
    }
    let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = ctx.new_event(timing).map_err(driver_err("event"))?;
    let end = ctx.new_event(timing).map_err(driver_err("event"))?;
    let mut times = Vec::new();
    for rep in 0..11 {
        start.record(&stream).map_err(driver_err("event record"))?;
        // SAFETY: both buffers are live and `bytes` long.
        unsafe { dr::memcpy_dtod_async(dst.ptr, src.ptr, bytes, stream.cu_stream()) }
            .map_err(driver_err("cuMemcpyDtoD"))?;
        end.record(&stream).map_err(driver_err("event record"))?;
        end.synchronize().map_err(driver_err("event sync"))?;
        if rep > 0 {
            times.push(start.elapsed_ms(&end).map_err(driver_err("event time"))? as f64 / 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(2.0 * bytes as f64 / times[times.len() / 2])
}

/// Bytes a batch-1 decode step must read from device memory: every weight once, except the
/// embedding table, of which it reads one row (a tied table is read whole, as the lm_head).
pub fn bytes_per_token(cfg: &ModelConfig) -> usize {
    let embed = cfg.vocab_size * cfg.hidden_size * BF16;
    plan::weight_bytes(cfg) - if cfg.tie_word_embeddings { 0 } else { embed }
}
