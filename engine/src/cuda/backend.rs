//! The CUDA backend: bf16 weights uploaded straight from the mapped safetensors, a bf16 paged
//! KV cache, NVRTC-compiled kernels (engine/kernels), cuBLAS GEMMs for prefill, and decode
//! steps captured once per batch size into CUDA graphs and replayed. Everything a step changes
//! (tokens, positions) lives on the device and is advanced by the step itself, so a step is one
//! graph launch plus the read of the chosen tokens.

use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaGraph, CudaModule, CudaStream};

use super::device::{driver_err, ptr_or_null, DevBuf};
use super::kernels;
use super::plan::{self, DecodeLayout, PrefillLayout, ATT_THREADS, GEMV_THREADS, PREFILL_CHUNK};
use crate::backend::{Backend, DecodeItem};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kv::{self, BlockTable, PoolShape, PoolSize};
use crate::launch;
use crate::weights::{Checkpoint, DType};

const BF16: usize = 2;
const F32: usize = 4;

struct LayerWeights {
    input_norm: DevBuf,
    post_norm: DevBuf,
    /// q, k and v stacked: [q_dim + 2 kv_dim, hidden].
    qkv: DevBuf,
    qkv_bias: Option<DevBuf>,
    q_norm: Option<DevBuf>,
    k_norm: Option<DevBuf>,
    o: DevBuf,
    /// gate and up stacked: [2 intermediate, hidden].
    gate_up: DevBuf,
    down: DevBuf,
}

struct Funcs {
    embed: CudaFunction,
    rmsnorm: CudaFunction,
    rope_kv: CudaFunction,
    attention: CudaFunction,
    swiglu: CudaFunction,
    argmax_final: CudaFunction,
    /// gemv[mode][batch - 1] for the modes in [`plan::GEMV_MODES`] (empty for the others); mode
    /// 6 is gate/up's 4 summing a row's two slices in one warp, 7 the residual 1 on the tensor
    /// cores (plan.rs gemv_launch).
    gemv: Vec<Vec<CudaFunction>>,
    /// Blocks of each GEMV resident on the whole GPU at once, the streaming modes' persistent
    /// grid: resident[mode][batch - 1].
    resident: Vec<Vec<usize>>,
}

struct DecodeBufs {
    layout: DecodeLayout,
    tokens: DevBuf,
    positions: DevBuf,
    row_table: DevBuf,
    tables: DevBuf,
    x: DevBuf,
    xn: DevBuf,
    qkv: DevBuf,
    attn: DevBuf,
    act: DevBuf,
    parts: DevBuf,
    part_o: DevBuf,
    part_ml: DevBuf,
    counts: DevBuf,
}

struct PrefillBufs {
    layout: PrefillLayout,
    tokens: DevBuf,
    positions: DevBuf,
    /// All zeros: every prefill row uses table 0.
    row_table: DevBuf,
    table: DevBuf,
    x: DevBuf,
    xn_bf16: DevBuf,
    qkv: DevBuf,
    attn_bf16: DevBuf,
    gate_up: DevBuf,
    act_bf16: DevBuf,
    part_o: DevBuf,
    part_ml: DevBuf,
    counts: DevBuf,
    /// The last row, normalised, its argmax candidates and its token.
    last_xn: DevBuf,
    parts: DevBuf,
    token: DevBuf,
}

/// What the device holds for the running batch, to skip re-uploading it.
#[derive(Clone, PartialEq)]
struct RowState {
    first_block: u32,
    position: usize,
    token: u32,
}

