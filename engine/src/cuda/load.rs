//! Loading the CUDA backend: the device and its libraries, the kernels, the weights (bf16,
//! uploaded shard by shard), the KV cache and the decode and prefill buffers, then the decode
//! step's graphs.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaFunction};

use super::backend::{CudaBackend, BF16, F32};
use super::device::{driver_err, DevBuf};
use super::gemm::{gemm_shapes, Dims, GemmBench, Out};
use super::kernels::{self, Kernels};
use super::plan::{self, DecodeLayout, GemvMode, PrefillLayout, GEMV_THREADS, PREFILL_CHUNK};
use super::profiler::Profiler;
use super::tune;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::fault::{Fault, Faults};
use crate::hybrid::cpu::state_slot_bytes;
use crate::kv::{self, PoolSize};
use crate::weights::{Checkpoint, DType};

/// cuBLASLt's workspace: 32 MiB, what torch gives cuBLAS on Hopper.
const GEMM_WORKSPACE: usize = 32 << 20;

/// A weight matrix on the device: `rows` x `cols` bf16, row-major, as torch stores
/// `nn.Linear.weight` ([out, in]), and what its GEMMs write.
pub(super) struct Matrix {
    pub buf: DevBuf,
    pub rows: usize,
    pub cols: usize,
    pub out: Out,
}

impl Matrix {
    fn zeroed(rows: usize, cols: usize) -> Result<Self> {
        Ok(Self {
            buf: DevBuf::zeroed(rows * cols * BF16)?,
            rows,
            cols,
            out: Out::F32,
        })
    }

    /// The MLP's up matrix: its GEMMs write bf16, read once by SwiGLU or relu2.
    fn zeroed_act(rows: usize, cols: usize) -> Result<Self> {
        Ok(Self {
            out: Out::Bf16,
            ..Self::zeroed(rows, cols)?
        })
    }

    /// Its shape as a GEMM sees it: out, in and what it writes.
    pub fn dims(&self) -> Dims {
        (self.rows, self.cols, self.out)
    }
}

/// Attention after its norm: q/k/v, attention over the paged cache, o.
pub(super) struct AttentionWeights {
    /// q, k and v stacked: [q_dim + 2 kv_dim, hidden].
    pub qkv: Matrix,
    pub qkv_bias: Option<DevBuf>,
    pub q_norm: Option<DevBuf>,
    pub k_norm: Option<DevBuf>,
    pub o: Matrix,
    /// Which of the KV cache's layers is this one's.
    pub cache: usize,
}

/// The MLP after its norm.
pub(super) struct MlpWeights {
    /// SwiGLU (Llama family): gate and up stacked, [2 intermediate, hidden]; squared ReLU
    /// (Nemotron-H): up, [intermediate, hidden].
    pub up: Matrix,
    pub down: Matrix,
    pub swiglu: bool,
}

/// The Mamba-2 mixer after its norm (mamba.cu).
pub(super) struct MambaWeights {
    /// [in_proj_dim, hidden]: z, x B C, dt.
    pub in_proj: Matrix,
    pub out_proj: Matrix,
    /// [conv_dim][conv_kernel] bf16, and its bias.
    pub conv_w: DevBuf,
    pub conv_b: Option<DevBuf>,
    /// Per head, f32: dt's bias, A = -exp(A_log) and the skip D.
    pub dt_bias: DevBuf,
    pub a: DevBuf,
    pub d: DevBuf,
    /// The gated RMSNorm's weight, [inner] bf16.
    pub gate_norm: DevBuf,
    /// Which of the state pool's Mamba layers is this one's.
    pub state: usize,
}

pub(super) enum Mixer {
    Attention(AttentionWeights),
    Mlp(MlpWeights),
    Mamba(MambaWeights),
}

/// One residual step: RMSNorm, the mixer, its output added to the residual stream. A Llama-family
/// layer is two (attention, then the SwiGLU MLP); a Nemotron-H block is one.
pub(super) struct Sublayer {
    pub norm: DevBuf,
    pub mixer: Mixer,
}

/// Every weight of the model on the device.
pub(super) struct Weights {
    pub embed: Matrix,
    pub layers: Vec<Sublayer>,
    pub norm: DevBuf,
    /// `None` when the lm_head is tied to the embedding.
    pub lm_head: Option<Matrix>,
}

