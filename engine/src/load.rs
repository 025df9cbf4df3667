//! From command-line options to a ready engine: config, checkpoint validation, pool sizing,
//! backend.

use std::path::PathBuf;

use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::cpu::CpuBackend;
use crate::cuda::CudaBackend;
use crate::error::{Error, Result};
use crate::generate::Engine;
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
}

pub fn load(opts: &LoadOptions) -> Result<Engine> {
    let is_cuda = opts.device.starts_with("cuda");
    if opts.device != "cpu" && crate::cuda::backend::ordinal(&opts.device).is_none() {
        return Err(Error::Config {
            message: format!("device {:?} is not one of cpu, cuda, cuda:N", opts.device),
        });
    }
    let cfg = ModelConfig::load(&opts.model)?;
    let ckpt = Checkpoint::open(&opts.model)?;
    ckpt.validate(&cfg)?;
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
    let backend: Box<dyn Backend> = if is_cuda {
        Box::new(CudaBackend::load(
            &cfg,
            &ckpt,
            &opts.device,
            opts.block_size,
            size,
            opts.max_batch,
        )?)
    } else {
        let size = size.unwrap_or(PoolSize::Default {
            max_batch: opts.max_batch,
            cap_bytes: CPU_DEFAULT_POOL_CAP,
        });
        let pool = kv::resolve_pool(&cfg, opts.block_size, size, std::mem::size_of::<f32>())?;
        Box::new(CpuBackend::load(&cfg, &ckpt, pool)?)
    };
    Ok(Engine::new(backend, cfg, opts.max_batch))
}

/// The `resolved` object of the `ready` event: what the engine actually runs with.
pub fn resolved(opts: &LoadOptions, engine: &Engine) -> serde_json::Value {
    let cfg = engine.config();
    let pool = engine.backend().pool();
    serde_json::json!({
        "model": opts.model.display().to_string(),
        "architecture": cfg.architecture.hf_name(),
        "device": opts.device,
        "dtype": engine.backend().features()["dtype"],
        "weights_dtype": cfg.dtype,
        "block_size": pool.block_size,
        "num_blocks": pool.num_blocks,
        "max_batch": engine.max_batch(),
        "max_model_len": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "eos_token_ids": cfg.eos_token_ids,
    })
}