pub struct CudaBackend {
    cfg: ModelConfig,
    pool: PoolShape,
    max_batch: usize,
    device_name: String,
    arch: String,
    sms: usize,
    kernels: kernels::Provenance,
    degraded: Vec<String>,
    use_graphs: bool,
    /// Programmatic dependent launch (device.rs `launch`): Hopper and later.
    pdl: bool,
    profiler: Option<Profiler>,
    // Field order is drop order: graphs and buffers go before the module, stream and context.
    graphs: Vec<Option<CudaGraph>>,
    rows: Vec<RowState>,
    host_tables: Vec<i32>,
    host_tokens: Vec<i32>,
    dec: DecodeBufs,
    pf: Option<PrefillBufs>,
    layers: Vec<LayerWeights>,
    embed: DevBuf,
    norm: DevBuf,
    lm_head: Option<DevBuf>,
    inv_freq: DevBuf,
    k_cache: Vec<DevBuf>,
    v_cache: Vec<DevBuf>,
    f: Funcs,
    blas: CudaBlas,
    _module: Arc<CudaModule>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

/// Parses `cuda`, `cuda:N`.
pub fn ordinal(device: &str) -> Option<usize> {
    match device {
        "cuda" => Some(0),
        d => d.strip_prefix("cuda:").and_then(|n| n.parse().ok()),
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

impl CudaBackend {
    pub fn load(
        cfg: &ModelConfig,
        ckpt: &Checkpoint,
        device: &str,
        block_size: usize,
        size: Option<PoolSize>,
        max_batch: usize,
    ) -> Result<Self> {
        let ord = ordinal(device).ok_or_else(|| Error::Config {
            message: format!("device {device:?} is not cpu, cuda or cuda:N"),
        })?;
        // SAFETY: only tries to dlopen the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Load {
                message: format!(
                    "device {device} was asked for, but the CUDA driver library (libcuda.so) \
                     cannot be loaded; install the NVIDIA driver or use --device cpu"
                ),
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
        plan::check_model(cfg)?;
        if max_batch > plan::MAX_GEMV_BATCH {
            return Err(Error::Config {
                message: format!(
                    "--max-batch {max_batch} exceeds the CUDA backend's {}",
                    plan::MAX_GEMV_BATCH
                ),
            });
        }
        let ctx = CudaContext::new(ord).map_err(|e| Error::Load {
            message: format!("cannot open {device}: {e:?}"),
        })?;
        // One stream, ordered by construction: cudarc's per-buffer event tracking is overhead.
        // SAFETY: nothing else uses this context's buffers across streams.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err("stream create"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_err("device query"))?;
        let arch = format!("sm_{major}{minor}");
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err("device query"))? as usize;
        let device_name = ctx.name().unwrap_or_else(|_| "unknown".into());
        let mut driver = 0;
        // SAFETY: writes one int.
        let _ = unsafe { sys::cuDriverGetVersion(&mut driver) };

        let (free, total) = ctx.mem_get_info().map_err(driver_err("memory query"))?;
        let size = size.unwrap_or_else(|| {
            // Room for max_batch full contexts, within 90% of what the rest leaves free.
            let probe = kv::resolve_pool(cfg, block_size, PoolSize::Blocks(1), BF16)
                .expect("one block is a valid pool");
            let rest = plan::weight_bytes(cfg)
                + DecodeLayout::new(cfg, &probe, max_batch).bytes()
                + PrefillLayout::new(cfg, PREFILL_CHUNK).bytes();
            PoolSize::Default {
                max_batch,
                cap_bytes: (free.saturating_sub(rest)) / 10 * 9,
            }
        });
        let pool = kv::resolve_pool(cfg, block_size, size, BF16)?;
        plan::check_fits(cfg, max_batch, &pool, free, total)?;

        let (module, provenance) = kernels::load(&ctx, &arch, driver)?;
        let f = Funcs::load(&module, cfg, sms)?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| Error::Load {
            message: format!("cuBLAS (libcublas.so.13) could not start: {e:?}"),
        })?;

        let (embed, layers, norm, lm_head) = upload_weights(cfg, ckpt)?;
        let inv = crate::rope::inv_freq(&cfg.rope, cfg.head_dim);
        let inv_freq = DevBuf::zeroed(inv.len() * F32)?;
        inv_freq.write(0, &inv)?;
        let per_layer = pool.num_blocks * pool.block_size * cfg.kv_dim() * BF16;
        let mut k_cache = Vec::new();
        let mut v_cache = Vec::new();
        for _ in 0..cfg.num_layers {
            k_cache.push(DevBuf::zeroed(per_layer)?);
            v_cache.push(DevBuf::zeroed(per_layer)?);
        }
        let dec = DecodeBufs::new(DecodeLayout::new(cfg, &pool, max_batch))?;
        let identity: Vec<i32> = (0..max_batch as i32).collect();
        dec.row_table.write(0, &identity)?;

        let mut degraded = Vec::new();
        let profile = std::env::var("ENGINE_PROFILE").ok();
        let per_kernel = profile.as_deref() != Some("step");
        let profiler = match &profile {
            Some(_) if per_kernel => {
                degraded.push(
                    "profiling: an event after every kernel, graphs off (ENGINE_PROFILE is set)"
                        .into(),
                );
                Some(Profiler::new(&ctx, true)?)
            }
            Some(_) => Some(Profiler::new(&ctx, false)?),
            None => None,
        };
        let kernel_profile = profiler.is_some() && per_kernel;
        let use_graphs = std::env::var_os("ENGINE_NO_CUDA_GRAPHS").is_none() && !kernel_profile;
        if std::env::var_os("ENGINE_NO_CUDA_GRAPHS").is_some() {
            degraded.push("cuda_graphs: off (ENGINE_NO_CUDA_GRAPHS is set)".into());
        }
        let pdl = major >= 9 && std::env::var_os("ENGINE_NO_PDL").is_none() && !kernel_profile;
        if major >= 9 && std::env::var_os("ENGINE_NO_PDL").is_some() {
            degraded.push("pdl: off (ENGINE_NO_PDL is set)".into());
        }
        let mut backend = Self {
            host_tables: vec![0; dec.layout.tables],
            host_tokens: vec![0; max_batch],
            cfg: cfg.clone(),
            pool,
            max_batch,
            device_name,
            arch,
            sms,
            kernels: provenance,
            degraded,
            use_graphs,
            pdl,
            profiler,
            graphs: (0..max_batch).map(|_| None).collect(),
            rows: Vec::new(),
            dec,
            pf: None,
            layers,
            embed,
            norm,
            lm_head,
            inv_freq,
            k_cache,
            v_cache,
            f,
            blas,
            _module: module,
            stream,
            ctx,
        };
        // Capture every batch size now, so `ready` tells the truth about graphs.
        if backend.use_graphs {
            if let Err(e) = backend.capture_all() {
                if backend.pdl {
                    // Programmatic edges are the newer part of capture: drop them first.
                    backend.pdl = false;
                    backend.degraded.push(format!(
                        "pdl: graph capture with programmatic dependent launch failed, so it is off: {e}"
                    ));
                }
                if let Err(e) = backend.capture_all() {
                    backend.use_graphs = false;
                    backend.graphs.iter_mut().for_each(|g| *g = None);
                    backend.degraded.push(format!(
                        "cuda_graphs: capture failed, launching directly: {e}"
                    ));
                }
            }
        }
        backend.sync()?;
        Ok(backend)
    }

    fn qkv_width(&self) -> usize {
        self.cfg.q_dim() + 2 * self.cfg.kv_dim()
    }

    fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_err("synchronize"))
    }

    /// RMSNorm of `rows` rows of `x` into f32 and/or bf16 outputs (0 = not written).
    fn rmsnorm(&self, x: u64, w: &DevBuf, rows: usize, out_f32: u64, out_bf16: u64) -> Result<()> {
        let c = &self.cfg;
        launch!(&self.f.rmsnorm, &self.stream, self.pdl, (rows as u32, 1, 1), 256, 0;
            x, w.ptr, c.rms_norm_eps, c.hidden_size as i32, out_f32, out_bf16)?;
        self.mark("rmsnorm", 0)
    }

    /// With ENGINE_PROFILE=1: an event after the kernel just launched, timed after the step.
    fn mark(&self, name: &'static str, bytes: usize) -> Result<()> {
        match &self.profiler {
            Some(p) if p.per_kernel => p.mark(name, bytes, &self.stream),
            _ => Ok(()),
        }
    }

    /// A decode GEMV (gemv.cu) over `rows` outputs of `cols` inputs for `batch` sequences;
    /// `gamma` is the RMSNorm gain for the modes that normalise their input, `parts` the
    /// argmax candidates of mode 5.
    #[allow(clippy::too_many_arguments)]
    fn gemv(
        &self,
        name: &'static str,
        mode: usize,
        batch: usize,
        w: u64,
        x: u64,
        y: u64,
        rows: usize,
        cols: usize,
        gamma: u64,
        parts: u64,
    ) -> Result<()> {
        let (ksplit, grid, kernel) = if mode == 5 {
            let k = plan::lm_head_ksplit(rows, cols);
            (k, plan::gemv_blocks(rows, k), mode)
        } else {
            let l = plan::gemv_launch(rows, cols, mode, batch);
            let resident = self.f.resident[l.mode][batch - 1];
            (
                l.ksplit,
                plan::gemv_grid(l.units, l.ksplit, resident),
                l.mode,
            )
        };
        launch!(&self.f.gemv[kernel][batch - 1], &self.stream, self.pdl,
            (grid, 1, 1), GEMV_THREADS, 0;
            w, x, y, rows as i32, cols as i32, cols as i32, rows as i32, ksplit as i32, gamma,
            self.cfg.rms_norm_eps, parts)?;
        let weight_rows = if mode == 4 { 2 * rows } else { rows };
        self.mark(name, weight_rows * cols * BF16)
    }

    /// The lm_head over the normalised rows `xn` (mode 5) and the final argmax into `tokens`,
    /// advancing `positions` when given.
    fn lm_head_argmax(
        &self,
        batch: usize,
        xn: u64,
        parts: u64,
        tokens: u64,
        positions: u64,
    ) -> Result<()> {
        let c = &self.cfg;
        self.gemv(
            "gemv_lm_head",
            5,
            batch,
            self.lm_head_ptr(),
            xn,
            0,
            c.vocab_size,
            c.hidden_size,
            0,
            parts,
        )?;
        launch!(&self.f.argmax_final, &self.stream, self.pdl, (batch as u32, 1, 1), 1024, 0;
            parts, plan::lm_head_blocks(c) as i32, tokens, positions, (positions != 0) as i32)?;
        self.mark("argmax_final", 0)
    }

    /// Bias, q/k norm, RoPE and the paged K/V write for `rows` rows of `qkv` (prefill).
    #[allow(clippy::too_many_arguments)]
    fn rope_kv(
        &self,
        layer: usize,
        qkv: u64,
        rows: usize,
        positions: u64,
        row_table: u64,
        tables: u64,
        max_blocks: usize,
    ) -> Result<()> {
        let c = &self.cfg;
        let l = &self.layers[layer];
        launch!(&self.f.rope_kv, &self.stream, self.pdl, (rows as u32, 1, 1), 256, 0;
            qkv, ptr_or_null(&l.qkv_bias), ptr_or_null(&l.q_norm), ptr_or_null(&l.k_norm), c.rms_norm_eps,
            self.inv_freq.ptr, positions, row_table, tables, max_blocks as i32,
            self.k_cache[layer].ptr, self.v_cache[layer].ptr, c.num_heads as i32,
            c.num_kv_heads as i32, c.head_dim as i32, self.pool.block_size as i32)?;
        self.mark("rope_kv", 0)
    }

    /// Attention of `rows` rows of `qkv` over the paged cache into `out_f32`/`out_bf16`. With
    /// `rope` (decode), the kernel also does what `rope_kv` does for prefill: bias, q/k norm,
    /// rotation, and the new position's K/V write.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        layer: usize,
        qkv: u64,
        rows: usize,
        splits: usize,
        positions: u64,
        row_table: u64,
        tables: u64,
        max_blocks: usize,
        part_o: u64,
        part_ml: u64,
        counts: u64,
        out_f32: u64,
        out_bf16: u64,
        rope: bool,
    ) -> Result<()> {
        let c = &self.cfg;
        let l = &self.layers[layer];
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        launch!(&self.f.attention, &self.stream, self.pdl,
            (rows as u32, c.num_kv_heads as u32, splits as u32), ATT_THREADS,
            plan::attention_smem_bytes(c);
            qkv, self.qkv_width() as i32, self.k_cache[layer].ptr, self.v_cache[layer].ptr,
            positions, row_table, tables, max_blocks as i32, c.num_heads as i32,
            c.num_kv_heads as i32, c.head_dim as i32, self.pool.block_size as i32, scale,
            part_o, part_ml, counts, out_f32, out_bf16, ptr_or_null(&l.qkv_bias), ptr_or_null(&l.q_norm),
            ptr_or_null(&l.k_norm), c.rms_norm_eps, if rope { self.inv_freq.ptr } else { 0 })?;
        self.mark("attention", 0)
    }

    fn lm_head_ptr(&self) -> u64 {
        self.lm_head.as_ref().unwrap_or(&self.embed).ptr
    }

    /// One decode step for the first `batch` rows of the decode buffers: every kernel of the
    /// step, in order. Captured into a graph once per batch size.
    fn step_kernels(&self, batch: usize) -> Result<()> {
        let c = &self.cfg;
        let d = &self.dec;
        let (h, q, i) = (c.hidden_size, c.q_dim(), c.intermediate_size);
        let splits = plan::MAX_SPLITS;
        launch!(&self.f.embed, &self.stream, self.pdl, (batch as u32, 1, 1), 256, 0;
            self.embed.ptr, d.tokens.ptr, d.x.ptr, h as i32)?;
        self.mark("embed", 0)?;
        for (li, l) in self.layers.iter().enumerate() {
            // RMSNorm is folded into the GEMVs that read the residual stream (modes 3 and 4).
            let qkv = self.qkv_width();
            self.gemv(
                "gemv_qkv",
                3,
                batch,
                l.qkv.ptr,
                d.x.ptr,
                d.qkv.ptr,
                qkv,
                h,
                l.input_norm.ptr,
                0,
            )?;
            self.attention(
                li,
                d.qkv.ptr,
                batch,
                splits,
                d.positions.ptr,
                d.row_table.ptr,
                d.tables.ptr,
                d.layout.max_blocks,
                d.part_o.ptr,
                d.part_ml.ptr,
                d.counts.ptr,
                d.attn.ptr,
                0,
                true,
            )?;
            self.gemv("gemv_o", 1, batch, l.o.ptr, d.attn.ptr, d.x.ptr, h, q, 0, 0)?;
            self.gemv(
                "gemv_gate_up",
                4,
                batch,
                l.gate_up.ptr,
                d.x.ptr,
                d.act.ptr,
                i,
                h,
                l.post_norm.ptr,
                0,
            )?;
            self.gemv(
                "gemv_down",
                1,
                batch,
                l.down.ptr,
                d.act.ptr,
                d.x.ptr,
                h,
                i,
                0,
                0,
            )?;
        }
        // The final norm once, not in each of the lm_head's many blocks.
        self.rmsnorm(d.x.ptr, &self.norm, batch, d.xn.ptr, 0)?;
        self.lm_head_argmax(batch, d.xn.ptr, d.parts.ptr, d.tokens.ptr, d.positions.ptr)
    }

    fn capture_all(&mut self) -> Result<()> {
        for batch in 1..=self.max_batch {
            self.capture(batch)?;
        }
        Ok(())
    }

    fn capture(&mut self, batch: usize) -> Result<()> {
        let stream = self.stream.clone();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_err("graph capture begin"))?;
        let launched = self.step_kernels(batch);
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        launched?;
        match ended.map_err(driver_err("graph capture end"))? {
            Some(g) => {
                self.graphs[batch - 1] = Some(g);
                Ok(())
            }
            None => Err(Error::Internal {
                message: "graph capture produced no graph".into(),
            }),
        }
    }

    /// y[rows, out] (+)= x[rows, in] W[out, in]^T on the tensor cores: bf16 in, f32 out.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        w: u64,
        x: u64,
        y: u64,
        rows: usize,
        out: usize,
        inp: usize,
        accumulate: bool,
    ) -> Result<()> {
        let alpha = 1.0f32;
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        // Column-major: Y^T [out, rows] = W [in, out]^T X^T [in, rows].
        // SAFETY: all pointers are live device buffers sized for these shapes.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                out as i32,
                rows as i32,
                inp as i32,
                &alpha as *const f32 as *const _,
                w as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                inp as i32,
                x as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                inp as i32,
                &beta as *const f32 as *const _,
                y as *mut _,
                blas_sys::cudaDataType::CUDA_R_32F,
                out as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::Internal {
            message: format!("cuBLAS GEMM ({rows}x{inp} by {out}x{inp}) failed: {e:?}"),
        })
    }

    fn prefill_bufs(&mut self, rows: usize) -> Result<()> {
        if self.pf.as_ref().is_some_and(|p| p.layout.rows >= rows) {
            return Ok(());
        }
        self.pf = None; // free the smaller one first
        self.pf = Some(PrefillBufs::new(
            &self.cfg,
            PrefillLayout::new(&self.cfg, rows),
            self.dec.layout.max_blocks,
        )?);
        Ok(())
    }
}