/// The kernels the backend launches, looked up once.
pub(super) struct Funcs {
    pub embed: CudaFunction,
    pub rmsnorm: CudaFunction,
    pub rope_kv: CudaFunction,
    pub attention: CudaFunction,
    /// The tensor-core prefill attention for the model's head dimension, if it has one.
    pub attention_prefill: Option<CudaFunction>,
    /// The cuBLAS step's decode attention on the tensor cores, if the model's heads have one.
    pub attention_batch: Option<CudaFunction>,
    pub swiglu: CudaFunction,
    pub argmax_final: CudaFunction,
    /// The cuBLAS step's argmax over its logits.
    pub argmax_rows: CudaFunction,
    /// The verify request's scoring after a step: the lm_head writing its logits
    /// (`lm_head_logits[tensor cores as usize][batch - 1]`: `gemv_m5_logits_b{batch}`,
    /// `gemv_m12_logits_b{batch}`), and `score_forced`.
    pub lm_head_logits: [Vec<CudaFunction>; 2],
    pub score: CudaFunction,
    pub mamba_conv: CudaFunction,
    /// The prefill scan sequentially and the decode step (mamba.cu); the prefill scan in chunks
    /// on the tensor cores (mamba_ssd.cu), where the heads fit it.
    pub mamba_ssm: CudaFunction,
    /// The decode step a block an item (the GEMV path's), and persistent and staged (the cuBLAS
    /// path's) with the blocks of it resident on the whole GPU at once, its grid (0 for a model
    /// without Mamba layers).
    pub mamba_ssm_step: CudaFunction,
    pub mamba_ssm_step_staged: CudaFunction,
    pub mamba_step_blocks: usize,
    pub mamba_ssd: CudaFunction,
    pub mamba_gated_norm: CudaFunction,
    pub relu2: CudaFunction,
    /// gemv[mode.index()][batch - 1] for every [`GemvMode`].
    pub gemv: Vec<Vec<CudaFunction>>,
    /// Blocks of each GEMV resident on the whole GPU at once, the streaming modes' persistent
    /// grid: resident[mode.index()][batch - 1].
    pub resident: Vec<Vec<usize>>,
}

pub(super) struct DecodeBufs {
    pub layout: DecodeLayout,
    pub tokens: DevBuf,
    pub positions: DevBuf,
    pub row_table: DevBuf,
    pub tables: DevBuf,
    pub x: DevBuf,
    pub xn: DevBuf,
    pub qkv: DevBuf,
    pub attn: DevBuf,
    pub act: DevBuf,
    pub parts: DevBuf,
    pub part_o: DevBuf,
    pub part_ml: DevBuf,
    pub counts: DevBuf,
    /// Each row's recurrent-state slot (a hybrid's); 0, 1, ..., max_batch (each row its own
    /// segment, mamba.cu); the Mamba mixer's buffers.
    pub slots: DevBuf,
    pub starts: DevBuf,
    pub zxbcdt: DevBuf,
    pub xbc: DevBuf,
    pub ssm_y: DevBuf,
    pub gated: DevBuf,
    /// The cuBLAS step's (plan.rs `DecodeLayout`).
    pub xn_bf16: DevBuf,
    pub act_bf16: DevBuf,
    pub attn_bf16: DevBuf,
    pub gated_bf16: DevBuf,
    pub up: DevBuf,
    pub logits: DevBuf,
}

/// Prefill's scratch for a pass of up to `layout.rows` rows of up to `seqs` prompts.
pub(super) struct PrefillBufs {
    pub layout: PrefillLayout,
    pub tokens: DevBuf,
    pub positions: DevBuf,
    /// Each row's prompt (its block table in `tables`).
    pub row_table: DevBuf,
    pub tables: DevBuf,
    pub x: DevBuf,
    pub xn_bf16: DevBuf,
    pub qkv: DevBuf,
    pub attn_bf16: DevBuf,
    pub gate_up: DevBuf,
    pub act_bf16: DevBuf,
    /// The prefill attention's tiles of the pass (plan.rs `attention_prefill_tiles`).
    pub tiles: DevBuf,
    /// The pass's segments (one per prompt with rows in it, plan.rs `prefill_passes`): each one's
    /// recurrent-state slot and first row; and the Mamba mixer's buffers.
    pub slots: DevBuf,
    pub starts: DevBuf,
    pub zxbcdt: DevBuf,
    pub xbc: DevBuf,
    pub ssm_y: DevBuf,
    pub gated_bf16: DevBuf,
    /// Each prompt's last row, normalised; the lm_head's argmax candidates (one row at a time);
    /// each prompt's greedy token.
    pub last_xn: DevBuf,
    pub parts: DevBuf,
    pub tokens_out: DevBuf,
}

/// The verify request's scratch, allocated at its first use: the lm_head's logits and argmax
/// candidates, the forced tokens, and each row's (argmax, gap, scale).
pub(super) struct VerifyBufs {
    pub logits: DevBuf,
    pub parts: DevBuf,
    pub forced: DevBuf,
    pub scored: DevBuf,
}

impl VerifyBufs {
    pub(super) fn new(cfg: &ModelConfig, max_batch: usize) -> Result<Self> {
        let f = |n: usize| DevBuf::zeroed(n * F32);
        Ok(Self {
            logits: f(max_batch * cfg.vocab_size)?,
            parts: f(max_batch * 2 * plan::lm_head_blocks(cfg))?,
            forced: f(max_batch)?,
            scored: f(max_batch * 3)?,
        })
    }
}

/// The opened device: context, stream and what the `ready` event says about it.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<cudarc::driver::CudaStream>,
    major: i32,
    arch: String,
    sms: usize,
    name: String,
    driver: i32,
}

