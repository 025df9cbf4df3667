//! The Nemotron-H hybrid on the CPU: the f32 reference, computed as transformers' torch path
//! computes it. Attention layers keep K and V in the paged pool as the Llama family does (no
//! RoPE: this family has none); Mamba layers keep each sequence's conv window and SSM state in
//! the pool's state slot that its block table names. Batch invariant as cpu.rs is: every row's
//! numbers are computed the same way whatever else is in the batch.

use super::mamba::{self, Params, State};
use super::{Block, Hybrid};
use crate::backend::{argmax, argmax_rows, score_rows, Backend, DecodeItem, Scored};
use crate::config::ModelConfig;
use crate::cpu::{
    add_in_place, attend, decode_rows, matmul_t, prefill_rows, reference_features, rms_norm,
    store_kv, KvLayer, Linear, Row,
};
use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::kv::{BlockTable, PoolShape};
use crate::weights::Checkpoint;

struct MambaLayer {
    in_proj: Linear,
    out_proj: Linear,
    conv_w: Vec<f32>,
    conv_b: Option<Vec<f32>>,
    dt_bias: Vec<f32>,
    /// A = -exp(A_log), as transformers computes it in f32 at every call.
    a: Vec<f32>,
    d: Vec<f32>,
    norm_w: Vec<f32>,
    /// Which of the pool's Mamba state arrays is this layer's.
    state: usize,
}

struct AttentionLayer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// Which of the pool's K/V arrays is this layer's.
    cache: usize,
}

enum Mixer {
    Mamba(MambaLayer),
    Attention(AttentionLayer),
    Mlp { up: Linear, down: Linear },
}

struct Layer {
    norm: Vec<f32>,
    mixer: Mixer,
}

pub struct HybridCpuBackend {
    cfg: ModelConfig,
    hybrid: Hybrid,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    norm_f: Vec<f32>,
    lm_head: Option<Linear>,
    pool: PoolShape,
    /// Per attention layer: [num_blocks][kv_heads][block_size][head_dim].
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    /// Per Mamba layer: [state_slots][Mamba::state_len()], the conv window first.
    states: Vec<Vec<f32>>,
    faults: Faults,
}

/// Bytes one sequence's recurrent state takes across the Mamba layers, in f32.
pub fn state_slot_bytes(cfg: &ModelConfig) -> usize {
    cfg.hybrid.as_ref().map_or(0, |h| {
        h.count(Block::Mamba) * h.mamba.state_len() * std::mem::size_of::<f32>()
    })
}

impl HybridCpuBackend {
    /// Widens every tensor to f32. The checkpoint must have been validated against `cfg`, and
    /// `pool` must have one state slot per sequence the engine admits at once.
    pub fn load(
        cfg: &ModelConfig,
        ckpt: &Checkpoint,
        pool: PoolShape,
        faults: &Faults,
    ) -> Result<Self> {
        let hybrid = cfg.hybrid.clone().ok_or_else(|| Error::Internal {
            message: "the hybrid backend was given a model without a layer pattern".into(),
        })?;
        let m = &hybrid.mamba;
        let t = |name: &str| -> Result<Vec<f32>> { Ok(ckpt.get(name)?.to_f32()) };
        let linear = |name: &str, out: usize, inp: usize, bias: bool| {
            Linear::load(ckpt, name, out, inp, bias)
        };
        let d = cfg.hidden_size;
        let skipped_norm = faults.skipped_norm_layer(cfg);
        let (mut n_attn, mut n_mamba) = (0, 0);
        let mut layers = Vec::with_capacity(hybrid.blocks.len());
        for (l, block) in hybrid.blocks.iter().enumerate() {
            let p = format!("model.layers.{l}");
            let x = format!("{p}.mixer");
            let mixer = match block {
                Block::Mlp => Mixer::Mlp {
                    up: linear(
                        &format!("{x}.up_proj"),
                        cfg.intermediate_size,
                        d,
                        cfg.mlp_bias,
                    )?,
                    down: linear(
                        &format!("{x}.down_proj"),
                        d,
                        cfg.intermediate_size,
                        cfg.mlp_bias,
                    )?,
                },
                Block::Attention => {
                    n_attn += 1;
                    Mixer::Attention(AttentionLayer {
                        q: linear(&format!("{x}.q_proj"), cfg.q_dim(), d, false)?,
                        k: linear(&format!("{x}.k_proj"), cfg.kv_dim(), d, false)?,
                        v: linear(&format!("{x}.v_proj"), cfg.kv_dim(), d, false)?,
                        o: linear(&format!("{x}.o_proj"), d, cfg.q_dim(), false)?,
                        cache: n_attn - 1,
                    })
                }
                Block::Mamba => {
                    n_mamba += 1;
                    Mixer::Mamba(MambaLayer {
                        in_proj: linear(&format!("{x}.in_proj"), m.in_proj_dim(), d, m.proj_bias)?,
                        out_proj: linear(&format!("{x}.out_proj"), d, m.inner(), m.proj_bias)?,
                        conv_w: t(&format!("{x}.conv1d.weight"))?,
                        conv_b: m
                            .conv_bias
                            .then(|| t(&format!("{x}.conv1d.bias")))
                            .transpose()?,
                        dt_bias: t(&format!("{x}.dt_bias"))?,
                        a: t(&format!("{x}.A_log"))?.iter().map(|v| -v.exp()).collect(),
                        d: t(&format!("{x}.D"))?,
                        norm_w: t(&format!("{x}.norm.weight"))?,
                        state: n_mamba - 1,
                    })
                }
            };
            let norm = if skipped_norm == Some(l) {
                vec![1.0; d]
            } else {
                t(&format!("{p}.norm.weight"))?
            };
            layers.push(Layer { norm, mixer });
        }
        let lm_head = (!cfg.tie_word_embeddings)
            .then(|| linear("lm_head", cfg.vocab_size, d, false))
            .transpose()?;
        let per_layer = pool.num_blocks * pool.block_size * cfg.kv_dim();
        let per_state = pool.state_slots * m.state_len();
        Ok(Self {
            cfg: cfg.clone(),
            embed: t("model.embeddings.weight")?,
            layers,
            norm_f: t("model.norm_f.weight")?,
            lm_head,
            pool,
            // Zeroed allocations are lazily backed: an unused pool costs no resident memory.
            k_cache: (0..n_attn).map(|_| vec![0.0; per_layer]).collect(),
            v_cache: (0..n_attn).map(|_| vec![0.0; per_layer]).collect(),
            states: (0..n_mamba).map(|_| vec![0.0; per_state]).collect(),
            faults: faults.clone(),
            hybrid,
        })
    }

