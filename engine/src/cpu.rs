//! The CPU reference backend: f32 throughout (weights widened at load), computed the way
//! transformers computes the same model, so that every faster backend can be checked against it.
//! Parallel over output features and attention heads with rayon; each output element is always
//! summed in the same order whatever the batch, so batch N gives batch 1's tokens exactly.

use rayon::prelude::*;

use crate::backend::{argmax, argmax_rows, score_rows, Backend, DecodeItem, Scored};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::fault::{Fault, Faults};
use crate::kv::{BlockTable, PoolShape};
use crate::rope;
use crate::weights::Checkpoint;

pub(crate) struct Linear {
    /// [out, in], row-major, as torch stores `nn.Linear.weight`.
    pub w: Vec<f32>,
    pub b: Option<Vec<f32>>,
    pub out: usize,
    pub inp: usize,
}

struct Layer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    gate: Linear,
    up: Linear,
    down: Linear,
}

pub struct CpuBackend {
    cfg: ModelConfig,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None` when the output projection is tied to the embedding.
    lm_head: Option<Linear>,
    inv_freq: Vec<f32>,
    pool: PoolShape,
    /// Per layer: [num_blocks][kv_heads][block_size][head_dim].
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    /// Planted faults (fault.rs); empty for a clean build.
    faults: Faults,
}

/// One token position in a forward pass.
pub(crate) struct Row<'a> {
    pub token: u32,
    pub position: usize,
    pub table: &'a BlockTable,
}

/// The paged KV storage of one attention layer and how to read it: [num_blocks][kv_heads]
/// [block_size][head_dim] for K and for V.
pub(crate) struct KvLayer<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

impl KvLayer<'_> {
    pub fn offset(&self, block: usize, kv_head: usize, slot: usize) -> usize {
        cache_offset(
            self.num_kv_heads,
            self.block_size,
            self.head_dim,
            block,
            kv_head,
            slot,
        )
    }
}

pub(crate) fn cache_offset(
    kv_heads: usize,
    block_size: usize,
    head_dim: usize,
    block: usize,
    kv_head: usize,
    slot: usize,
) -> usize {
    ((block * kv_heads + kv_head) * block_size + slot) * head_dim
}

/// Writes each row's K and V (`[rows][kv_heads * head_dim]`) at its position. Every row goes
/// in before any row attends, so the rows of one prefill see each other (causally).
pub(crate) fn store_kv(
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    shape: (usize, usize, usize),
    rows: &[Row<'_>],
    k: &[f32],
    v: &[f32],
) {
    let (kv_heads, block_size, hd) = shape;
    for (i, r) in rows.iter().enumerate() {
        let (block, slot) = r.table.locate(r.position);
        for kvh in 0..kv_heads {
            let dst = cache_offset(kv_heads, block_size, hd, block, kvh, slot);
            let src = (i * kv_heads + kvh) * hd;
            k_cache[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
            v_cache[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
        }
    }
}

/// Causal GQA attention of each row over its sequence's cached positions `0..=position`, with
/// the planted attention faults (`faults`; none for a clean build).
pub(crate) fn attend(kv: &KvLayer<'_>, rows: &[Row<'_>], q: &[f32], faults: &Faults) -> Vec<f32> {
    let (hd, heads) = (kv.head_dim, kv.num_heads);
    let q_dim = heads * hd;
    let group = heads / kv.num_kv_heads;
    let scale = faults.attention_scale(hd);
    let kv_shift = usize::from(faults.has(Fault::KvGroup));
    let nan_past_512 = faults.has(Fault::NanPast512);
    let mut out = vec![0.0; rows.len() * q_dim];
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (i, head) = (idx / heads, idx % heads);
        let r = &rows[i];
        if nan_past_512 && r.position >= 512 {
            o.fill(f32::NAN);
            return;
        }
        let kvh = (head / group + kv_shift) % kv.num_kv_heads;
        let qh = &q[i * q_dim + head * hd..][..hd];
        let mut scores: Vec<f32> = (0..=r.position)
            .map(|p| {
                let (block, slot) = r.table.locate(p);
                dot(qh, &kv.k[kv.offset(block, kvh, slot)..][..hd]) * scale
            })
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for s in &mut scores {
            *s = (*s - max).exp();
            sum += *s;
        }
        for (p, s) in scores.iter().enumerate() {
            let (block, slot) = r.table.locate(p);
            let w = s / sum;
            for (a, b) in o.iter_mut().zip(&kv.v[kv.offset(block, kvh, slot)..][..hd]) {
                *a += w * b;
            }
        }
    });
    out
}

impl CpuBackend {
    /// Widens every tensor to f32. The checkpoint must have been validated against `cfg`, and
    /// `faults` checked against it; the weight faults (`norm_skip`, `drop_bias`) are planted
    /// here.
    pub fn load(
        cfg: &ModelConfig,
        ckpt: &Checkpoint,
        pool: PoolShape,
        faults: &Faults,
    ) -> Result<Self> {
        let t = |name: &str| -> Result<Vec<f32>> { Ok(ckpt.get(name)?.to_f32()) };
        let linear = |name: &str, out: usize, inp: usize, bias: bool| {
            Linear::load(ckpt, name, out, inp, bias)
        };
        let (h, q, kv, i) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let qkv_bias = cfg.qkv_bias && !faults.has(Fault::DropBias);
        let skipped_norm = faults.skipped_norm_layer(cfg);
        let layers = (0..cfg.num_layers)
            .into_par_iter()
            .map(|l| -> Result<Layer> {
                let p = format!("model.layers.{l}");
                let a = format!("{p}.self_attn");
                let m = format!("{p}.mlp");
                let input_norm = if skipped_norm == Some(l) {
                    vec![1.0; h]
                } else {
                    t(&format!("{p}.input_layernorm.weight"))?
                };
                Ok(Layer {
                    input_norm,
                    post_norm: t(&format!("{p}.post_attention_layernorm.weight"))?,
                    q: linear(&format!("{a}.q_proj"), q, h, qkv_bias)?,
                    k: linear(&format!("{a}.k_proj"), kv, h, qkv_bias)?,
                    v: linear(&format!("{a}.v_proj"), kv, h, qkv_bias)?,
                    o: linear(&format!("{a}.o_proj"), h, q, cfg.o_bias)?,
                    q_norm: cfg
                        .qk_norm
                        .then(|| t(&format!("{a}.q_norm.weight")))
                        .transpose()?,
                    k_norm: cfg
                        .qk_norm
                        .then(|| t(&format!("{a}.k_norm.weight")))
                        .transpose()?,
                    gate: linear(&format!("{m}.gate_proj"), i, h, cfg.mlp_bias)?,
                    up: linear(&format!("{m}.up_proj"), i, h, cfg.mlp_bias)?,
                    down: linear(&format!("{m}.down_proj"), h, i, cfg.mlp_bias)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(linear("lm_head", cfg.vocab_size, h, false)?)
        };
        let per_layer = pool.num_blocks * pool.block_size * kv;
        Ok(Self {
            cfg: cfg.clone(),
            embed: t("model.embed_tokens.weight")?,
            layers,
            norm: t("model.norm.weight")?,
            lm_head,
            inv_freq: rope::inv_freq(&cfg.rope, cfg.head_dim),
            pool,
            // Zeroed allocations are lazily backed: an unused pool costs no resident memory.
            k_cache: (0..cfg.num_layers).map(|_| vec![0.0; per_layer]).collect(),
            v_cache: (0..cfg.num_layers).map(|_| vec![0.0; per_layer]).collect(),
            faults: faults.clone(),
        })
    }

    /// Runs `rows` through the model and returns the logits after each row in `sample`, one
    /// vocabulary-long row each. `rope_shift` rotates q and k that many positions ahead (the
    /// `rope_shift` fault's decode steps; 0 otherwise).
    fn forward(&mut self, rows: &[Row<'_>], sample: &[usize], rope_shift: usize) -> Vec<f32> {
        let cfg = &self.cfg;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let n = rows.len();
        let mut x = Vec::with_capacity(n * h);
        for r in rows {
            let t = r.token as usize;
            x.extend_from_slice(&self.embed[t * h..(t + 1) * h]);
        }
        let mut xn = vec![0.0; n * h];
        for (li, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, &layer.input_norm, cfg.rms_norm_eps, &mut xn);
            let mut q = layer.q.forward(&xn, n);
            let mut k = layer.k.forward(&xn, n);
            let v = layer.v.forward(&xn, n);
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                rms_norm_in_place(&mut q, qn, cfg.rms_norm_eps);
                rms_norm_in_place(&mut k, kn, cfg.rms_norm_eps);
            }
            for (i, r) in rows.iter().enumerate() {
                let at = r.position + rope_shift;
                for head in q[i * cfg.q_dim()..(i + 1) * cfg.q_dim()].chunks_exact_mut(hd) {
                    rope::apply(head, &self.inv_freq, at);
                }
                for head in k[i * cfg.kv_dim()..(i + 1) * cfg.kv_dim()].chunks_exact_mut(hd) {
                    rope::apply(head, &self.inv_freq, at);
                }
            }
            store_kv(
                &mut self.k_cache[li],
                &mut self.v_cache[li],
                (cfg.num_kv_heads, self.pool.block_size, hd),
                rows,
                &k,
                &v,
            );
            let kv = KvLayer {
                k: &self.k_cache[li],
                v: &self.v_cache[li],
                num_heads: cfg.num_heads,
                num_kv_heads: cfg.num_kv_heads,
                head_dim: hd,
                block_size: self.pool.block_size,
            };
            let attn = attend(&kv, rows, &q, &self.faults);
            let o = layer.o.forward(&attn, n);
            add_in_place(&mut x, &o);
            rms_norm(&x, &layer.post_norm, cfg.rms_norm_eps, &mut xn);
            let gate = layer.gate.forward(&xn, n);
            let up = layer.up.forward(&xn, n);
            let act: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| silu(g) * u).collect();
            let down = layer.down.forward(&act, n);
            add_in_place(&mut x, &down);
        }
        let m = sample.len();
        let mut last = Vec::with_capacity(m * h);
        for &i in sample {
            last.extend_from_slice(&x[i * h..(i + 1) * h]);
        }
        let mut last_n = vec![0.0; m * h];
        rms_norm(&last, &self.norm, cfg.rms_norm_eps, &mut last_n);
        match &self.lm_head {
            Some(head) => head.forward(&last_n, m),
            None => matmul_t(&last_n, m, &self.embed, cfg.vocab_size, h, None),
        }
    }

    /// The f32 logits after `tokens`, by a prefill into `table`: the reference a verify pass's
    /// scores are checked against.
    pub fn next_logits(&mut self, tokens: &[u32], table: &BlockTable) -> Vec<f32> {
        let rows = prefill_rows(tokens, table);
        self.forward(&rows, &[rows.len() - 1], 0)
    }

    fn decode_logits(&mut self, items: &[DecodeItem<'_>]) -> Vec<f32> {
        let rows = decode_rows(items);
        let all: Vec<usize> = (0..rows.len()).collect();
        let shift = self.faults.decode_rope_shift();
        self.forward(&rows, &all, shift)
    }
}

/// One row per decode item.
pub(crate) fn decode_rows<'a>(items: &[DecodeItem<'a>]) -> Vec<Row<'a>> {
    items
        .iter()
        .map(|it| Row {
            token: it.token,
            position: it.position,
            table: it.table,
        })
        .collect()
}

/// The `features` of `ready` for the f32 reference backends (docs/PROTOCOL.md).
pub(crate) fn reference_features(weights_dtype: &str) -> serde_json::Value {
    serde_json::json!({
        "backend": "cpu",
        "device": "cpu",
        "dtype": "float32",
        "weights_dtype": weights_dtype,
        "cuda_graphs": false,
        "threads": rayon::current_num_threads(),
        "kernels": ["rust-f32-reference"],
        "load_cache": crate::protocol::load_cache(&[]),
        "degraded": [],
    })
}

pub(crate) fn prefill_rows<'a>(tokens: &[u32], table: &'a BlockTable) -> Vec<Row<'a>> {
    tokens
        .iter()
        .enumerate()
        .map(|(position, &token)| Row {
            token,
            position,
            table,
        })
        .collect()
}

impl Backend for CpuBackend {
    fn prefill(&mut self, tokens: &[u32], table: &BlockTable) -> Result<u32> {
        Ok(argmax(&self.next_logits(tokens, table)))
    }

    fn decode(&mut self, items: &[DecodeItem<'_>]) -> Result<Vec<u32>> {
        Ok(argmax_rows(&self.decode_logits(items), self.cfg.vocab_size))
    }

    fn prefill_scored(&mut self, tokens: &[u32], table: &BlockTable, next: u32) -> Result<Scored> {
        Ok(Scored::of(&self.next_logits(tokens, table), next))
    }

    fn decode_scored(&mut self, items: &[DecodeItem<'_>], forced: &[u32]) -> Result<Vec<Scored>> {
        let logits = self.decode_logits(items);
        Ok(score_rows(&logits, self.cfg.vocab_size, forced))
    }

    fn pool(&self) -> PoolShape {
        self.pool
    }

    fn features(&self) -> serde_json::Value {
        reference_features(&self.cfg.dtype)
    }
}

impl Linear {
    /// `{name}.weight` (and `{name}.bias` with `bias`), widened to f32.
    pub fn load(ckpt: &Checkpoint, name: &str, out: usize, inp: usize, bias: bool) -> Result<Self> {
        let t = |n: String| -> Result<Vec<f32>> { Ok(ckpt.get(&n)?.to_f32()) };
        Ok(Linear {
            w: t(format!("{name}.weight"))?,
            b: bias.then(|| t(format!("{name}.bias"))).transpose()?,
            out,
            inp,
        })
    }

    pub fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        matmul_t(x, rows, &self.w, self.out, self.inp, self.b.as_deref())
    }
}

/// `x [rows, inp] @ w[out, inp]^T + b`, parallel over blocks of output features. Each element is
/// one `dot`, so its value does not depend on `rows`.
pub(crate) fn matmul_t(
    x: &[f32],
    rows: usize,
    w: &[f32],
    out: usize,
    inp: usize,
    b: Option<&[f32]>,
) -> Vec<f32> {
    const BLOCK: usize = 32;
    let mut t = vec![0.0; out * rows]; // [out, rows]
    t.par_chunks_mut(BLOCK * rows)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (j, dst) in chunk.chunks_exact_mut(rows).enumerate() {
                let o = c * BLOCK + j;
                let wo = &w[o * inp..(o + 1) * inp];
                let bias = b.map_or(0.0, |b| b[o]);
                for (r, d) in dst.iter_mut().enumerate() {
                    *d = dot(&x[r * inp..(r + 1) * inp], wo) + bias;
                }
            }
        });
    if rows == 1 {
        return t;
    }
    let mut y = vec![0.0; rows * out];
    for o in 0..out {
        for r in 0..rows {
            y[r * out + o] = t[o * rows + r];
        }
    }
    y
}

/// Eight independent partial sums, so the compiler vectorises it; a fixed order, so it is
/// reproducible.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, at) = a.split_at(a.len() / 8 * 8);
    let (bc, bt) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in at.iter().zip(bt) {
        s += x * y;
    }
    s
}

pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub(crate) fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// transformers' RMSNorm: `w * (x * rsqrt(mean(x^2) + eps))`, row by row (row = `w.len()`).
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(w.len()).zip(out.chunks_exact_mut(w.len())) {
        let inv = 1.0 / (xr.iter().map(|v| v * v).sum::<f32>() / w.len() as f32 + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = g * (v * inv);
        }
    }
}

fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let copy = x.to_vec();
    rms_norm(&copy, w, eps, x);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_naive_and_is_batch_invariant() {
        let (rows, out, inp) = (3, 70, 19);
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let b: Vec<f32> = (0..out).map(|i| i as f32 / 10.0).collect();
        let y = matmul_t(&x, rows, &w, out, inp, Some(&b));
        for r in 0..rows {
            let single = matmul_t(&x[r * inp..(r + 1) * inp], 1, &w, out, inp, Some(&b));
            assert_eq!(&y[r * out..(r + 1) * out], &single[..]);
            for o in 0..out {
                let naive: f64 = (0..inp)
                    .map(|i| x[r * inp + i] as f64 * w[o * inp + i] as f64)
                    .sum::<f64>()
                    + b[o] as f64;
                assert!((y[r * out + o] as f64 - naive).abs() < 1e-4, "{r},{o}");
            }
        }
    }

    #[test]
    fn rms_norm_unit_rows() {
        let mut out = vec![0.0; 4];
        rms_norm(&[3.0, 4.0, 0.0, 0.0], &[1.0, 1.0, 2.0, 2.0], 0.0, &mut out);
        let inv = 1.0 / (25.0f32 / 4.0).sqrt();
        assert_eq!(out, vec![3.0 * inv, 4.0 * inv, 0.0, 0.0]);
    }
}