/// The driver and NVRTC can be loaded: checked before anything else, so their absence is the
/// error a machine without them gets.
fn libraries_present(ordinal: usize) -> Result<()> {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Load {
            message: format!(
                "device cuda:{ordinal} was asked for, but the CUDA driver library (libcuda.so) \
                 cannot be loaded; install the NVIDIA driver or use --device cpu"
            ),
        });
    }
    if !super::gemm::Lt::present() {
        return Err(Error::Load {
            message: "cuBLASLt (libcublasLt.so.13) cannot be loaded, so the GEMMs cannot run; \
                      install the CUDA 13 runtime libraries or put their directory on \
                      LD_LIBRARY_PATH"
                .into(),
        });
    }
    if !kernels::nvrtc_present() {
        return Err(Error::Load {
            message: "NVRTC (libnvrtc.so.13) cannot be loaded, so the kernels cannot be \
                      compiled; install the CUDA 13 runtime libraries or put their directory \
                      on LD_LIBRARY_PATH"
                .into(),
        });
    }
    Ok(())
}

fn open_gpu(ordinal: usize) -> Result<Gpu> {
    let ctx = CudaContext::new(ordinal).map_err(|e| Error::Load {
        message: format!("cannot open cuda:{ordinal}: {e:?}"),
    })?;
    // One stream, ordered by construction: cudarc's per-buffer event tracking is overhead.
    // SAFETY: nothing else uses this context's buffers across streams.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().map_err(driver_err("stream create"))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(driver_err("device query"))?;
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(driver_err("device query"))? as usize;
    let name = ctx.name().unwrap_or_else(|_| "unknown".into());
    let mut driver = 0;
    // SAFETY: writes one int.
    let _ = unsafe { sys::cuDriverGetVersion(&mut driver) };
    Ok(Gpu {
        ctx,
        stream,
        major,
        arch: format!("sm_{major}{minor}"),
        sms,
        name,
        driver,
    })
}

/// The switches read from the environment: the profiler, graphs and PDL, and what they turn
/// off, for `degraded`.
struct Switches {
    profiler: Option<Profiler>,
    use_graphs: bool,
    pdl: bool,
    degraded: Vec<String>,
}

fn switches(gpu: &Gpu) -> Result<Switches> {
    let mut degraded = Vec::new();
    let profile = std::env::var("ENGINE_PROFILE").ok();
    let prefill = profile.as_deref() == Some("prefill");
    let per_kernel = profile.as_deref() != Some("step");
    let profiler = match &profile {
        Some(_) if prefill => {
            degraded.push(
                "profiling: an event after every prefill kernel (ENGINE_PROFILE=prefill)".into(),
            );
            Some(Profiler::new(&gpu.ctx, true, true)?)
        }
        Some(_) if per_kernel => {
            degraded.push(
                "profiling: an event after every kernel, graphs off (ENGINE_PROFILE is set)".into(),
            );
            Some(Profiler::new(&gpu.ctx, true, false)?)
        }
        Some(_) => Some(Profiler::new(&gpu.ctx, false, false)?),
        None => None,
    };
    let kernel_profile = profiler.is_some() && per_kernel && !prefill;
    let use_graphs = std::env::var_os("ENGINE_NO_CUDA_GRAPHS").is_none() && !kernel_profile;
    if std::env::var_os("ENGINE_NO_CUDA_GRAPHS").is_some() {
        degraded.push("cuda_graphs: off (ENGINE_NO_CUDA_GRAPHS is set)".into());
    }
    let hopper = gpu.major >= 9;
    let pdl = hopper && std::env::var_os("ENGINE_NO_PDL").is_none() && !kernel_profile;
    if hopper && std::env::var_os("ENGINE_NO_PDL").is_some() {
        degraded.push("pdl: off (ENGINE_NO_PDL is set)".into());
    }
    Ok(Switches {
        profiler,
        use_graphs,
        pdl,
        degraded,
    })
}

