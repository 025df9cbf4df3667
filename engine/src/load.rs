//! From command-line options to a ready engine: config, checkpoint validation, pool sizing,
//! backend.

use std::path::PathBuf;

use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::cpu::CpuBackend;
use crate::cuda::CudaBackend;
use crate::error::{Error, Result};
use crate::fault::{self, Faults};
use crate::generate::Engine;
use crate::hybrid::cpu::{state_slot_bytes, HybridCpuBackend};
use crate::kv::{self, PoolSize};
use crate::weights::Checkpoint;

/// The default pool on the CPU is bounded so that a large model's full context does not reserve
/// more host memory than the machine has.
const CPU_DEFAULT_POOL_CAP: usize = 1 << 30;

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub model: PathBuf,
    pub device: String,
    pub block_size: usize,
    pub num_blocks: Option<usize>,
    pub kv_cache_memory: Option<usize>,
    pub max_batch: usize,
    /// `ENGINE_FAULT`'s value as read at start (fault.rs; test only), or none.
    pub fault: Option<String>,
}

/// The compute device named by `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl Device {
    /// Parses `cpu`, `cuda` (ordinal 0) and `cuda:N`.
    pub fn parse(device: &str) -> Result<Self> {
        match device {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            d => d
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| Error::Config {
                    message: format!("device {device:?} is not one of cpu, cuda, cuda:N"),
                }),
        }
    }
}

pub fn load(opts: &LoadOptions) -> Result<Engine> {
    let device = Device::parse(&opts.device)?;
    if opts.max_batch == 0 {
        return Err(Error::Config {
            message: "--max-batch 0 admits no sequence; give 1 or more (the default is 8)".into(),
        });
    }
    let faults = Faults::parse(opts.fault.as_deref().unwrap_or(""))?;
    let cfg = ModelConfig::load(&opts.model)?;
    faults.check(&cfg)?;
    let ckpt = Checkpoint::open(&opts.model)?;
    ckpt.validate(&cfg)?;
    faults.check_weights(&cfg, &ckpt)?;
    for f in faults.iter() {
        eprintln!(
            "{}: planting the {} fault ({}); a test-only build, not for measurements",
            fault::ENV,
            f.name(),
            f.what()
        );
    }
    let size = match (opts.num_blocks, opts.kv_cache_memory) {
        (Some(_), Some(_)) => {
            return Err(Error::Config {
                message: "give --num-blocks or --kv-cache-memory, not both".into(),
            })
        }
        (Some(n), None) => Some(PoolSize::Blocks(n)),
        (None, Some(b)) => Some(PoolSize::Bytes(b)),
        (None, None) => None,
    };
    let backend: Box<dyn Backend> = if let Device::Cuda(ordinal) = device {
        Box::new(CudaBackend::load(
            &cfg,
            &ckpt,
            ordinal,
            opts.block_size,
            size,
            opts.max_batch,
            &faults,
        )?)
    } else if cfg.hybrid.is_some() {
        let size = size.unwrap_or(PoolSize::Default {
            max_batch: opts.max_batch,
            cap_bytes: CPU_DEFAULT_POOL_CAP,
        });
        // One recurrent-state slot per sequence the engine admits at once.
        let slot_bytes = state_slot_bytes(&cfg);
        let limit = host_memory_bytes().unwrap_or(isize::MAX as usize);
        if opts
            .max_batch
            .checked_mul(slot_bytes)
            .is_none_or(|b| b > limit)
        {
            return Err(Error::Config {
                message: format!(
                    "--max-batch {} recurrent-state slots of {slot_bytes} bytes each exceed this \
                     host's {limit} bytes of memory; give a smaller --max-batch",
                    opts.max_batch
                ),
            });
        }
        let pool = kv::resolve_pool(&cfg, opts.block_size, size, std::mem::size_of::<f32>())?
            .with_state_slots(opts.max_batch, slot_bytes);
        Box::new(HybridCpuBackend::load(&cfg, &ckpt, pool, &faults)?)
    } else {
        let size = size.unwrap_or(PoolSize::Default {
            max_batch: opts.max_batch,
            cap_bytes: CPU_DEFAULT_POOL_CAP,
        });
        let pool = kv::resolve_pool(&cfg, opts.block_size, size, std::mem::size_of::<f32>())?;
        Box::new(CpuBackend::load(&cfg, &ckpt, pool, &faults)?)
    };
    Ok(Engine::new(backend, cfg, opts.max_batch, faults))
}

/// The host's memory (`MemTotal` of /proc/meminfo), where it can be read.
fn host_memory_bytes() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The `resolved` object of the `ready` event: what the engine actually runs with.
pub fn resolved(opts: &LoadOptions, engine: &Engine) -> serde_json::Value {
    let cfg = engine.config();
    let pool = engine.backend().pool();
    serde_json::json!({
        "model": opts.model.display().to_string(),
        "architecture": cfg.architecture.hf_name(),
        "device": opts.device,
        "dtype": engine.features()["dtype"],
        "weights_dtype": cfg.dtype,
        "block_size": pool.block_size,
        "num_blocks": pool.num_blocks,
        "state_slots": pool.state_slots,
        "max_batch": engine.max_batch(),
        "max_model_len": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "eos_token_ids": cfg.eos_token_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::Device;

    #[test]
    fn devices_parse_and_others_are_named() {
        assert_eq!(Device::parse("cpu"), Ok(Device::Cpu));
        assert_eq!(Device::parse("cuda"), Ok(Device::Cuda(0)));
        assert_eq!(Device::parse("cuda:3"), Ok(Device::Cuda(3)));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda3", "CPU"] {
            let e = Device::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{bad:?} is not one of cpu, cuda, cuda:N")),
                "{e}"
            );
        }
    }
}