impl Funcs {
    fn load(module: &Arc<CudaModule>, cfg: &ModelConfig, sms: usize) -> Result<Self> {
        let k = |n: &str| kernels::function(module, n);
        let mut gemv = Vec::new();
        let mut resident = Vec::new();
        for mode in 0..=*plan::GEMV_MODES.iter().max().unwrap_or(&0) {
            if !plan::GEMV_MODES.contains(&mode) {
                gemv.push(Vec::new());
                resident.push(Vec::new());
                continue;
            }
            let fs = (1..=plan::MAX_GEMV_BATCH)
                .map(|b| k(&format!("gemv_m{mode}_b{b}")))
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
        Ok(Self {
            embed: k("embed_gather")?,
            rmsnorm: k("rmsnorm")?,
            rope_kv: k("rope_kv")?,
            attention: k(&plan::attention_kernel(cfg))?,
            swiglu: k("swiglu")?,
            argmax_final: k("argmax_final")?,
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
            layout,
        })
    }
}

impl PrefillBufs {
    fn new(cfg: &ModelConfig, layout: PrefillLayout, max_blocks: usize) -> Result<Self> {
        let f = |n: usize| DevBuf::zeroed(n * F32);
        let h = |n: usize| DevBuf::zeroed(n * BF16);
        Ok(Self {
            tokens: f(layout.rows)?,
            positions: f(layout.rows)?,
            row_table: f(layout.rows)?,
            table: f(max_blocks)?,
            x: f(layout.x)?,
            xn_bf16: h(layout.xn_bf16)?,
            qkv: f(layout.qkv)?,
            attn_bf16: h(layout.attn_bf16)?,
            gate_up: f(layout.gate_up)?,
            act_bf16: h(layout.act_bf16)?,
            part_o: f(layout.part_o)?,
            part_ml: f(layout.part_ml)?,
            counts: f(layout.counts)?,
            last_xn: f(cfg.hidden_size)?,
            parts: f(2 * plan::lm_head_blocks(cfg))?,
            token: f(1)?,
            layout,
        })
    }
}

/// Uploads every tensor in bf16, shard by shard, releasing each shard's pages once uploaded so
/// that host memory holds about one shard at a time.
#[allow(clippy::type_complexity)]
fn upload_weights(
    cfg: &ModelConfig,
    ckpt: &Checkpoint,
) -> Result<(DevBuf, Vec<LayerWeights>, DevBuf, Option<DevBuf>)> {
    let (h, q, kv, i) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
    );
    let z = |elems: usize| DevBuf::zeroed(elems * BF16);
    let embed = z(cfg.vocab_size * h)?;
    let norm = z(h)?;
    let lm_head = if cfg.tie_word_embeddings {
        None
    } else {
        Some(z(cfg.vocab_size * h)?)
    };
    let mut layers = Vec::new();
    for _ in 0..cfg.num_layers {
        layers.push(LayerWeights {
            input_norm: z(h)?,
            post_norm: z(h)?,
            qkv: z((q + 2 * kv) * h)?,
            qkv_bias: if cfg.qkv_bias {
                Some(z(q + 2 * kv)?)
            } else {
                None
            },
            q_norm: if cfg.qk_norm {
                Some(z(cfg.head_dim)?)
            } else {
                None
            },
            k_norm: if cfg.qk_norm {
                Some(z(cfg.head_dim)?)
            } else {
                None
            },
            o: z(h * q)?,
            gate_up: z(2 * i * h)?,
            down: z(h * i)?,
        });
    }
    // (tensor name, destination, byte offset in it)
    let mut plan: Vec<(String, &DevBuf, usize)> = vec![
        ("model.embed_tokens.weight".into(), &embed, 0),
        ("model.norm.weight".into(), &norm, 0),
    ];
    if let Some(head) = &lm_head {
        plan.push(("lm_head.weight".into(), head, 0));
    }
    for (l, lw) in layers.iter().enumerate() {
        let p = format!("model.layers.{l}");
        plan.push((format!("{p}.input_layernorm.weight"), &lw.input_norm, 0));
        plan.push((
            format!("{p}.post_attention_layernorm.weight"),
            &lw.post_norm,
            0,
        ));
        for (name, off) in [("q_proj", 0), ("k_proj", q), ("v_proj", q + kv)] {
            plan.push((
                format!("{p}.self_attn.{name}.weight"),
                &lw.qkv,
                off * h * BF16,
            ));
            if let Some(b) = &lw.qkv_bias {
                plan.push((format!("{p}.self_attn.{name}.bias"), b, off * BF16));
            }
        }
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            plan.push((format!("{p}.self_attn.q_norm.weight"), qn, 0));
            plan.push((format!("{p}.self_attn.k_norm.weight"), kn, 0));
        }
        plan.push((format!("{p}.self_attn.o_proj.weight"), &lw.o, 0));
        plan.push((format!("{p}.mlp.gate_proj.weight"), &lw.gate_up, 0));
        plan.push((format!("{p}.mlp.up_proj.weight"), &lw.gate_up, i * h * BF16));
        plan.push((format!("{p}.mlp.down_proj.weight"), &lw.down, 0));
    }
    plan.sort_by_key(|(name, _, _)| ckpt.shard_of(name));
    let mut current: Option<usize> = None;
    for (name, dst, offset) in &plan {
        let shard = ckpt.shard_of(name);
        if let Some(prev) = current.filter(|&p| Some(p) != shard) {
            ckpt.release_shard(prev);
        }
        current = shard;
        let view = ckpt.get(name)?;
        dst.write_bytes(*offset, &bf16_bytes(&view))?;
    }
    if let Some(s) = current {
        ckpt.release_shard(s);
    }
    Ok((embed, layers, norm, lm_head))
}