impl CudaBackend {
    pub fn load(
        cfg: &ModelConfig,
        ckpt: &Checkpoint,
        ordinal: usize,
        block_size: usize,
        size: Option<PoolSize>,
        max_batch: usize,
        faults: &Faults,
    ) -> Result<Self> {
        libraries_present(ordinal)?;
        plan::check_model(cfg)?;
        if max_batch > plan::MAX_BATCH {
            return Err(Error::Config {
                message: format!(
                    "--max-batch {max_batch} exceeds the CUDA backend's {}; give at most {}",
                    plan::MAX_BATCH,
                    plan::MAX_BATCH
                ),
            });
        }
        let gpu = open_gpu(ordinal)?;
        let (free, total) = gpu.ctx.mem_get_info().map_err(driver_err("memory query"))?;
        let size = size.unwrap_or_else(|| {
            // Room for max_batch full contexts, within 90% of what the rest leaves free.
            let probe = kv::resolve_pool(cfg, block_size, PoolSize::Blocks(1), BF16)
                .expect("one block is a valid pool");
            let rest = plan::weight_bytes(cfg)
                + max_batch * state_slot_bytes(cfg)
                + DecodeLayout::new(cfg, &probe, max_batch).bytes()
                + PrefillLayout::new(cfg, PREFILL_CHUNK).bytes();
            PoolSize::Default {
                max_batch,
                cap_bytes: (free.saturating_sub(rest)) / 10 * 9,
            }
        });
        // One recurrent-state slot per sequence in flight (a hybrid's Mamba layers, in f32).
        let pool = kv::resolve_pool(cfg, block_size, size, BF16)?.with_state_slots(
            if cfg.hybrid.is_some() { max_batch } else { 0 },
            state_slot_bytes(cfg),
        );
        plan::check_fits(cfg, max_batch, &pool, free, total)?;

        // NVRTC compiles on threads of its own while the weights upload and cuBLASLt's GEMMs
        // are timed (none of which needs these kernels): a cold load takes the longer of the
        // two, not their sum.
        let compiling = kernels::start(&gpu.arch, gpu.driver, &kernels::fault_defines(faults));
        let lt = super::gemm::Lt::new()?;
        let gemm_workspace = DevBuf::zeroed(GEMM_WORKSPACE)?;

        let w = upload_weights(cfg, ckpt, faults)?;
        // Nemotron-H's attention has no RoPE: zero frequencies rotate by exactly nothing
        // (cos 0 = 1, sin 0 = 0), so the Llama family's kernels serve it unchanged.
        let inv = match &cfg.hybrid {
            None => crate::rope::inv_freq(&cfg.rope, cfg.head_dim),
            Some(_) => vec![0.0; cfg.head_dim / 2],
        };
        let inv_freq = DevBuf::zeroed(inv.len() * F32)?;
        inv_freq.write(0, &inv)?;
        let per_layer = pool.num_blocks * pool.block_size * cfg.kv_dim() * BF16;
        let mut k_cache = Vec::new();
        let mut v_cache = Vec::new();
        for _ in 0..cfg.kv_layers() {
            k_cache.push(DevBuf::zeroed(per_layer)?);
            v_cache.push(DevBuf::zeroed(per_layer)?);
        }
        let (mut conv_state, mut ssm_state) = (Vec::new(), Vec::new());
        if let Some(hy) = &cfg.hybrid {
            let m = &hy.mamba;
            for _ in 0..hy.count(crate::hybrid::Block::Mamba) {
                let conv = pool.state_slots * m.conv_dim() * (m.conv_kernel - 1);
                conv_state.push(DevBuf::zeroed(conv * F32)?);
                ssm_state.push(DevBuf::zeroed(
                    pool.state_slots * m.inner() * m.d_state * F32,
                )?);
            }
        }
        let dec = DecodeBufs::new(DecodeLayout::new(cfg, &pool, max_batch))?;
        let identity: Vec<i32> = (0..=max_batch as i32).collect();
        dec.row_table.write(0, &identity[..max_batch])?;
        dec.starts.write(0, &identity)?;

        let bench = GemmBench {
            ctx: &gpu.ctx,
            stream: &gpu.stream,
            lt: &lt,
            workspace: &gemm_workspace,
        };
        let (gemms, gemm_degraded) = bench.tune_gemms(
            &gemm_shapes(&w.layers, w.lm_head.as_ref().unwrap_or(&w.embed), max_batch),
            &kernels::device_key(&gpu.arch, gpu.driver),
            &gpu.name,
            gpu.sms,
        )?;
        let (module, provenance) = compiling.finish(&gpu.ctx)?;
        let f = Funcs::load(&module, cfg, gpu.sms)?;

        let mut sw = switches(&gpu)?;
        sw.degraded.extend(gemm_degraded);
        let mut backend = Self {
            host_tables: vec![0; dec.layout.tables],
            host_tokens: vec![0; max_batch],
            cfg: cfg.clone(),
            pool,
            max_batch,
            device_name: gpu.name,
            arch: gpu.arch,
            sms: gpu.sms,
            kernels: provenance,
            tuning: Default::default(),
            paths: Default::default(),
            degraded: sw.degraded,
            use_graphs: sw.use_graphs,
            pdl: sw.pdl,
            profiler: sw.profiler,
            graphs: (0..max_batch).map(|_| None).collect(),
            rows: Vec::new(),
            dec,
            pf: None,
            verify: None,
            faults: faults.clone(),
            layers: w.layers,
            embed: w.embed,
            norm: w.norm,
            lm_head: w.lm_head,
            inv_freq,
            k_cache,
            v_cache,
            conv_state,
            ssm_state,
            f,
            gemms,
            gemm_workspace,
            lt,
            _module: module,
            stream: gpu.stream,
            ctx: gpu.ctx,
        };
        let pinned = tune::PinnedFile::from_env()?;
        backend.tune_gemvs(pinned.as_ref())?;
        backend.choose_paths(pinned.as_ref())?;
        backend.capture_or_degrade();
        backend.sync()?;
        Ok(backend)
    }

