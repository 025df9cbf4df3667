//! The CUDA backend: bf16 weights uploaded straight from the mapped safetensors, a bf16 paged
//! KV cache, NVRTC-compiled kernels (engine/kernels), cuBLAS GEMMs for prefill, and decode
//! steps captured once per batch size into CUDA graphs and replayed. Everything a step changes
//! (tokens, positions) lives on the device and is advanced by the step itself, so a step is one
//! graph launch plus the read of the chosen tokens.
//!
//! This file holds the backend's state and the [`Backend`] methods; `load` builds it, `ops`
//! launches one kernel each, `step` is the decode step and its graphs, `profiler` times them.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaGraph, CudaStream};

use super::device::{driver_err, DevBuf};
use super::gemm::Rows;
use super::kernels;
use super::load::{DecodeBufs, Funcs, Matrix, Mixer, PrefillBufs, Sublayer, VerifyBufs};
use super::ops::{Attention, Mamba, Paging};
use super::plan::{self, PrefillLayout, StepPath, PREFILL_CHUNK};
use super::profiler::Profiler;
use crate::backend::{Backend, DecodeItem, Scored};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::kv::{BlockTable, PoolShape};

pub(super) const BF16: usize = 2;
pub(super) const F32: usize = 4;

/// What the device holds for the running batch, to skip re-uploading it.
#[derive(Clone, PartialEq)]
pub(super) struct RowState {
    pub first_block: u32,
    pub slot: Option<u32>,
    pub position: usize,
    pub token: u32,
}

pub struct CudaBackend {
    pub(super) cfg: ModelConfig,
    pub(super) pool: PoolShape,
    pub(super) max_batch: usize,
    pub(super) device_name: String,
    pub(super) arch: String,
    pub(super) sms: usize,
    pub(super) kernels: kernels::Provenance,
    /// Which GEMV shapes run on the tensor cores (tune.rs).
    pub(super) tuning: super::tune::Tuning,
    /// Which batches run the GEMVs and which cuBLAS (paths.rs).
    pub(super) paths: super::paths::StepPaths,
    pub(super) degraded: Vec<String>,
    pub(super) use_graphs: bool,
    /// Programmatic dependent launch (device.rs `launch`): Hopper and later.
    pub(super) pdl: bool,
    pub(super) profiler: Option<Profiler>,
    // Field order is drop order: graphs and buffers go before the module, stream and context.
    pub(super) graphs: Vec<Option<CudaGraph>>,
    pub(super) rows: Vec<RowState>,
    pub(super) host_tables: Vec<i32>,
    pub(super) host_tokens: Vec<i32>,
    pub(super) dec: DecodeBufs,
    pub(super) pf: Option<PrefillBufs>,
    pub(super) verify: Option<VerifyBufs>,
    /// Planted faults (fault.rs): the kernel ones are compiled in, `attn_scale_d` is the
    /// attention's scale, the weight ones were planted at load.
    pub(super) faults: Faults,
    pub(super) layers: Vec<Sublayer>,
    pub(super) embed: Matrix,
    pub(super) norm: DevBuf,
    pub(super) lm_head: Option<Matrix>,
    pub(super) inv_freq: DevBuf,
    pub(super) k_cache: Vec<DevBuf>,
    pub(super) v_cache: Vec<DevBuf>,
    /// Per Mamba layer, every state slot's conv window [slots][conv_dim][K - 1] and SSM state
    /// [slots][heads][N][head_dim], f32 (mamba.cu).
    pub(super) conv_state: Vec<DevBuf>,
    pub(super) ssm_state: Vec<DevBuf>,
    pub(super) f: Funcs,
    /// cuBLASLt and the algorithm pinned for each GEMM shape (gemm.rs).
    pub(super) gemms: super::gemm::GemmTuning,
    /// cuBLASLt's workspace, given to every GEMM so those captured into graphs allocate nothing.
    pub(super) gemm_workspace: DevBuf,
    pub(super) lt: super::gemm::Lt,
    pub(super) _module: super::kernels::Kernels,
    pub(super) stream: Arc<CudaStream>,
    pub(super) ctx: Arc<CudaContext>,
}

impl CudaBackend {
    pub(super) fn qkv_width(&self) -> usize {
        self.cfg.q_dim() + 2 * self.cfg.kv_dim()
    }