impl Backend for CudaBackend {
    fn prefill(&mut self, tokens: &[u32], table: &BlockTable) -> Result<u32> {
        let chunk = tokens.len().min(PREFILL_CHUNK);
        self.prefill_bufs(chunk)?;
        let c = self.cfg.clone();
        let (h, q, i) = (c.hidden_size, c.q_dim(), c.intermediate_size);
        let max_blocks = self.dec.layout.max_blocks;
        let pf = self.pf.as_ref().expect("allocated above");
        let table_ids: Vec<i32> = table.blocks.iter().map(|&b| b as i32).collect();
        pf.table.write(0, &table_ids)?;
        let mut start = 0;
        while start < tokens.len() {
            let n = (tokens.len() - start).min(chunk);
            let ids: Vec<i32> = tokens[start..start + n].iter().map(|&t| t as i32).collect();
            let pos: Vec<i32> = (start as i32..(start + n) as i32).collect();
            pf.tokens.write(0, &ids)?;
            pf.positions.write(0, &pos)?;
            launch!(&self.f.embed, &self.stream, self.pdl, (n as u32, 1, 1), 256, 0;
                self.embed.ptr, pf.tokens.ptr, pf.x.ptr, h as i32)?;
            for (li, l) in self.layers.iter().enumerate() {
                self.rmsnorm(pf.x.ptr, &l.input_norm, n, 0, pf.xn_bf16.ptr)?;
                self.gemm(
                    l.qkv.ptr,
                    pf.xn_bf16.ptr,
                    pf.qkv.ptr,
                    n,
                    self.qkv_width(),
                    h,
                    false,
                )?;
                self.rope_kv(
                    li,
                    pf.qkv.ptr,
                    n,
                    pf.positions.ptr,
                    pf.row_table.ptr,
                    pf.table.ptr,
                    max_blocks,
                )?;
                self.attention(
                    li,
                    pf.qkv.ptr,
                    n,
                    1,
                    pf.positions.ptr,
                    pf.row_table.ptr,
                    pf.table.ptr,
                    max_blocks,
                    pf.part_o.ptr,
                    pf.part_ml.ptr,
                    pf.counts.ptr,
                    0,
                    pf.attn_bf16.ptr,
                    false,
                )?;
                self.gemm(l.o.ptr, pf.attn_bf16.ptr, pf.x.ptr, n, h, q, true)?;
                self.rmsnorm(pf.x.ptr, &l.post_norm, n, 0, pf.xn_bf16.ptr)?;
                self.gemm(
                    l.gate_up.ptr,
                    pf.xn_bf16.ptr,
                    pf.gate_up.ptr,
                    n,
                    2 * i,
                    h,
                    false,
                )?;
                launch!(&self.f.swiglu, &self.stream, self.pdl, ((i as u32).div_ceil(256), n as u32, 1), 256, 0;
                    pf.gate_up.ptr, pf.act_bf16.ptr, i as i32)?;
                self.gemm(l.down.ptr, pf.act_bf16.ptr, pf.x.ptr, n, h, i, true)?;
            }
            start += n;
            if start == tokens.len() {
                self.rmsnorm(pf.x.at((n - 1) * h, F32), &self.norm, 1, pf.last_xn.ptr, 0)?;
                self.lm_head_argmax(1, pf.last_xn.ptr, pf.parts.ptr, pf.token.ptr, 0)?;
            }
        }
        let mut out = [0i32; 1];
        pf.token.read(&mut out, &self.stream)?;
        Ok(out[0] as u32)
    }