    /// Captures every batch size now, so `ready` tells the truth about graphs; a failed capture
    /// retries without PDL, then falls back to direct launches, each said in `degraded`.
    fn capture_or_degrade(&mut self) {
        if !self.use_graphs {
            return;
        }
        if let Err(e) = self.capture_all() {
            if self.pdl {
                // Programmatic edges are the newer part of capture: drop them first.
                self.pdl = false;
                self.degraded.push(format!(
                    "pdl: graph capture with programmatic dependent launch failed, so it is off: {e}"
                ));
            }
            if let Err(e) = self.capture_all() {
                self.use_graphs = false;
                self.graphs.iter_mut().for_each(|g| *g = None);
                self.degraded.push(format!(
                    "cuda_graphs: capture failed, launching directly: {e}"
                ));
            }
        }
    }
}

/// A tensor-core attention kernel (`name`, if the model has one), allowed the shared memory it
/// stages K/V in: more than the 48 KiB a block gets without asking (Hopper has 227 KiB).
pub(super) fn staged_attention_function(
    module: &Kernels,
    name: Option<String>,
    smem_bytes: u32,
) -> Result<Option<CudaFunction>> {
    name.map(|name| staged_function(module, &name, smem_bytes))
        .transpose()
}

/// Kernel `name`, allowed `smem_bytes` of dynamic shared memory: more than the 48 KiB a block
/// gets without asking (Hopper has 227 KiB).
pub(super) fn staged_function(
    module: &Kernels,
    name: &str,
    smem_bytes: u32,
) -> Result<CudaFunction> {
    with_smem(kernels::function(module, name)?, smem_bytes)
}

/// `f`, allowed `smem_bytes` of dynamic shared memory.
pub(super) fn with_smem(f: CudaFunction, smem_bytes: u32) -> Result<CudaFunction> {
    f.set_attribute(
        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem_bytes as i32,
    )
    .map_err(driver_err("a staged kernel's shared memory"))?;
    Ok(f)
}

/// `mamba_ssm_step_staged` for `m`'s heads, its shared memory granted, and its persistent grid:
/// the blocks resident on `sms` multiprocessors at once.
pub(super) fn mamba_step_function(
    module: &Kernels,
    m: &crate::hybrid::Mamba,
    sms: usize,
) -> Result<(CudaFunction, usize)> {
    let smem = plan::mamba_step_smem_bytes(m);
    let f = staged_function(module, "mamba_ssm_step_staged", smem)?;
    let threads = plan::mamba_ssm_threads(m, false);
    let per_sm = f
        .occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)
        .map_err(driver_err("occupancy query"))? as usize;
    if per_sm == 0 {
        return Err(Error::Load {
            message: format!(
                "the CUDA Mamba decode step does not fit a multiprocessor of this GPU at {threads} \
                 threads and {smem} bytes of shared memory a block (mamba_head_dim = {}, \
                 ssm_state_size = {}); use --device cpu",
                m.head_dim, m.d_state
            ),
        });
    }
    Ok((f, per_sm * sms))
}

impl Funcs {
    fn load(module: &Kernels, cfg: &ModelConfig, sms: usize) -> Result<Self> {
        let k = |n: &str| kernels::function(module, n);
        let logits = |m: GemvMode| {
            (1..=plan::MAX_GEMV_BATCH)
                .map(|b| k(&m.logits_kernel(b)))
                .collect::<Result<Vec<_>>>()
        };
        let mut gemv = Vec::new();
        let mut resident = Vec::new();
        for mode in GemvMode::ALL {
            let fs = (1..=plan::MAX_GEMV_BATCH)
                .map(|b| k(&mode.kernel(b)))
                .collect::<Result<Vec<_>>>()?;
            resident.push(
                fs.iter()
                    .map(|f| {
                        f.occupancy_max_active_blocks_per_multiprocessor(GEMV_THREADS, 0, None)
                            .map(|n| n as usize * sms)
                            .map_err(driver_err("occupancy query"))
                    })
                    .collect::<Result<Vec<_>>>()?,
            );
            gemv.push(fs);
        }
        let (mamba_ssm_step_staged, mamba_step_blocks) = match &cfg.hybrid {
            Some(hy) => mamba_step_function(module, &hy.mamba, sms)?,
            None => (k("mamba_ssm_step_staged")?, 0),
        };
        Ok(Self {
            embed: k("embed_gather")?,
            rmsnorm: k("rmsnorm")?,
            rope_kv: k("rope_kv")?,
            attention: k(&plan::attention_kernel(cfg))?,
            attention_prefill: staged_attention_function(
                module,
                plan::attention_prefill_kernel(cfg),
                plan::attention_prefill_smem_bytes(cfg.head_dim),
            )?,
            attention_batch: staged_attention_function(
                module,
                plan::attention_batch_kernel(cfg),
                plan::attention_batch_smem_bytes(cfg),
            )?,
            swiglu: k("swiglu")?,
            argmax_final: k("argmax_final")?,
            argmax_rows: k("argmax_rows")?,
            lm_head_logits: [logits(GemvMode::LmHead)?, logits(GemvMode::LmHeadMma)?],
            score: k("score_forced")?,
            mamba_conv: k("mamba_conv")?,
            mamba_ssm: k("mamba_ssm")?,
            mamba_ssm_step: k("mamba_ssm_step")?,
            mamba_ssm_step_staged,
            mamba_step_blocks,
            mamba_ssd: staged_function(module, "mamba_ssd", plan::mamba_ssd_smem_bytes())?,
            mamba_gated_norm: k("mamba_gated_norm")?,
            relu2: k("relu2")?,
            gemv,
            resident,
        })
    }
}