    pub(super) fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_err("synchronize"))
    }

    /// The lm_head's weights: the embedding when they are tied.
    pub(super) fn lm_head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
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
            self.max_batch,
        )?);
        Ok(())
    }

    /// The prompts through the model together (plan.rs `prefill_passes`: each cut as it is alone,
    /// the pieces packed shortest prompt first into passes of up to PREFILL_CHUNK rows, each GEMM
    /// one over each class of prompt length's rows through the algorithm pinned for it, so a
    /// prompt's bits are those of its prefill alone: gemm.rs), each one's K and V into its
    /// table's blocks and its recurrent state into its slot. The prompts' last rows go in the
    /// order their passes end them; returned is each prompt's row there: prompt k's last row,
    /// normalised, is row `rows[k]` of `last_xn`, and its greedy token `tokens_out[rows[k]]`
    /// (not read).
    fn prefill_forward(&mut self, seqs: &[(&[u32], &BlockTable)]) -> Result<Vec<usize>> {
        if seqs.is_empty() || seqs.len() > self.max_batch {
            return Err(Error::Internal {
                message: format!(
                    "prefill of {} prompts at once, outside 1..={}",
                    seqs.len(),
                    self.max_batch
                ),
            });
        }
        let lens: Vec<usize> = seqs.iter().map(|(t, _)| t.len()).collect();
        let passes = plan::prefill_passes(&lens, PREFILL_CHUNK);
        let widest = passes
            .iter()
            .map(|p| p.iter().map(|s| s.len).sum::<usize>())
            .max()
            .unwrap_or(1);
        self.prefill_bufs(widest)?;
        let h = self.cfg.hidden_size;
        let max_blocks = self.dec.layout.max_blocks;
        let pf = self.pf.as_ref().expect("allocated above");
        // Prompt k's block table is row k of `tables`; each row of a pass names its prompt.
        let mut tables = vec![0i32; seqs.len() * max_blocks];
        for (k, (_, t)) in seqs.iter().enumerate() {
            for (dst, &b) in tables[k * max_blocks..].iter_mut().zip(&t.blocks) {
                *dst = b as i32;
            }
        }
        pf.tables.write(0, &tables)?;
        let paging = Paging {
            positions: pf.positions.ptr,
            row_table: pf.row_table.ptr,
            tables: pf.tables.ptr,
            max_blocks,
        };
        let (mut rows_of, mut ended) = (vec![0; seqs.len()], 0);
        for (p, pass) in passes.iter().enumerate() {
            let n: usize = pass.iter().map(|s| s.len).sum();
            let (mut ids, mut pos, mut row_table) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            let (mut starts, mut slots) = (Vec::new(), Vec::new());
            for s in pass {
                let (tokens, table) = seqs[s.seq];
                ids.extend(tokens[s.from..s.from + s.len].iter().map(|&t| t as i32));
                pos.extend((s.from..s.from + s.len).map(|q| q as i32));
                row_table.extend(std::iter::repeat_n(s.seq as i32, s.len));
                starts.push(s.row as i32);
                slots.push(table.state_slot.unwrap_or(0) as i32);
            }
            starts.push(n as i32);
            // What the GEMMs need to split the pass: each segment's prompt length and rows.
            let pieces: Vec<(usize, usize)> = pass.iter().map(|s| (lens[s.seq], s.len)).collect();
            let rows = Rows::Prefill(&pieces);
            if p > 0 {
                // The uploads are synchronous copies on the legacy stream, which does not wait
                // for `self.stream` (non-blocking): the previous pass's kernels, still reading
                // these buffers (positions in every layer), must finish before they change.
                self.sync()?;
            }
            pf.tokens.write(0, &ids)?;
            pf.positions.write(0, &pos)?;
            pf.row_table.write(0, &row_table)?;
            pf.starts.write(0, &starts)?;
            pf.slots.write(0, &slots)?;
            let tiles = plan::attention_prefill_tiles(pass);
            pf.tiles.write(0, tiles.as_flattened())?;
            if let Some(p) = &self.profiler {
                p.begin_pass(n, &self.stream)?;
            }
            self.embed(pf.tokens.ptr, pf.x.ptr, n)?;
            for l in &self.layers {
                self.rmsnorm(pf.x.ptr, &l.norm, n, 0, pf.xn_bf16.ptr)?;
                match &l.mixer {
                    Mixer::Attention(a) => {
                        self.blas_gemm(
                            "gemm_qkv",
                            &a.qkv,
                            pf.xn_bf16.ptr,
                            pf.qkv.ptr,
                            rows,
                            false,
                        )?;
                        self.rope_kv(a, pf.qkv.ptr, n, paging)?;
                        if self.f.attention_prefill.is_some() {
                            self.attention_prefill(
                                a,
                                pf.qkv.ptr,
                                paging,
                                pf.tiles.ptr,
                                tiles.len(),
                                pf.attn_bf16.ptr,
                            )?;
                        } else {
                            // One split per row: its scratch is never touched.
                            self.attention(&Attention {
                                w: a,
                                qkv: pf.qkv.ptr,
                                rows: n,
                                splits: 1,
                                paging,
                                part_o: 0,
                                part_ml: 0,
                                counts: 0,
                                out_f32: 0,
                                out_bf16: pf.attn_bf16.ptr,
                                rope: false,
                            })?;
                        }
                        self.blas_gemm("gemm_o", &a.o, pf.attn_bf16.ptr, pf.x.ptr, rows, true)?;
                    }
                    Mixer::Mlp(m) => {
                        self.blas_gemm(
                            "gemm_up",
                            &m.up,
                            pf.xn_bf16.ptr,
                            pf.gate_up.ptr,
                            rows,
                            false,
                        )?;
                        self.mlp_activation(m, pf.gate_up.ptr, pf.act_bf16.ptr, n)?;
                        self.blas_gemm(
                            "gemm_down",
                            &m.down,
                            pf.act_bf16.ptr,
                            pf.x.ptr,
                            rows,
                            true,
                        )?;
                    }
                    Mixer::Mamba(m) => {
                        self.blas_gemm(
                            "gemm_in_proj",
                            &m.in_proj,
                            pf.xn_bf16.ptr,
                            pf.zxbcdt.ptr,
                            rows,
                            false,
                        )?;
                        self.mamba(&Mamba {
                            w: m,
                            zxbcdt: pf.zxbcdt.ptr,
                            xbc: pf.xbc.ptr,
                            y: pf.ssm_y.ptr,
                            segments: pass.len(),
                            rows: n,
                            starts: pf.starts.ptr,
                            slots: pf.slots.ptr,
                            positions: pf.positions.ptr,
                            prefill: true,
                            staged_step: false,
                            conv_chunks: plan::mamba_conv_chunks(
                                pass.iter().map(|s| s.len),
                                plan::MAMBA_CONV_ROWS,
                            ),
                            out_f32: 0,
                            out_bf16: pf.gated_bf16.ptr,
                        })?;
                        self.blas_gemm(
                            "gemm_out_proj",
                            &m.out_proj,
                            pf.gated_bf16.ptr,
                            pf.x.ptr,
                            rows,
                            true,
                        )?;
                    }
                }
            }
            // Each prompt that ends in this pass: its last row's norm, then the greedy tokens
            // of up to eight such prompts from one read of the lm_head (a read per prompt was
            // 3.8% of Nemotron-H-8B's batch-32 prefill), each the token it gets alone.
            let first = ended;
            for s in pass.iter().filter(|s| s.ends(lens[s.seq])) {
                let last = pf.x.at((s.row + s.len - 1) * h, F32);
                self.rmsnorm(last, &self.norm, 1, pf.last_xn.at(ended * h, F32), 0)?;
                rows_of[s.seq] = ended;
                ended += 1;
            }
            for j in (first..ended).step_by(plan::MAX_GEMV_BATCH) {
                let batch = (ended - j).min(plan::MAX_GEMV_BATCH);
                let (xn, tokens) = (pf.last_xn.at(j * h, F32), pf.tokens_out.at(j, F32));
                self.lm_head_argmax(1, batch, xn, pf.parts.ptr, tokens, 0)?;
            }
            if let Some(p) = self.profiler.as_ref().filter(|p| p.prefill) {
                self.sync()?;
                p.end_pass()?;
            }
        }
        Ok(rows_of)
    }

    fn check_batch(&self, batch: usize) -> Result<()> {
        if batch == 0 || batch > self.max_batch {
            return Err(Error::Internal {
                message: format!("decode batch {batch} outside 1..={}", self.max_batch),
            });
        }
        Ok(())
    }

    /// The device's rows after a step from `wanted`: one position on, holding `tokens`.
    fn advance_rows(&mut self, wanted: Vec<RowState>, tokens: impl Iterator<Item = u32>) {
        self.rows = wanted
            .into_iter()
            .zip(tokens)
            .map(|(mut r, t)| {
                r.position += 1;
                r.token = t;
                r
            })
            .collect();
    }

    /// The verify request's scratch, allocated at its first use.
    fn verify_bufs(&mut self) -> Result<()> {
        if self.verify.is_none() {
            self.verify = Some(VerifyBufs::new(&self.cfg, self.max_batch)?);
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn prefill(&mut self, tokens: &[u32], table: &BlockTable) -> Result<u32> {
        Ok(self.prefill_many(&[(tokens, table)])?[0])
    }

    fn prefill_many(&mut self, seqs: &[(&[u32], &BlockTable)]) -> Result<Vec<u32>> {
        let rows = self.prefill_forward(seqs)?;
        let pf = self.pf.as_ref().expect("allocated by prefill_forward");
        let mut got = vec![0i32; seqs.len()];
        pf.tokens_out.read(&mut got, &self.stream)?;
        Ok(rows.iter().map(|&j| got[j] as u32).collect())
    }

    fn prefill_many_scored(
        &mut self,
        seqs: &[(&[u32], &BlockTable)],
        next: &[u32],
    ) -> Result<Vec<Scored>> {
        self.verify_bufs()?;
        let rows = self.prefill_forward(seqs)?;
        let pf = self.pf.as_ref().expect("allocated by prefill_forward");
        let h = self.cfg.hidden_size;
        rows.iter()
            .enumerate()
            .map(|(k, &j)| {
                let (xn, token) = (pf.last_xn.at(j * h, F32), pf.tokens_out.at(j, F32));
                Ok(self.score(1, xn, token, &next[k..k + 1], None)?[0])
            })
            .collect()
    }

    fn decode(&mut self, items: &[DecodeItem<'_>]) -> Result<Vec<u32>> {
        let batch = items.len();
        self.check_batch(batch)?;
        let wanted = self.upload_rows(items)?;
        let wall = self.profiler.as_ref().map(|_| std::time::Instant::now());
        self.run_step(batch)?;
        let mut toks = vec![0i32; batch];
        self.dec.tokens.read(&mut toks, &self.stream)?;
        if let (Some(p), Some(wall)) = (self.profiler.as_ref().filter(|p| !p.prefill), wall) {
            p.end_step(wall.elapsed().as_secs_f64())?;
        }
        self.advance_rows(wanted, toks.iter().map(|&t| t as u32));
        Ok(toks.into_iter().map(|t| t as u32).collect())
    }

    fn prefill_scored(&mut self, tokens: &[u32], table: &BlockTable, next: u32) -> Result<Scored> {
        Ok(self.prefill_many_scored(&[(tokens, table)], &[next])?[0])
    }

    /// The same graph (or kernels) as `decode`, then the scoring kernels after it; the device's
    /// next tokens become the forced ones.
    fn decode_scored(&mut self, items: &[DecodeItem<'_>], forced: &[u32]) -> Result<Vec<Scored>> {
        let batch = items.len();
        self.check_batch(batch)?;
        self.verify_bufs()?;
        let wanted = self.upload_rows(items)?;
        self.run_step(batch)?;
        // cuBLAS's step leaves its bf16-rounded logits: the ones its argmax compared.
        let step_logits = (self.path(batch) == StepPath::Blas).then_some(self.dec.logits.ptr);
        let scores = self.score(
            batch,
            self.dec.xn.ptr,
            self.dec.tokens.ptr,
            forced,
            step_logits,
        )?;
        self.advance_rows(wanted, forced.iter().copied());
        Ok(scores)
    }

    fn pool(&self) -> PoolShape {
        self.pool
    }

    fn features(&self) -> serde_json::Value {
        let mut f = serde_json::json!({
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
            "gemv_tuning": self.tuning,
            "step_paths": self.paths,
            "max_batch": self.max_batch,
            "prefill_gemm": "cublasLt bf16 -> f32 (bf16 for the MLP's up, read once by its activation), an algorithm pinned per shape and class of prompt length, run through its fastest twin of the same bits (gemm_tuning)",
            "gemm_tuning": self.gemms,
            "load_cache": self.load_cache(),
            "degraded": self.degraded,
        });
        if let Some(h) = &self.cfg.hybrid {
            f["hybrid"] = h.features(
                "the scan sequential over a prefill chunk's tokens, its state in registers and its \
                 inputs staged two tiles deep; the conv in chunks of rows (mamba.cu)",
            );
        }
        f
    }
}

impl CudaBackend {
    /// What this load compiled or timed, and whether each came from the caches (kernels.rs,
    /// tune.rs, gemm.rs, paths.rs); the step paths only where there was a choice to time.
    fn load_cache(&self) -> serde_json::Value {
        let mut parts = vec![
            ("kernels", self.kernels.from_cache),
            ("GEMV tuning", self.tuning.from_cache),
            ("GEMM tuning", self.gemms.from_cache),
        ];
        if self.paths.timing.is_some() {
            parts.push(("step paths", self.paths.from_cache));
        }
        crate::protocol::load_cache(&parts)
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
