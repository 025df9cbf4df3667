//! One method per kernel: its arguments as the kernel takes them and its launch geometry
//! (plan.rs), shared by prefill and the decode step. Each records a profiler mark after its
//! launch (ENGINE_PROFILE=1).

use super::backend::{CudaBackend, BF16};
use super::device::{ptr_or_null, DevBuf};
use super::gemm::Rows;
use super::load::{AttentionWeights, MambaWeights, Matrix, MlpWeights};
use super::plan::{self, GemvMode, ATT_THREADS, GEMV_THREADS};
use crate::backend::Scored;
use crate::error::Result;
use crate::launch;

/// A decode GEMV (gemv.cu): `w` times each activation row of `x`, into `y`.
pub(super) struct Gemv<'a> {
    /// The profiler's name for it.
    pub name: &'static str,
    /// Residual, norm or gate/up ([`plan::gemv_launch`] picks the kernel), or the lm_head.
    pub mode: GemvMode,
    pub w: &'a Matrix,
    pub x: u64,
    pub y: u64,
    /// The RMSNorm gain of the modes that normalise their input; 0 for the others.
    pub gamma: u64,
    /// The lm_head writing its logits into `y` too (`gemv_m5_logits`): the verify request's
    /// scoring, after the step and never inside it.
    pub logits: bool,
}

impl<'a> Gemv<'a> {
    pub fn new(name: &'static str, mode: GemvMode, w: &'a Matrix, x: u64, y: u64) -> Self {
        Self {
            name,
            mode,
            w,
            x,
            y,
            gamma: 0,
            logits: false,
        }
    }

    /// With the RMSNorm gain that the norm modes fold in.
    pub fn norm(self, gamma: &DevBuf) -> Self {
        Self {
            gamma: gamma.ptr,
            ..self
        }
    }

    /// Output rows and K: gate/up's output rows each read a gate and an up row.
    pub fn shape(&self) -> (usize, usize) {
        (self.w.rows / self.mode.weight_rows(), self.w.cols)
    }
}

/// Where a kernel finds each row's position and its sequence's KV blocks.
#[derive(Clone, Copy)]
pub(super) struct Paging {
    pub positions: u64,
    /// The block table of each row.
    pub row_table: u64,
    pub tables: u64,
    /// Entries per block table.
    pub max_blocks: usize,
}

/// Attention of `rows` rows of `qkv` over the paged cache into `out_f32`/`out_bf16` (0: not
/// written), in `splits` context splits with their scratch.
pub(super) struct Attention<'a> {
    pub w: &'a AttentionWeights,
    pub qkv: u64,
    pub rows: usize,
    pub splits: usize,
    pub paging: Paging,
    pub part_o: u64,
    pub part_ml: u64,
    pub counts: u64,
    pub out_f32: u64,
    pub out_bf16: u64,
    /// Decode: the kernel also does what `rope_kv` does for prefill (bias, q/k norm, rotation,
    /// and the new position's K/V write).
    pub rope: bool,
}

/// The Mamba-2 mixer's recurrent core (mamba.cu) over `segments` runs of consecutive rows of
/// `zxbcdt` (in_proj's output), segment s the rows `starts[s]..starts[s + 1]` of one sequence, in
/// `rows` rows: the conv into `xbc`, the SSM into `y`, the gated norm into `out_f32`/`out_bf16`
/// (0: not written).
pub(super) struct Mamba<'a> {
    pub w: &'a MambaWeights,
    pub zxbcdt: u64,
    pub xbc: u64,
    pub y: u64,
    pub segments: usize,
    pub rows: usize,
    /// Each segment's first row, and one past the last segment's last (device i32s).
    pub starts: u64,
    /// Each segment's state slot, and each row's position.
    pub slots: u64,
    pub positions: u64,
    /// Transformers' prefill arithmetic: dt clamped from below at `time_step_min`; the conv over
    /// chunks of [`plan::MAMBA_CONV_ROWS`] rows; and the SSM's inputs staged through shared
    /// memory, a tile of rows at a time.
    pub prefill: bool,
    /// Decode on the persistent staged step (mamba.cu `mamba_ssm_step_staged`: the cuBLAS
    /// path's) rather than a block an item.
    pub staged_step: bool,
    /// The conv's block rows: one per segment in decode, [`plan::mamba_conv_chunks`] in prefill.
    pub conv_chunks: usize,
    pub out_f32: u64,
    pub out_bf16: u64,
}

