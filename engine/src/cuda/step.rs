//! The decode step: every kernel of one step for the first `batch` rows of the decode buffers,
//! on the GEMVs or on cuBLAS ([`StepPath`]), captured once per batch size into a CUDA graph and
//! replayed, and the upload of the rows' tokens, positions and block tables when the batch
//! changes.

use cudarc::driver::{sys, CudaGraph};

use super::backend::{CudaBackend, RowState};
use super::device::driver_err;
use super::gemm::Rows;
use super::load::{Mixer, Sublayer};
use super::ops::{Attention, Gemv, Mamba, Paging};
use super::plan::{self, GemvMode, StepPath};
use crate::backend::DecodeItem;
use crate::error::{Error, Result};
use crate::launch;

impl CudaBackend {
    /// The path a step of `batch` rows runs.
    pub(super) fn path(&self, batch: usize) -> StepPath {
        StepPath::of(batch, self.paths.batched)
    }

    /// One decode step for the first `batch` rows of the decode buffers: every kernel of the
    /// step, in order, on `path`. Captured into a graph once per batch size.
    pub(super) fn step_kernels(&self, batch: usize, path: StepPath) -> Result<()> {
        match path {
            StepPath::Gemv => self.step_gemv(batch),
            StepPath::Blas => self.step_blas(batch),
        }
    }

    /// Where decode attention finds each row's position and its sequence's KV blocks.
    fn paging(&self) -> Paging {
        let d = &self.dec;
        Paging {
            positions: d.positions.ptr,
            row_table: d.row_table.ptr,
            tables: d.tables.ptr,
            max_blocks: d.layout.max_blocks,
        }
    }

    /// Whether a step of `batch` rows runs its decode attention on the tensor cores
    /// (attention_batch.cu) rather than attention.cu: every batch past 1, where the model has the
    /// kernel.
    fn attention_on_tensor_cores(&self, batch: usize) -> bool {
        batch > 1 && self.f.attention_batch.is_some()
    }

    /// The decode attention kernel a step of `batch` rows runs.
    pub(super) fn decode_attention_kernel(&self, batch: usize) -> String {
        match plan::attention_batch_kernel(&self.cfg) {
            Some(k) if self.attention_on_tensor_cores(batch) => k,
            _ => plan::attention_kernel(&self.cfg),
        }
    }

    /// Decode attention of `batch` rows of `qkv`, the rotation and K/V write folded in: at batch
    /// 1 attention.cu; at larger batches, on either path, attention_batch.cu where the model has
    /// it. Its splits of 256 positions are 1.3-2.4x faster than attention.cu's at batch 8 and 32
    /// and slower at batch 1 over a long context (docs/ENGINE.md, session 18); batch 1 already
    /// has GEMVs of its own (tune.rs), so its rows' bits are its own too. Both write a K/V row
    /// as rope_kv does (rope_head), so a sequence's cache is the same bits at any batch.
    fn decode_attention(
        &self,
        a: &crate::cuda::load::AttentionWeights,
        batch: usize,
        out_f32: u64,
        out_bf16: u64,
    ) -> Result<()> {
        let d = &self.dec;
        let tensor_cores = self.attention_on_tensor_cores(batch);
        let att = Attention {
            w: a,
            qkv: d.qkv.ptr,
            rows: batch,
            splits: plan::MAX_SPLITS,
            paging: self.paging(),
            part_o: d.part_o.ptr,
            part_ml: d.part_ml.ptr,
            counts: d.counts.ptr,
            out_f32,
            out_bf16,
            rope: true,
        };
        if tensor_cores {
            self.attention_batch(&att)
        } else {
            self.attention(&att)
        }
    }

    /// The Mamba-2 mixer's core for `batch` rows, one step each, its output into `out_f32` or
    /// `out_bf16`; `staged_step` on the cuBLAS path (mamba.cu `mamba_ssm_step_staged`).
    fn decode_mamba(
        &self,
        m: &crate::cuda::load::MambaWeights,
        batch: usize,
        out_f32: u64,
        out_bf16: u64,
        staged_step: bool,
    ) -> Result<()> {
        let d = &self.dec;
        self.mamba(&Mamba {
            w: m,
            zxbcdt: d.zxbcdt.ptr,
            xbc: d.xbc.ptr,
            y: d.ssm_y.ptr,
            segments: batch,
            rows: batch,
            starts: d.starts.ptr,
            slots: d.slots.ptr,
            positions: d.positions.ptr,
            prefill: false,
            staged_step,
            conv_chunks: batch,
            out_f32,
            out_bf16,
        })
    }