impl DecodeBufs {
    fn new(layout: DecodeLayout) -> Result<Self> {
        let b = |n: usize| DevBuf::zeroed(n * F32);
        Ok(Self {
            tokens: b(layout.max_batch)?,
            positions: b(layout.max_batch)?,
            row_table: b(layout.max_batch)?,
            tables: b(layout.tables)?,
            x: b(layout.x)?,
            xn: b(layout.x)?,
            qkv: b(layout.qkv)?,
            attn: b(layout.attn)?,
            act: b(layout.act)?,
            parts: b(layout.parts)?,
            part_o: b(layout.part_o)?,
            part_ml: b(layout.part_ml)?,
            counts: b(layout.counts)?,
            slots: b(layout.max_batch)?,
            starts: b(layout.max_batch + 1)?,
            zxbcdt: b(layout.zxbcdt.max(1))?,
            xbc: b(layout.xbc.max(1))?,
            ssm_y: b(layout.ssm_y.max(1))?,
            gated: b(layout.gated.max(1))?,
            xn_bf16: DevBuf::zeroed(layout.xn_bf16 * BF16)?,
            act_bf16: DevBuf::zeroed(layout.act_bf16 * BF16)?,
            attn_bf16: DevBuf::zeroed(layout.attn_bf16 * BF16)?,
            gated_bf16: DevBuf::zeroed(layout.gated_bf16 * BF16)?,
            up: DevBuf::zeroed(layout.up * BF16)?,
            logits: b(layout.logits)?,
            layout,
        })
    }
}

impl PrefillBufs {
    pub(super) fn new(
        cfg: &ModelConfig,
        layout: PrefillLayout,
        max_blocks: usize,
        seqs: usize,
    ) -> Result<Self> {
        let f = |n: usize| DevBuf::zeroed(n * F32);
        let h = |n: usize| DevBuf::zeroed(n * BF16);
        Ok(Self {
            tokens: f(layout.rows)?,
            positions: f(layout.rows)?,
            row_table: f(layout.rows)?,
            tables: f(seqs * max_blocks)?,
            x: f(layout.x)?,
            xn_bf16: h(layout.xn_bf16)?,
            qkv: f(layout.qkv)?,
            attn_bf16: h(layout.attn_bf16)?,
            gate_up: h(layout.gate_up)?,
            act_bf16: h(layout.act_bf16)?,
            tiles: f(layout.tiles)?,
            slots: f(seqs)?,
            starts: f(seqs + 1)?,
            zxbcdt: f(layout.zxbcdt.max(1))?,
            xbc: f(layout.xbc.max(1))?,
            ssm_y: f(layout.ssm_y.max(1))?,
            gated_bf16: h(layout.gated_bf16.max(1))?,
            last_xn: f(seqs * cfg.hidden_size)?,
            parts: f(seqs.min(plan::MAX_GEMV_BATCH) * 2 * plan::lm_head_blocks(cfg))?,
            tokens_out: f(seqs)?,
            layout,
        })
    }
}

fn bf16_bytes<'a>(view: &crate::weights::TensorView<'a>) -> std::borrow::Cow<'a, [u8]> {
    match view.dtype {
        DType::BF16 => std::borrow::Cow::Borrowed(view.bytes),
        _ => std::borrow::Cow::Owned(
            view.to_f32()
                .into_iter()
                .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
        ),
    }
}

/// How a checkpoint tensor lands on the device.
#[derive(Clone, Copy)]
enum Upload {
    Bf16,
    F32,
    /// A = -exp(A_log), in f32 as transformers and vLLM compute it.
    NegExpF32,
}

/// The tensors to upload: (name, destination, byte offset in it, how).
type Plan<'a> = Vec<(String, &'a DevBuf, usize, Upload)>;