impl CudaBackend {
    /// RMSNorm of `rows` rows of `x` into f32 and/or bf16 outputs (0 = not written).
    pub(super) fn rmsnorm(
        &self,
        x: u64,
        w: &DevBuf,
        rows: usize,
        out_f32: u64,
        out_bf16: u64,
    ) -> Result<()> {
        let c = &self.cfg;
        launch!(&self.f.rmsnorm, &self.stream, self.pdl, (rows as u32, 1, 1), 256, 0;
            x, w.ptr, c.rms_norm_eps, c.hidden_size as i32, out_f32, out_bf16)?;
        self.mark("rmsnorm", 0)
    }

    /// With ENGINE_PROFILE=1: an event after the kernel just launched, timed after the step.
    pub(super) fn mark(&self, name: &'static str, bytes: usize) -> Result<()> {
        match &self.profiler {
            Some(p) if p.per_kernel => p.mark(name, bytes, &self.stream),
            _ => Ok(()),
        }
    }

    /// `g` for `batch` sequences, on the kernel the load-time tuning chose for its shape and batch
    /// (tune.rs); `parts` receives the argmax candidates of the lm_head. Returns the grid (the
    /// lm_head's number of candidates).
    pub(super) fn gemv(&self, g: &Gemv, batch: usize, parts: u64) -> Result<u32> {
        self.gemv_as(g, batch, batch, parts)
    }

    /// [`Self::gemv`] for `batch` sequences on the kernel chosen for `tuned_for`.
    fn gemv_as(&self, g: &Gemv, tuned_for: usize, batch: usize, parts: u64) -> Result<u32> {
        let (rows, cols) = g.shape();
        let kernel = self.tuning.kernel(g.mode, rows, cols, tuned_for);
        let grid = self.gemv_on(g, batch, parts, kernel)?;
        self.mark(g.name, g.w.rows * g.w.cols * BF16)?;
        Ok(grid)
    }

    /// `g` on `kernel` (none: plan.rs `gemv_launch`'s default), without the profiler's mark (the
    /// tuning times it).
    pub(super) fn gemv_on(
        &self,
        g: &Gemv,
        batch: usize,
        parts: u64,
        kernel: Option<plan::GemvKernel>,
    ) -> Result<u32> {
        let (rows, cols) = g.shape();
        let l = plan::gemv_launch(rows, cols, g.mode, batch, kernel);
        let grid = l.grid(self.f.resident[l.mode.index()][batch - 1]);
        // The logits variant runs after a graph launch, outside the step: no PDL.
        let (f, pdl) = if g.logits {
            let i = (l.mode == GemvMode::LmHeadMma) as usize;
            (&self.f.lm_head_logits[i][batch - 1], false)
        } else {
            (&self.f.gemv[l.mode.index()][batch - 1], self.pdl)
        };
        launch!(f, &self.stream, pdl, (grid, 1, 1), GEMV_THREADS, 0;
            g.w.buf.ptr, g.x, g.y, rows as i32, cols as i32, cols as i32, rows as i32,
            l.ksplit as i32, g.gamma, self.cfg.rms_norm_eps, parts)?;
        Ok(grid)
    }