    fn step_gemv(&self, batch: usize) -> Result<()> {
        let d = &self.dec;
        self.embed(d.tokens.ptr, d.x.ptr, batch)?;
        for l in &self.layers {
            // RMSNorm is folded into the GEMV that reads the residual stream; the other adds
            // the mixer's output back into it.
            let [input, output] = self.sublayer_gemvs(l);
            self.gemv(&input, batch, 0)?;
            match &l.mixer {
                Mixer::Attention(a) => self.decode_attention(a, batch, d.attn.ptr, 0)?,
                // The activation is applied by the up GEMV: SwiGLU or relu2.
                Mixer::Mlp(_) => {}
                Mixer::Mamba(m) => self.decode_mamba(m, batch, d.gated.ptr, 0, false)?,
            }
            self.gemv(&output, batch, 0)?;
        }
        // The final norm once, not in each of the lm_head's many blocks.
        self.rmsnorm(d.x.ptr, &self.norm, batch, d.xn.ptr, 0)?;
        self.lm_head_argmax(
            batch,
            batch,
            d.xn.ptr,
            d.parts.ptr,
            d.tokens.ptr,
            d.positions.ptr,
        )
    }

    /// The step on cuBLAS: each sublayer as prefill runs it (RMSNorm into bf16, GEMM, the mixer
    /// writing bf16, GEMM adding into the residual stream), then the lm_head's GEMM into f32
    /// logits and `argmax_rows` over them, rounded to bf16.
    fn step_blas(&self, batch: usize) -> Result<()> {
        let d = &self.dec;
        let rows = Rows::Step(batch);
        self.embed(d.tokens.ptr, d.x.ptr, batch)?;
        for l in &self.layers {
            self.rmsnorm(d.x.ptr, &l.norm, batch, 0, d.xn_bf16.ptr)?;
            // The mixer's input GEMM and core; then its output GEMM adds into the stream.
            let (name, output, mixed) = match &l.mixer {
                Mixer::Attention(a) => {
                    self.blas_gemm("gemm_qkv", &a.qkv, d.xn_bf16.ptr, d.qkv.ptr, rows, false)?;
                    self.decode_attention(a, batch, 0, d.attn_bf16.ptr)?;
                    ("gemm_o", &a.o, d.attn_bf16.ptr)
                }
                Mixer::Mlp(m) => {
                    self.blas_gemm("gemm_up", &m.up, d.xn_bf16.ptr, d.up.ptr, rows, false)?;
                    self.mlp_activation(m, d.up.ptr, d.act_bf16.ptr, batch)?;
                    ("gemm_down", &m.down, d.act_bf16.ptr)
                }
                Mixer::Mamba(m) => {
                    self.blas_gemm(
                        "gemm_in_proj",
                        &m.in_proj,
                        d.xn_bf16.ptr,
                        d.zxbcdt.ptr,
                        rows,
                        false,
                    )?;
                    self.decode_mamba(m, batch, 0, d.gated_bf16.ptr, true)?;
                    ("gemm_out_proj", &m.out_proj, d.gated_bf16.ptr)
                }
            };
            self.blas_gemm(name, output, mixed, d.x.ptr, rows, true)?;
        }
        self.rmsnorm(d.x.ptr, &self.norm, batch, 0, d.xn_bf16.ptr)?;
        self.blas_gemm(
            "gemm_lm_head",
            self.lm_head(),
            d.xn_bf16.ptr,
            d.logits.ptr,
            rows,
            false,
        )?;
        let nparts = plan::argmax_parts(&self.cfg);
        launch!(&self.f.argmax_rows, &self.stream, self.pdl, (batch as u32, nparts as u32, 1), 256, 0;
            d.logits.ptr, self.cfg.vocab_size as i32, d.parts.ptr)?;
        self.mark("argmax_rows", 0)?;
        launch!(&self.f.argmax_final, &self.stream, self.pdl, (batch as u32, 1, 1), 1024, 0;
            d.parts.ptr, nparts as i32, d.tokens.ptr, d.positions.ptr, 1i32)?;
        self.mark("argmax_final", 0)
    }