    /// Runs `rows` through the model and returns the logits after each row in `sample`. Rows of
    /// one sequence come in position order; a row at position 0 starts its sequence's state
    /// afresh. `prefill` selects transformers' prefill arithmetic for dt (clamped from below at
    /// `time_step_min`) over its decode step's (not clamped).
    fn forward(&mut self, rows: &[Row<'_>], sample: &[usize], prefill: bool) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (d, n) = (cfg.hidden_size, rows.len());
        let mut x = Vec::with_capacity(n * d);
        for r in rows {
            let t = r.token as usize;
            x.extend_from_slice(&self.embed[t * d..(t + 1) * d]);
        }
        let mut xn = vec![0.0; n * d];
        for layer in &self.layers {
            rms_norm(&x, &layer.norm, cfg.rms_norm_eps, &mut xn);
            let out = match &layer.mixer {
                Mixer::Mlp { up, down } => {
                    // relu2: relu(x)^2.
                    let act: Vec<f32> = up
                        .forward(&xn, n)
                        .into_iter()
                        .map(|v| {
                            let r = v.max(0.0);
                            r * r
                        })
                        .collect();
                    down.forward(&act, n)
                }
                Mixer::Attention(a) => {
                    let (q, k, v) = (
                        a.q.forward(&xn, n),
                        a.k.forward(&xn, n),
                        a.v.forward(&xn, n),
                    );
                    let (kc, vc) = (&mut self.k_cache[a.cache], &mut self.v_cache[a.cache]);
                    let shape = (cfg.num_kv_heads, self.pool.block_size, cfg.head_dim);
                    store_kv(kc, vc, shape, rows, &k, &v);
                    let kv = KvLayer {
                        k: kc,
                        v: vc,
                        num_heads: cfg.num_heads,
                        num_kv_heads: cfg.num_kv_heads,
                        head_dim: cfg.head_dim,
                        block_size: self.pool.block_size,
                    };
                    a.o.forward(&attend(&kv, rows, &q, &self.faults), n)
                }
                Mixer::Mamba(ml) => {
                    let m = &self.hybrid.mamba;
                    let zx = ml.in_proj.forward(&xn, n);
                    let params = Params {
                        conv_w: &ml.conv_w,
                        conv_b: ml.conv_b.as_deref(),
                        dt_bias: &ml.dt_bias,
                        a: &ml.a,
                        d: &ml.d,
                        norm_w: &ml.norm_w,
                    };
                    let dt_min = if prefill { m.time_step_min } else { 0.0 };
                    let (len, conv_len) = (m.state_len(), m.conv_dim() * (m.conv_kernel - 1));
                    let pool = &mut self.states[ml.state];
                    let mut y = Vec::with_capacity(n * m.inner());
                    for (i, r) in rows.iter().enumerate() {
                        let slot = slot_of(r.table)?;
                        let st = &mut pool[slot * len..(slot + 1) * len];
                        if r.position == 0 {
                            st.fill(0.0);
                        }
                        let (conv, ssm) = st.split_at_mut(conv_len);
                        let zi = &zx[i * m.in_proj_dim()..(i + 1) * m.in_proj_dim()];
                        y.extend(mamba::step(
                            m,
                            &params,
                            &mut State { conv, ssm },
                            zi,
                            dt_min,
                        ));
                    }
                    ml.out_proj.forward(&y, n)
                }
            };
            add_in_place(&mut x, &out);
        }
        let mut last = Vec::with_capacity(sample.len() * d);
        for &i in sample {
            last.extend_from_slice(&x[i * d..(i + 1) * d]);
        }
        let mut last_n = vec![0.0; last.len()];
        rms_norm(&last, &self.norm_f, cfg.rms_norm_eps, &mut last_n);
        Ok(match &self.lm_head {
            Some(head) => head.forward(&last_n, sample.len()),
            None => matmul_t(&last_n, sample.len(), &self.embed, cfg.vocab_size, d, None),
        })
    }

    /// The f32 logits after `tokens`, by a prefill into `table`.
    pub fn next_logits(&mut self, tokens: &[u32], table: &BlockTable) -> Result<Vec<f32>> {
        let rows = prefill_rows(tokens, table);
        self.forward(&rows, &[rows.len() - 1], true)
    }

    fn decode_logits(&mut self, items: &[DecodeItem<'_>]) -> Result<Vec<f32>> {
        let rows = decode_rows(items);
        let all: Vec<usize> = (0..rows.len()).collect();
        self.forward(&rows, &all, false)
    }
}

fn slot_of(table: &BlockTable) -> Result<usize> {
    table
        .state_slot
        .map(|s| s as usize)
        .ok_or_else(|| Error::Internal {
            message: "a sequence of a hybrid model has no recurrent-state slot; the pool was \
                      built without state slots"
                .into(),
        })
}

impl Backend for HybridCpuBackend {
    fn prefill(&mut self, tokens: &[u32], table: &BlockTable) -> Result<u32> {
        Ok(argmax(&self.next_logits(tokens, table)?))
    }

    fn decode(&mut self, items: &[DecodeItem<'_>]) -> Result<Vec<u32>> {
        Ok(argmax_rows(
            &self.decode_logits(items)?,
            self.cfg.vocab_size,
        ))
    }

    fn prefill_scored(&mut self, tokens: &[u32], table: &BlockTable, next: u32) -> Result<Scored> {
        Ok(Scored::of(&self.next_logits(tokens, table)?, next))
    }

    fn decode_scored(&mut self, items: &[DecodeItem<'_>], forced: &[u32]) -> Result<Vec<Scored>> {
        let logits = self.decode_logits(items)?;
        Ok(score_rows(&logits, self.cfg.vocab_size, forced))
    }

    fn pool(&self) -> PoolShape {
        self.pool
    }

    fn features(&self) -> serde_json::Value {
        let mut f = reference_features(&self.cfg.dtype);
        f["hybrid"] = self.hybrid.features("sequential");
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{resolve_pool, BlockAllocator, PoolSize};

    fn tiny() -> HybridCpuBackend {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../goldens/tiny-nemotron-h/model");
        let cfg = ModelConfig::load(&dir).unwrap();
        let ckpt = Checkpoint::open(&dir).unwrap();
        ckpt.validate(&cfg).unwrap();
        let pool = resolve_pool(&cfg, 16, PoolSize::Blocks(32), 4)
            .unwrap()
            .with_state_slots(2, state_slot_bytes(&cfg));
        HybridCpuBackend::load(&cfg, &ckpt, pool, &Faults::default()).unwrap()
    }

    /// Prefill of the whole sequence against prefill of its first part then one decode step per
    /// token (the recurrent path), and two sequences decoded side by side: the same logits.
    #[test]
    fn prefill_and_decode_agree_and_sequences_keep_their_own_state() {
        let mut b = tiny();
        let mut alloc = BlockAllocator::new(b.pool());
        let seq: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 400 + 3).collect();
        let (head, tail) = seq.split_at(25);
        let t_full = alloc.reserve(64).unwrap();
        let full = b.next_logits(&seq, &t_full).unwrap();
        alloc.release(t_full);
        let (ta, tb) = (alloc.reserve(64).unwrap(), alloc.reserve(64).unwrap());
        assert_ne!(ta.state_slot, tb.state_slot);
        b.next_logits(head, &ta).unwrap();
        // Another sequence in the other slot, decoded in the same steps.
        let other: Vec<u32> = (0..7).map(|i| i * 5 + 9).collect();
        b.next_logits(&other, &tb).unwrap();
        let mut last = vec![];
        for (k, &tok) in tail.iter().enumerate() {
            let items = [
                DecodeItem {
                    token: tok,
                    position: head.len() + k,
                    table: &ta,
                },
                DecodeItem {
                    token: 3,
                    position: other.len() + k,
                    table: &tb,
                },
            ];
            last = b.decode_logits(&items).unwrap();
        }
        let stepped = &last[..b.cfg.vocab_size];
        let worst = full
            .iter()
            .zip(stepped)
            .map(|(a, c)| (a - c).abs())
            .fold(0.0f32, f32::max);
        let scale = full.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // Only the order of f32 sums differs between the two paths (prefill clamps dt at
        // time_step_min, which this checkpoint's dt never reaches).
        assert!(
            worst <= 1e-4 * scale.max(1.0),
            "worst {worst}, scale {scale}"
        );
        assert_eq!(argmax(&full), argmax(stepped));
    }
}