/// Uploads every tensor (bf16, except the Mamba mixer's per-head constants in f32), shard by
/// shard, releasing each shard's pages once uploaded so that host memory holds about one shard at
/// a time; plants the weight faults (`drop_bias`: no q/k/v biases; `norm_skip`: one layer's input
/// norm weight all ones).
fn upload_weights(cfg: &ModelConfig, ckpt: &Checkpoint, faults: &Faults) -> Result<Weights> {
    let h = cfg.hidden_size;
    let z = |elems: usize| DevBuf::zeroed(elems * BF16);
    let embed = Matrix::zeroed(cfg.vocab_size, h)?;
    let norm = z(h)?;
    let lm_head = if cfg.tie_word_embeddings {
        None
    } else {
        Some(Matrix::zeroed(cfg.vocab_size, h)?)
    };
    let layers = match &cfg.hybrid {
        None => llama_sublayers(cfg, faults)?,
        Some(hy) => hybrid_sublayers(cfg, hy)?,
    };
    let (embed_name, norm_name) = if cfg.hybrid.is_some() {
        ("model.embeddings.weight", "model.norm_f.weight")
    } else {
        ("model.embed_tokens.weight", "model.norm.weight")
    };
    let mut plan: Plan = vec![
        (embed_name.into(), &embed.buf, 0, Upload::Bf16),
        (norm_name.into(), &norm, 0, Upload::Bf16),
    ];
    if let Some(head) = &lm_head {
        plan.push(("lm_head.weight".into(), &head.buf, 0, Upload::Bf16));
    }
    if cfg.hybrid.is_some() {
        hybrid_plan(cfg, &layers, &mut plan);
    } else {
        llama_plan(cfg, &layers, &mut plan);
    }
    plan.sort_by_key(|(name, ..)| ckpt.shard_of(name));
    let mut current: Option<usize> = None;
    for (name, dst, offset, how) in &plan {
        let shard = ckpt.shard_of(name);
        if let Some(prev) = current.filter(|&p| Some(p) != shard) {
            ckpt.release_shard(prev);
        }
        current = shard;
        let view = ckpt.get(name)?;
        match how {
            Upload::Bf16 => dst.write_bytes(*offset, &bf16_bytes(&view))?,
            Upload::F32 => dst.write(*offset / F32, &view.to_f32())?,
            Upload::NegExpF32 => {
                let a: Vec<f32> = view.to_f32().iter().map(|v| -v.exp()).collect();
                dst.write(*offset / F32, &a)?
            }
        }
    }
    if let Some(s) = current {
        ckpt.release_shard(s);
    }
    if let Some(l) = faults.skipped_norm_layer(cfg) {
        // A Llama layer's input norm is its first sublayer's; a hybrid block is one sublayer.
        let sub = if cfg.hybrid.is_some() { l } else { 2 * l };
        let one = half::bf16::ONE.to_bits();
        layers[sub].norm.write(0, &vec![one; h])?;
    }
    Ok(Weights {
        embed,
        layers,
        norm,
        lm_head,
    })
}

/// A Llama-family layer as two sublayers, zeroed: attention, then the SwiGLU MLP.
fn llama_sublayers(cfg: &ModelConfig, faults: &Faults) -> Result<Vec<Sublayer>> {
    let (h, q, kv, i) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
    );
    let z = |elems: usize| DevBuf::zeroed(elems * BF16);
    let opt = |on: bool, elems: usize| on.then(|| z(elems)).transpose();
    let mut subs = Vec::new();
    for l in 0..cfg.num_layers {
        subs.push(Sublayer {
            norm: z(h)?,
            mixer: Mixer::Attention(AttentionWeights {
                qkv: Matrix::zeroed(q + 2 * kv, h)?,
                qkv_bias: opt(cfg.qkv_bias && !faults.has(Fault::DropBias), q + 2 * kv)?,
                q_norm: opt(cfg.qk_norm, cfg.head_dim)?,
                k_norm: opt(cfg.qk_norm, cfg.head_dim)?,
                o: Matrix::zeroed(h, q)?,
                cache: l,
            }),
        });
        subs.push(Sublayer {
            norm: z(h)?,
            mixer: Mixer::Mlp(MlpWeights {
                up: Matrix::zeroed_act(2 * i, h)?,
                down: Matrix::zeroed(h, i)?,
                swiglu: true,
            }),
        });
    }
    Ok(subs)
}

fn llama_plan<'a>(cfg: &ModelConfig, subs: &'a [Sublayer], plan: &mut Plan<'a>) {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    for (l, pair) in subs.chunks_exact(2).enumerate() {
        let p = format!("model.layers.{l}");
        let (Mixer::Attention(a), Mixer::Mlp(m)) = (&pair[0].mixer, &pair[1].mixer) else {
            unreachable!("llama_sublayers pairs attention with an MLP");
        };
        attention_plan(cfg, &format!("{p}.self_attn"), a, plan);
        let mut bf16 = |name: String, dst: &'a DevBuf, off: usize| {
            plan.push((name, dst, off, Upload::Bf16));
        };
        bf16(format!("{p}.input_layernorm.weight"), &pair[0].norm, 0);
        bf16(
            format!("{p}.post_attention_layernorm.weight"),
            &pair[1].norm,
            0,
        );
        bf16(format!("{p}.mlp.gate_proj.weight"), &m.up.buf, 0);
        bf16(format!("{p}.mlp.up_proj.weight"), &m.up.buf, i * h * BF16);
        bf16(format!("{p}.mlp.down_proj.weight"), &m.down.buf, 0);
    }
}