    /// A sublayer's two decode GEMVs over the decode buffers: the one that reads the residual
    /// stream (its RMSNorm folded in: q/k/v, gate/up or up with its activation, in_proj) and the
    /// one that adds the mixer's output back into it (o, down, out_proj).
    pub(super) fn sublayer_gemvs<'a>(&self, l: &'a Sublayer) -> [Gemv<'a>; 2] {
        use GemvMode::{Norm, NormRelu2, NormSwiglu, Residual};
        let d = &self.dec;
        let (input, output) = match &l.mixer {
            Mixer::Attention(a) => (
                Gemv::new("gemv_qkv", Norm, &a.qkv, d.x.ptr, d.qkv.ptr),
                Gemv::new("gemv_o", Residual, &a.o, d.attn.ptr, d.x.ptr),
            ),
            Mixer::Mlp(m) => {
                let (name, mode) = if m.swiglu {
                    ("gemv_gate_up", NormSwiglu)
                } else {
                    ("gemv_up", NormRelu2)
                };
                (
                    Gemv::new(name, mode, &m.up, d.x.ptr, d.act.ptr),
                    Gemv::new("gemv_down", Residual, &m.down, d.act.ptr, d.x.ptr),
                )
            }
            Mixer::Mamba(m) => (
                Gemv::new("gemv_in_proj", Norm, &m.in_proj, d.x.ptr, d.zxbcdt.ptr),
                Gemv::new("gemv_out_proj", Residual, &m.out_proj, d.gated.ptr, d.x.ptr),
            ),
        };
        [input.norm(&l.norm), output]
    }

    pub(super) fn capture_all(&mut self) -> Result<()> {
        for batch in 1..=self.max_batch {
            self.graphs[batch - 1] = Some(self.capture(batch, self.path(batch))?);
        }
        Ok(())
    }

    /// The step of `batch` rows on `path`, captured into a graph.
    pub(super) fn capture(&self, batch: usize, path: StepPath) -> Result<CudaGraph> {
        let stream = self.stream.clone();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_err("graph capture begin"))?;
        let launched = self.step_kernels(batch, path);
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        launched?;
        ended
            .map_err(driver_err("graph capture end"))?
            .ok_or_else(|| Error::Internal {
                message: "graph capture produced no graph".into(),
            })
    }

    /// Uploads the rows' tokens, positions and block tables when the batch is not the one the
    /// device holds; returns the rows' state as it will be before the step.
    pub(super) fn upload_rows(&mut self, items: &[DecodeItem<'_>]) -> Result<Vec<RowState>> {
        let batch = items.len();
        let wanted: Vec<RowState> = items
            .iter()
            .map(|it| RowState {
                first_block: it.table.blocks[0],
                slot: it.table.state_slot,
                position: it.position,
                token: it.token,
            })
            .collect();
        if wanted != self.rows {
            // The batch changed: upload its tokens, positions and block tables.
            let mb = self.dec.layout.max_blocks;
            let mut pos = Vec::with_capacity(batch);
            let mut slots = Vec::with_capacity(batch);
            for (r, it) in items.iter().enumerate() {
                self.host_tokens[r] = it.token as i32;
                pos.push(it.position as i32);
                slots.push(it.table.state_slot.unwrap_or(0) as i32);
                let row = &mut self.host_tables[r * mb..(r + 1) * mb];
                row.fill(0);
                for (dst, &b) in row.iter_mut().zip(&it.table.blocks) {
                    *dst = b as i32;
                }
            }
            self.dec.tokens.write(0, &self.host_tokens[..batch])?;
            self.dec.positions.write(0, &pos)?;
            self.dec.slots.write(0, &slots)?;
            self.dec.tables.write(0, &self.host_tables[..batch * mb])?;
        }
        Ok(wanted)
    }

    /// Launches one step for `batch` rows: its graph, or its kernels one by one, with the
    /// profiler's marks around it.
    pub(super) fn run_step(&self, batch: usize) -> Result<()> {
        if let Some(p) = &self.profiler {
            p.mark("start", 0, &self.stream)?;
        }
        match &self.graphs[batch - 1] {
            Some(g) => g.launch().map_err(driver_err("graph launch"))?,
            None => self.step_kernels(batch, self.path(batch))?,
        }
        if let Some(p) = self.profiler.as_ref().filter(|p| !p.per_kernel) {
            p.mark("step (GPU)", 0, &self.stream)?;
        }
        Ok(())
    }
}