    fn decode(&mut self, items: &[DecodeItem<'_>]) -> Result<Vec<u32>> {
        let batch = items.len();
        if batch == 0 || batch > self.max_batch {
            return Err(Error::Internal {
                message: format!("decode batch {batch} outside 1..={}", self.max_batch),
            });
        }
        let wanted: Vec<RowState> = items
            .iter()
            .map(|it| RowState {
                first_block: it.table.blocks[0],
                position: it.position,
                token: it.token,
            })
            .collect();
        if wanted != self.rows {
            // The batch changed: upload its tokens, positions and block tables.
            let mb = self.dec.layout.max_blocks;
            let mut pos = Vec::with_capacity(batch);
            for (r, it) in items.iter().enumerate() {
                self.host_tokens[r] = it.token as i32;
                pos.push(it.position as i32);
                let row = &mut self.host_tables[r * mb..(r + 1) * mb];
                row.fill(0);
                for (dst, &b) in row.iter_mut().zip(&it.table.blocks) {
                    *dst = b as i32;
                }
            }
            self.dec.tokens.write(0, &self.host_tokens[..batch])?;
            self.dec.positions.write(0, &pos)?;
            self.dec.tables.write(0, &self.host_tables[..batch * mb])?;
        }
        let wall = self.profiler.as_ref().map(|_| std::time::Instant::now());
        if let Some(p) = &self.profiler {
            p.mark("start", 0, &self.stream)?;
        }
        match &self.graphs[batch - 1] {
            Some(g) => g.launch().map_err(driver_err("graph launch"))?,
            None => self.step_kernels(batch)?,
        }
        if let Some(p) = self.profiler.as_ref().filter(|p| !p.per_kernel) {
            p.mark("step (GPU)", 0, &self.stream)?;
        }
        let mut toks = vec![0i32; batch];
        self.dec.tokens.read(&mut toks, &self.stream)?;
        if let (Some(p), Some(wall)) = (&self.profiler, wall) {
            p.end_step(wall.elapsed().as_secs_f64())?;
        }
        self.rows = wanted
            .into_iter()
            .zip(&toks)
            .map(|(mut r, &t)| {
                r.position += 1;
                r.token = t as u32;
                r
            })
            .collect();
        Ok(toks.into_iter().map(|t| t as u32).collect())
    }

    fn pool(&self) -> PoolShape {
        self.pool
    }

    fn features(&self) -> serde_json::Value {
        serde_json::json!({
            "backend": "cuda",
            // The protocol's device ("cpu" / "cuda:N", what goldens are matched by); the GPU's
            // own name beside it.
            "device": format!("cuda:{}", self.ctx.ordinal()),
            "gpu": self.device_name,
            "ordinal": self.ctx.ordinal(),
            "arch": self.arch,
            "multiprocessors": self.sms,
            "dtype": "bfloat16",
            "activations": "float32",
            "logits": "bfloat16 (rounded before the argmax, as a bf16 lm_head's output is)",
            "weights_dtype": self.cfg.dtype,
            "cuda_graphs": self.use_graphs,
            "pdl": self.pdl,
            "kernels": kernels::names(),
            "kernel_cache": self.kernels,
            "prefill_gemm": "cublas bf16 -> f32",
            "degraded": self.degraded,
        })
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.sync();
        if let Some(p) = &self.profiler {
            eprintln!("{}", p.report());
        }
    }
}

/// ENGINE_PROFILE=1: an event after every decode kernel (graphs off), the time between
/// consecutive events summed per kernel role, and achieved bandwidth for the GEMVs.
/// ENGINE_PROFILE=step: graphs and PDL as configured, events around each decode step only: the
/// step's time on the GPU against its wall time in `decode` (the host's share of a token).
struct Profiler {
    per_kernel: bool,
    wall_s: std::cell::Cell<f64>,
    events: Vec<cudarc::driver::CudaEvent>,
    marks: std::cell::RefCell<Vec<(&'static str, usize)>>,
    totals: std::cell::RefCell<std::collections::BTreeMap<&'static str, (usize, f64, usize)>>,
    steps: std::cell::Cell<usize>,
}

impl Profiler {
    const EVENTS: usize = 1024;

