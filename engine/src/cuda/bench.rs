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

/// Bytes a decode step of one row per entry of `contexts` must move, a row at context `c`
/// reading the K and V of `c` positions (its own new one among them): the weights as
/// [`bytes_per_token`] counts them, an embedding row for each further row, each row's K and V
/// (bf16), and a hybrid's recurrent state of each row (f32: `mamba_ssm_cache_dtype`) read and
/// written back. Activations are left out (kilobytes a layer at these batches). With the weights
/// read once for every row, the floor this gives grows with the batch only by what the rows
/// themselves move: on Nemotron-H-8B 2 x 4.1 MiB a Mamba layer a row, which at batch 32 is
/// 44% of the weights' bytes.
pub fn bytes_per_step(cfg: &ModelConfig, contexts: &[usize]) -> usize {
    let rows = contexts.len();
    let kv_per_position = crate::kv::bytes_per_token(cfg, BF16);
    let untied_rows = if cfg.tie_word_embeddings {
        0
    } else {
        rows.saturating_sub(1)
    };
    bytes_per_token(cfg)
        + untied_rows * cfg.hidden_size * BF16
        + contexts.iter().sum::<usize>() * kv_per_position
        + rows * 2 * crate::hybrid::cpu::state_slot_bytes(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_moves_the_weights_once_and_each_rows_kv_and_state() {
        // Llama-3.2-1B's shape with an lm_head of its own, so that each further row reads an
        // embedding row of its own.
        let mut llama = crate::cuda::plan::tests::llama_1b();
        llama.tie_word_embeddings = false;
        // One row at context 0 is the batch-1 figure; each position of any row adds its K and V
        // on every layer (16 x 2 x 512 bf16 = 32 KiB), each further row an embedding row.
        assert_eq!(bytes_per_step(&llama, &[0]), bytes_per_token(&llama));
        let kv = 16 * 2 * 512 * 2;
        assert_eq!(
            bytes_per_step(&llama, &[100, 300]),
            bytes_per_token(&llama) + 2048 * 2 + 400 * kv
        );
        // Tied, the table is read whole as the lm_head already: no row more.
        llama.tie_word_embeddings = true;
        assert_eq!(
            bytes_per_step(&llama, &[100, 300]),
            bytes_per_token(&llama) + 400 * kv
        );
        // Nemotron-H-8B: 4 attention layers keep K and V; each of the 24 Mamba layers' state of
        // a row (x/B/C conv window 10,240 x 3 and the SSM's 8,192 x 128, f32) is read and
        // written back.
        let nemotron =
            ModelConfig::parse(include_str!("../../tests/data/nemotron-h-8b-config.json")).unwrap();
        let state = 24 * (10_240 * 3 + 8_192 * 128) * 4;
        let kv = 4 * 2 * 1024 * 2;
        let one = bytes_per_step(&nemotron, &[0]);
        assert_eq!(one, bytes_per_token(&nemotron) + 2 * state);
        assert_eq!(
            bytes_per_step(&nemotron, &[10; 32]),
            one + 31 * (4096 * 2 + 2 * state) + 320 * kv
        );
        // At batch 32 the rows' states move 44% of what the weights do.
        let share = (32 * 2 * state) as f64 / bytes_per_token(&nemotron) as f64;
        assert!((0.3..0.5).contains(&share), "{share}");
    }
}
