//! The decode step: every kernel of one step for the first `batch` rows of the decode buffers,
//! captured once per batch size into a CUDA graph and replayed, and the upload of the rows'
//! tokens, positions and block tables when the batch changes.

use cudarc::driver::sys;

use super::backend::{CudaBackend, RowState};
use super::device::driver_err;
use super::load::{Mixer, Sublayer};
use super::ops::{Attention, Gemv, Mamba, Paging};
use super::plan::{self, GemvMode};
use crate::backend::DecodeItem;
use crate::error::{Error, Result};
use crate::launch;

impl CudaBackend {
    /// One decode step for the first `batch` rows of the decode buffers: every kernel of the
    /// step, in order. Captured into a graph once per batch size.
    pub(super) fn step_kernels(&self, batch: usize) -> Result<()> {
        let c = &self.cfg;
        let d = &self.dec;
        launch!(&self.f.embed, &self.stream, self.pdl, (batch as u32, 1, 1), 256, 0;
            self.embed.buf.ptr, d.tokens.ptr, d.x.ptr, c.hidden_size as i32)?;
        self.mark("embed", 0)?;
        let paging = Paging {
            positions: d.positions.ptr,
            row_table: d.row_table.ptr,
            tables: d.tables.ptr,
            max_blocks: d.layout.max_blocks,
        };
        for l in &self.layers {
            // RMSNorm is folded into the GEMV that reads the residual stream; the other adds
            // the mixer's output back into it.
            let [input, output] = self.sublayer_gemvs(l);
            self.gemv(&input, batch, 0)?;
            match &l.mixer {
                Mixer::Attention(a) => self.attention(&Attention {
                    w: a,
                    qkv: d.qkv.ptr,
                    rows: batch,
                    splits: plan::MAX_SPLITS,
                    paging,
                    part_o: d.part_o.ptr,
                    part_ml: d.part_ml.ptr,
                    counts: d.counts.ptr,
                    out_f32: d.attn.ptr,
                    out_bf16: 0,
                    rope: true,
                })?,
                // The activation is applied by the up GEMV: SwiGLU or relu2.
                Mixer::Mlp(_) => {}
                Mixer::Mamba(m) => self.mamba(&Mamba {
                    w: m,
                    zxbcdt: d.zxbcdt.ptr,
                    xbc: d.xbc.ptr,
                    y: d.ssm_y.ptr,
                    seqs: batch,
                    steps: 1,
                    slots: d.slots.ptr,
                    positions: d.positions.ptr,
                    prefill: false,
                    out_f32: d.gated.ptr,
                    out_bf16: 0,
                })?,
            }
            self.gemv(&output, batch, 0)?;
        }
        // The final norm once, not in each of the lm_head's many blocks.
        self.rmsnorm(d.x.ptr, &self.norm, batch, d.xn.ptr, 0)?;
        self.lm_head_argmax(batch, d.xn.ptr, d.parts.ptr, d.tokens.ptr, d.positions.ptr)
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
            None => self.step_kernels(batch)?,
        }
        if let Some(p) = self.profiler.as_ref().filter(|p| !p.per_kernel) {
            p.mark("step (GPU)", 0, &self.stream)?;
        }
        Ok(())
    }
}