    fn new(ctx: &Arc<CudaContext>, per_kernel: bool) -> Result<Self> {
        let events = (0..Self::EVENTS)
            .map(|_| ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(driver_err("event create"))?;
        Ok(Self {
            per_kernel,
            wall_s: Default::default(),
            events,
            marks: Default::default(),
            totals: Default::default(),
            steps: Default::default(),
        })
    }

    fn mark(&self, name: &'static str, bytes: usize, stream: &CudaStream) -> Result<()> {
        let mut marks = self.marks.borrow_mut();
        if name == "start" {
            marks.clear();
        }
        if marks.len() < Self::EVENTS {
            self.events[marks.len()]
                .record(stream)
                .map_err(driver_err("event record"))?;
            marks.push((name, bytes));
        }
        Ok(())
    }

    /// After the step's synchronising read: fold its intervals into the totals.
    fn end_step(&self, wall_s: f64) -> Result<()> {
        self.wall_s.set(self.wall_s.get() + wall_s);
        let marks = self.marks.borrow();
        let mut totals = self.totals.borrow_mut();
        for i in 1..marks.len() {
            let ms = self.events[i - 1]
                .elapsed_ms(&self.events[i])
                .map_err(driver_err("event time"))? as f64;
            let e = totals.entry(marks[i].0).or_default();
            e.0 += 1;
            e.1 += ms;
            e.2 += marks[i].1;
        }
        self.steps.set(self.steps.get() + 1);
        Ok(())
    }

    fn report(&self) -> String {
        let steps = self.steps.get().max(1);
        let totals = self.totals.borrow();
        let all: f64 = totals.values().map(|t| t.1).sum();
        let wall_ms = self.wall_s.get() * 1e3 / steps as f64;
        if !self.per_kernel {
            return format!(
                "step profile over {steps} decode steps: {:.3} ms on the GPU, {wall_ms:.3} ms of \
                 wall time in decode (graph launch to tokens read), {:.1}% of it on the host",
                all / steps as f64,
                100.0 * (1.0 - all / steps as f64 / wall_ms)
            );
        }
        let mut out = format!(
            "kernel profile over {steps} decode steps: {:.3} ms per step\n{:<16} {:>8} {:>12} {:>10} {:>7} {:>9}\n",
            all / steps as f64,
            "kernel", "calls", "ms/step", "us/call", "share", "GB/s"
        );
        for (name, (calls, ms, bytes)) in totals.iter() {
            let gbs = if *bytes > 0 {
                *bytes as f64 / (ms / 1e3) / 1e9
            } else {
                0.0
            };
            out += &format!(
                "{name:<16} {:>8} {:>12.4} {:>10.2} {:>6.1}% {:>9.0}\n",
                calls / steps,
                ms / steps as f64,
                ms * 1e3 / *calls as f64,
                100.0 * ms / all,
                gbs
            );
        }
        out
    }
}

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