/// An attention mixer's tensors under `prefix` (`...self_attn` in the Llama family, `...mixer` in
/// Nemotron-H): q, k and v stacked into one matrix, their biases and norms where it has them, o.
fn attention_plan<'a>(
    cfg: &ModelConfig,
    prefix: &str,
    a: &'a AttentionWeights,
    plan: &mut Plan<'a>,
) {
    let (h, q, kv) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim());
    let mut bf16 = |name: String, dst: &'a DevBuf, off: usize| {
        plan.push((name, dst, off, Upload::Bf16));
    };
    for (name, off) in [("q_proj", 0), ("k_proj", q), ("v_proj", q + kv)] {
        bf16(
            format!("{prefix}.{name}.weight"),
            &a.qkv.buf,
            off * h * BF16,
        );
        if let Some(b) = &a.qkv_bias {
            bf16(format!("{prefix}.{name}.bias"), b, off * BF16);
        }
    }
    if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
        bf16(format!("{prefix}.q_norm.weight"), qn, 0);
        bf16(format!("{prefix}.k_norm.weight"), kn, 0);
    }
    bf16(format!("{prefix}.o_proj.weight"), &a.o.buf, 0);
}

/// A Nemotron-H block per sublayer, zeroed.
fn hybrid_sublayers(cfg: &ModelConfig, hy: &crate::hybrid::Hybrid) -> Result<Vec<Sublayer>> {
    use crate::hybrid::Block;
    let (h, m) = (cfg.hidden_size, &hy.mamba);
    let z = |elems: usize| DevBuf::zeroed(elems * BF16);
    let f = |elems: usize| DevBuf::zeroed(elems * F32);
    let (mut caches, mut states) = (0, 0);
    let mut subs = Vec::new();
    for block in &hy.blocks {
        let mixer = match block {
            Block::Attention => {
                caches += 1;
                Mixer::Attention(AttentionWeights {
                    qkv: Matrix::zeroed(cfg.q_dim() + 2 * cfg.kv_dim(), h)?,
                    qkv_bias: None,
                    q_norm: None,
                    k_norm: None,
                    o: Matrix::zeroed(h, cfg.q_dim())?,
                    cache: caches - 1,
                })
            }
            Block::Mlp => Mixer::Mlp(MlpWeights {
                up: Matrix::zeroed_act(cfg.intermediate_size, h)?,
                down: Matrix::zeroed(h, cfg.intermediate_size)?,
                swiglu: false,
            }),
            Block::Mamba => {
                states += 1;
                Mixer::Mamba(MambaWeights {
                    in_proj: Matrix::zeroed(m.in_proj_dim(), h)?,
                    out_proj: Matrix::zeroed(h, m.inner())?,
                    conv_w: z(m.conv_dim() * m.conv_kernel)?,
                    conv_b: m.conv_bias.then(|| z(m.conv_dim())).transpose()?,
                    dt_bias: f(m.num_heads)?,
                    a: f(m.num_heads)?,
                    d: f(m.num_heads)?,
                    gate_norm: z(m.inner())?,
                    state: states - 1,
                })
            }
        };
        subs.push(Sublayer { norm: z(h)?, mixer });
    }
    Ok(subs)
}

fn hybrid_plan<'a>(cfg: &ModelConfig, subs: &'a [Sublayer], plan: &mut Plan<'a>) {
    for (l, sub) in subs.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let x = format!("{p}.mixer");
        let mut add = |name: String, dst: &'a DevBuf, off: usize, how: Upload| {
            plan.push((name, dst, off, how));
        };
        add(format!("{p}.norm.weight"), &sub.norm, 0, Upload::Bf16);
        match &sub.mixer {
            Mixer::Attention(a) => attention_plan(cfg, &x, a, plan),
            Mixer::Mlp(m) => {
                add(format!("{x}.up_proj.weight"), &m.up.buf, 0, Upload::Bf16);
                add(
                    format!("{x}.down_proj.weight"),
                    &m.down.buf,
                    0,
                    Upload::Bf16,
                );
            }
            Mixer::Mamba(m) => {
                add(
                    format!("{x}.in_proj.weight"),
                    &m.in_proj.buf,
                    0,
                    Upload::Bf16,
                );
                add(
                    format!("{x}.out_proj.weight"),
                    &m.out_proj.buf,
                    0,
                    Upload::Bf16,
                );
                add(format!("{x}.conv1d.weight"), &m.conv_w, 0, Upload::Bf16);
                if let Some(b) = &m.conv_b {
                    add(format!("{x}.conv1d.bias"), b, 0, Upload::Bf16);
                }
                add(format!("{x}.dt_bias"), &m.dt_bias, 0, Upload::F32);
                add(format!("{x}.A_log"), &m.a, 0, Upload::NegExpF32);
                add(format!("{x}.D"), &m.d, 0, Upload::F32);
                add(format!("{x}.norm.weight"), &m.gate_norm, 0, Upload::Bf16);
            }
        }
    }
}