    /// The lm_head's GEMV over the normalised rows `xn` (its logits into `y` when asked for).
    pub(super) fn lm_head_gemv(&self, xn: u64, y: u64) -> Gemv<'_> {
        Gemv::new("gemv_lm_head", GemvMode::LmHead, self.lm_head(), xn, y)
    }

    /// The lm_head over the `batch` normalised rows `xn` and the final argmax into `tokens`,
    /// advancing `positions` when given, on the kernel tuned for `tuned_for` rows: the step's
    /// own batch, or 1 for a prefill's first tokens (up to [`plan::MAX_GEMV_BATCH`] prompts at
    /// once), whose bits are then each prompt's alone, as a row's bits do not depend on the
    /// batch it runs in on one kernel (gemv_gpu_tests.rs).
    pub(super) fn lm_head_argmax(
        &self,
        tuned_for: usize,
        batch: usize,
        xn: u64,
        parts: u64,
        tokens: u64,
        positions: u64,
    ) -> Result<()> {
        let nparts = self.gemv_as(&self.lm_head_gemv(xn, 0), tuned_for, batch, parts)?;
        launch!(&self.f.argmax_final, &self.stream, self.pdl, (batch as u32, 1, 1), 1024, 0;
            parts, nparts as i32, tokens, positions, (positions != 0) as i32)?;
        self.mark("argmax_final", 0)
    }

    /// Bias, q/k norm, RoPE and the paged K/V write for a prefill pass's `rows` rows of `qkv`
    /// (the decode attention kernels do it themselves).
    pub(super) fn rope_kv(
        &self,
        l: &AttentionWeights,
        qkv: u64,
        rows: usize,
        p: Paging,
    ) -> Result<()> {
        let c = &self.cfg;
        launch!(&self.f.rope_kv, &self.stream, self.pdl, (rows as u32, 1, 1), 256, 0;
            qkv, ptr_or_null(&l.qkv_bias), ptr_or_null(&l.q_norm), ptr_or_null(&l.k_norm), c.rms_norm_eps,
            self.inv_freq.ptr, p.positions, p.row_table, p.tables, p.max_blocks as i32,
            self.k_cache[l.cache].ptr, self.v_cache[l.cache].ptr, c.num_heads as i32,
            c.num_kv_heads as i32, c.head_dim as i32, self.pool.block_size as i32)?;
        self.mark("rope_kv", 0)
    }

    pub(super) fn attention(&self, a: &Attention) -> Result<()> {
        let c = &self.cfg;
        let l = a.w;
        let p = &a.paging;
        let scale = self.faults.attention_scale(c.head_dim);
        launch!(&self.f.attention, &self.stream, self.pdl,
            (a.rows as u32, c.num_kv_heads as u32, a.splits as u32), ATT_THREADS,
            plan::attention_smem_bytes(c);
            a.qkv, self.qkv_width() as i32, self.k_cache[l.cache].ptr, self.v_cache[l.cache].ptr,
            p.positions, p.row_table, p.tables, p.max_blocks as i32, c.num_heads as i32,
            c.num_kv_heads as i32, c.head_dim as i32, self.pool.block_size as i32, scale,
            a.part_o, a.part_ml, a.counts, a.out_f32, a.out_bf16, ptr_or_null(&l.qkv_bias),
            ptr_or_null(&l.q_norm), ptr_or_null(&l.k_norm), c.rms_norm_eps,
            if a.rope { self.inv_freq.ptr } else { 0 })?;
        self.mark("attention", 0)
    }

    /// Decode attention on the tensor cores (attention_batch.cu), for every step past batch 1:
    /// `a`'s rows one per sequence, each rotated and its K/V written by the kernel itself (as
    /// [`Self::rope_kv`] would, the same bits), its grid `a.splits` deep. The caller has checked
    /// that the model has the kernel (`f.attention_batch`).
    pub(super) fn attention_batch(&self, a: &Attention) -> Result<()> {
        let c = &self.cfg;
        let l = a.w;
        let p = &a.paging;
        let f = self
            .f
            .attention_batch
            .as_ref()
            .expect("checked by the caller");
        launch!(f, &self.stream, self.pdl,
            (a.rows as u32, c.num_kv_heads as u32, a.splits as u32),
            32 * plan::ATT_BATCH_WARPS as u32, plan::attention_batch_smem_bytes(c);
            a.qkv, self.qkv_width() as i32, self.k_cache[l.cache].ptr,
            self.v_cache[l.cache].ptr, p.positions, p.row_table, p.tables, p.max_blocks as i32,
            c.num_heads as i32, c.num_kv_heads as i32, self.pool.block_size as i32,
            self.faults.attention_scale(c.head_dim), a.part_o, a.part_ml, a.counts, a.out_f32,
            a.out_bf16, ptr_or_null(&l.qkv_bias), ptr_or_null(&l.q_norm), ptr_or_null(&l.k_norm),
            c.rms_norm_eps, self.inv_freq.ptr)?;
        self.mark("attention", 0)
    }

    /// A prefill pass's attention on the tensor cores (attention_prefill.cu): `tiles` blocks of
    /// up to [`plan::ATT_PF_ROWS`] rows of one prompt (plan.rs `attention_prefill_tiles`, on the
    /// device at `tile_list`), per query head, into `out_bf16`. The caller has checked that the
    /// model has the kernel (`f.attention_prefill`).
    pub(super) fn attention_prefill(
        &self,
        w: &AttentionWeights,
        qkv: u64,
        paging: Paging,
        tile_list: u64,
        tiles: usize,
        out_bf16: u64,
    ) -> Result<()> {
        let c = &self.cfg;
        let f = self
            .f
            .attention_prefill
            .as_ref()
            .expect("checked by the caller");
        launch!(f, &self.stream, self.pdl,
            (tiles as u32, c.num_heads as u32, 1), 32 * plan::ATT_PF_WARPS as u32,
            plan::attention_prefill_smem_bytes(c.head_dim);
            qkv, self.qkv_width() as i32, self.k_cache[w.cache].ptr, self.v_cache[w.cache].ptr,
            paging.positions, paging.row_table, paging.tables, paging.max_blocks as i32, tile_list,
            c.num_heads as i32, c.num_kv_heads as i32, self.pool.block_size as i32,
            self.faults.attention_scale(c.head_dim), 0u64, out_bf16)?;
        self.mark("attention", 0)
    }

    /// The Mamba-2 mixer's conv, SSM and gated norm (mamba.cu).
    pub(super) fn mamba(&self, m: &Mamba) -> Result<()> {
        let hy = &self
            .cfg
            .hybrid
            .as_ref()
            .expect("a Mamba layer is a hybrid's")
            .mamba;
        let w = m.w;
        let (in_dim, conv_dim, inner) = (hy.in_proj_dim(), hy.conv_dim(), hy.inner());
        let split = plan::mamba_ssm_split(hy.d_state).expect("checked at load");
        let i = |v: usize| v as i32;
        let dt_min = if m.prefill { hy.time_step_min } else { 0.0 };
        let rows_per = if m.prefill { plan::MAMBA_CONV_ROWS } else { 0 };
        launch!(&self.f.mamba_conv, &self.stream, self.pdl,
            ((conv_dim as u32).div_ceil(128), m.conv_chunks as u32, 1), 128, 0;
            m.zxbcdt, m.starts, i(m.segments), i(rows_per), i(in_dim), i(inner), i(conv_dim),
            i(hy.conv_kernel), w.conv_w.ptr, ptr_or_null(&w.conv_b), self.conv_state[w.state].ptr,
            m.slots, m.positions, m.xbc)?;
        self.mark("mamba_conv", 0)?;
        let ssd = m.prefill && plan::mamba_ssd(hy);
        if !m.prefill {
            // One row a segment: a block an item (segment, head), or the persistent grid.
            let threads = plan::mamba_ssm_threads(hy, false);
            let items = hy.num_heads * m.segments;
            // The staged step is launched without PDL: launched early, its persistent blocks
            // (69 KiB of shared memory each on the 8B) wait beside the in_proj GEMM and the conv
            // for the whole GPU; after them it is faster (the cuBLAS path's batch-8 step of
            // Nemotron-H-8B 1.2-1.9% shorter on three H100s, docs/ENGINE.md session 32). The
            // block-an-item step of the GEMV path measured the same either way and keeps it.
            let (f, grid, smem, pdl) = if m.staged_step {
                let blocks = self.f.mamba_step_blocks.min(items) as u32;
                (
                    &self.f.mamba_ssm_step_staged,
                    (blocks, 1, 1),
                    plan::mamba_step_smem_bytes(hy),
                    false,
                )
            } else {
                (
                    &self.f.mamba_ssm_step,
                    (hy.num_heads as u32, m.segments as u32, 1),
                    0,
                    self.pdl,
                )
            };
            launch!(f, &self.stream, pdl, grid, threads, smem;
                m.zxbcdt, m.xbc, m.starts, i(m.segments), i(in_dim), i(inner), i(conv_dim),
                i(hy.num_heads), i(hy.head_dim), i(hy.d_state), i(hy.n_groups), i(split), w.dt_bias.ptr,
                w.a.ptr, w.d.ptr, self.ssm_state[w.state].ptr, m.slots, m.positions, dt_min, m.y)?;
            self.mark("mamba_ssm", 0)?;
        } else {
            let (ssm, threads, tile, smem) = if ssd {
                let smem = plan::mamba_ssd_smem_bytes();
                (&self.f.mamba_ssd, plan::MAMBA_SSD_THREADS, 0, smem)
            } else {
                let tile = plan::mamba_scan_tile(hy);
                let smem = plan::mamba_scan_smem_bytes(hy, tile);
                (
                    &self.f.mamba_ssm,
                    plan::mamba_ssm_threads(hy, true),
                    tile,
                    smem,
                )
            };
            launch!(ssm, &self.stream, self.pdl,
                (hy.num_heads as u32, m.segments as u32, 1), threads, smem;
                m.zxbcdt, m.xbc, m.starts, i(in_dim), i(inner), i(conv_dim), i(hy.num_heads),
                i(hy.head_dim), i(hy.d_state), i(hy.n_groups), i(split), i(tile), w.dt_bias.ptr, w.a.ptr,
                w.d.ptr, self.ssm_state[w.state].ptr, m.slots, m.positions, dt_min, m.y)?;
            self.mark(if ssd { "mamba_ssd" } else { "mamba_ssm" }, 0)?;
        }
        // A block per (group, row) is all the parallelism there is at batch 1 (8 blocks on the
        // 8B).
        launch!(&self.f.mamba_gated_norm, &self.stream, self.pdl,
            (hy.n_groups as u32, m.rows as u32, 1), plan::mamba_norm_threads(hy), 0;
            m.y, m.zxbcdt, i(in_dim), i(inner), i(hy.n_groups), w.gate_norm.ptr, hy.eps, m.out_f32,
            m.out_bf16)?;
        self.mark("mamba_gated_norm", 0)
    }

    /// The embedding rows of `rows` tokens into `x` (f32).
    pub(super) fn embed(&self, tokens: u64, x: u64, rows: usize) -> Result<()> {
        launch!(&self.f.embed, &self.stream, self.pdl, (rows as u32, 1, 1), 256, 0;
            self.embed.buf.ptr, tokens, x, self.cfg.hidden_size as i32)?;
        self.mark("embed", 0)
    }

    /// The MLP's activation of `rows` rows of its up GEMM's bf16 output `up` into `act_bf16` (the
    /// down GEMM's input): SwiGLU over gate and up stacked, or relu2.
    pub(super) fn mlp_activation(
        &self,
        m: &MlpWeights,
        up: u64,
        act_bf16: u64,
        rows: usize,
    ) -> Result<()> {
        let width = m.down.cols;
        if !m.swiglu {
            let n = rows * width;
            launch!(&self.f.relu2, &self.stream, self.pdl,
                (n.div_ceil(256 * plan::ACT_VALUES) as u32, 1, 1), 256, 0;
                up, n as i32, act_bf16)?;
            return self.mark("relu2", 0);
        }
        launch!(&self.f.swiglu, &self.stream, self.pdl,
            (width.div_ceil(256 * plan::ACT_VALUES) as u32, rows as u32, 1), 256, 0;
            up, act_bf16, width as i32)?;
        self.mark("swiglu", 0)
    }

    /// The verify request's score of `batch` rows whose normalised last hidden states are `xn`
    /// and greedy tokens `tokens` (what a step or a prefill left): the lm_head again, writing
    /// its logits (the same kernel code and sums as the step's own), then `score_forced` against
    /// `forced`, which also makes `tokens` the forced ones. A cuBLAS step has left its logits
    /// (`step_logits`): they are scored as they are. Needs the verify buffers.
    pub(super) fn score(
        &self,
        batch: usize,
        xn: u64,
        tokens: u64,
        forced: &[u32],
        step_logits: Option<u64>,
    ) -> Result<Vec<Scored>> {
        let v = self.verify.as_ref().expect("verify buffers allocated");
        let ids: Vec<i32> = forced.iter().map(|&t| t as i32).collect();
        v.forced.write(0, &ids)?;
        let logits = match step_logits {
            Some(l) => l,
            None => {
                let mut head = self.lm_head_gemv(xn, v.logits.ptr);
                head.logits = true;
                self.gemv(&head, batch, v.parts.ptr)?;
                v.logits.ptr
            }
        };
        launch!(&self.f.score, &self.stream, false, (batch as u32, 1, 1), 1024, 0;
            logits, self.cfg.vocab_size as i32, tokens, v.forced.ptr, v.scored.ptr)?;
        let mut out = vec![0f32; 3 * batch];
        v.scored.read(&mut out, &self.stream)?;
        Ok(out
            .chunks_exact(3)
            .map(|r| Scored {
                argmax: r[0].to_bits(),
                gap: r[1],
                scale: r[2],
            })
            .collect())
    }

    /// [`CudaBackend::gemm`] with the profiler's mark (a decode step on cuBLAS, a prefill pass).
    pub(super) fn blas_gemm(
        &self,
        name: &'static str,
        w: &Matrix,
        x: u64,
        y: u64,
        rows: Rows<'_>,
        accumulate: bool,
    ) -> Result<()> {
        self.gemm(w, x, y, rows, accumulate)?;
        self.mark(name, w.rows * w.cols * BF16)
    }
}
