//! The tensor-core prefill attention (engine/kernels/attention_prefill.cu) on a GPU: against an
//! f64 reference and against the decode kernel it replaced in prefill (attention.cu, one row per
//! block), over a paged cache of scattered blocks, prompts of several lengths in one pass and a
//! prompt's second piece at later positions; and a row's bits the same whatever its pass holds
//! and wherever its prompt was cut. The cuBLAS step's decode attention on the tensor cores
//! (attention_batch.cu) against the same reference and attention.cu, a row's bits the same in
//! any batch.
//! Skips without a CUDA device (CI); run on the GPU box with ENGINE_REQUIRE_GPU set.

use super::device::DevBuf;
use super::gemv_gpu_tests::{
    bf16s, differing_bits, gpu, module, upload, values, variant_modules, worst_and_scale,
};
use super::kernels;
use super::plan::{self, Segment};
use crate::config::ModelConfig;
use crate::launch;

fn config(heads: usize, kv_heads: usize, head_dim: usize) -> ModelConfig {
    ModelConfig::parse(
        &serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": heads * head_dim,
            "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": head_dim, "rms_norm_eps": 1e-5,
            "vocab_size": 256, "max_position_embeddings": 4096, "rope_theta": 10000.0,
        })
        .to_string(),
    )
    .unwrap()
}

/// (heads, KV heads, head dim, block size): the 8B's and Nemotron-H's, the 1B's, Qwen2.5's seven
/// query heads per KV head, the tiny units', and block sizes that do not divide a K/V tile
/// (vLLM's 1,040 on Nemotron-H among them).
const SHAPES: [(usize, usize, usize, usize); 5] = [
    (8, 2, 128, 16),
    (8, 2, 64, 16),
    (14, 2, 64, 7),
    (4, 2, 32, 1040),
    (4, 2, 16, 3),
];

/// A paged cache of `blocks` blocks and the prompts' block tables, the blocks of each prompt
/// scattered (every third block, from its own offset).
struct Cache {
    cfg: ModelConfig,
    block_size: usize,
    max_blocks: usize,
    /// bf16 bits and their values, [block][kv head][block_size][head_dim].
    k: (Vec<u16>, Vec<f32>),
    v: (Vec<u16>, Vec<f32>),
    tables: Vec<i32>,
}

impl Cache {
    fn new(cfg: ModelConfig, block_size: usize, prompts: usize, max_len: usize) -> Self {
        let max_blocks = max_len.div_ceil(block_size);
        let blocks = 3 * prompts * max_blocks + 3;
        let n = blocks * cfg.num_kv_heads * block_size * cfg.head_dim;
        // Keys of a larger scale than the values, so the softmax is far from uniform.
        let k = bf16s(&values(n, 11).iter().map(|x| 2.0 * x).collect::<Vec<_>>());
        let v = bf16s(&values(n, 12));
        let tables = (0..prompts * max_blocks)
            .map(|i| {
                let (p, b) = (i / max_blocks, i % max_blocks);
                (3 * (b * prompts + p) + p % 3) as i32
            })
            .collect();
        Self {
            cfg,
            block_size,
            max_blocks,
            k,
            v,
            tables,
        }
    }

    /// Device copies of the cache (K, V, block tables) and of the pass (queries, positions,
    /// row tables), in that order.
    fn upload(&self, pass: &Pass) -> [DevBuf; 6] {
        [
            upload(&self.k.0),
            upload(&self.v.0),
            upload(&self.tables),
            upload(&pass.qkv),
            upload(&pass.positions),
            upload(&pass.row_table),
        ]
    }

    fn at(&self, table: usize, kvh: usize, pos: usize) -> usize {
        let c = &self.cfg;
        let block = self.tables[table * self.max_blocks + pos / self.block_size] as usize;
        ((block * c.num_kv_heads + kvh) * self.block_size + pos % self.block_size) * c.head_dim
    }

    /// softmax(scale q . k) v over positions 0..=pos, in f64.
    fn reference(&self, q: &[f32], table: usize, head: usize, pos: usize, scale: f32) -> Vec<f64> {
        let c = &self.cfg;
        let (d, kvh) = (c.head_dim, head / (c.num_heads / c.num_kv_heads));
        let s: Vec<f64> = (0..=pos)
            .map(|p| {
                let k = &self.k.1[self.at(table, kvh, p)..][..d];
                q.iter()
                    .zip(k)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = e.iter().sum();
        let mut o = vec![0f64; d];
        for (p, w) in e.iter().enumerate() {
            let v = &self.v.1[self.at(table, kvh, p)..][..d];
            for (o, &v) in o.iter_mut().zip(v) {
                *o += w / l * v as f64;
            }
        }
        o
    }
}

/// One pass: its segments (prompt, positions from..from + len), the rows' queries (f32, in a
/// qkv-wide row as the backend lays them out), and the device inputs both kernels read.
struct Pass {
    segments: Vec<Segment>,
    rows: usize,
    ld: usize,
    qkv: Vec<f32>,
    positions: Vec<i32>,
    row_table: Vec<i32>,
}

impl Pass {
    /// Segments as (prompt, from, len); each row's query is a function of (prompt, position)
    /// only, so one prompt's rows are the same in every pass that holds them.
    fn new(cfg: &ModelConfig, pieces: &[(usize, usize, usize)]) -> Self {
        let ld = cfg.q_dim() + 2 * cfg.kv_dim();
        let mut segments = Vec::new();
        let (mut qkv, mut positions, mut row_table) = (Vec::new(), Vec::new(), Vec::new());
        let mut row = 0;
        for &(seq, from, len) in pieces {
            segments.push(Segment {
                seq,
                from,
                len,
                row,
            });
            for p in from..from + len {
                let mut r = values(cfg.q_dim(), (1000 * seq + p) as u64 + 77);
                r.resize(ld, 0.0);
                qkv.extend(r);
                positions.push(p as i32);
                row_table.push(seq as i32);
            }
            row += len;
        }
        Self {
            segments,
            rows: row,
            ld,
            qkv,
            positions,
            row_table,
        }
    }
}

/// The prefill kernel's f32 and bf16 outputs over `pass`, and (with `decode`) the decode
/// kernel's f32 output, one split per row, as prefill ran it before.
fn run(c: &Cache, pass: &Pass, decode: bool) -> (Vec<f32>, Vec<u16>, Option<Vec<f32>>) {
    let (_ctx, stream, _) = gpu().unwrap();
    let module = module(&_ctx);
    let cfg = &c.cfg;
    let dev = c.upload(pass);
    let [kd, vd, td, qd, pd, rd] = &dev;
    let tiles = plan::attention_prefill_tiles(&pass.segments);
    let tiles_d = upload(tiles.as_flattened());
    let n_out = pass.rows * cfg.q_dim();
    let (of, ob) = (
        DevBuf::zeroed(4 * n_out).unwrap(),
        DevBuf::zeroed(2 * n_out).unwrap(),
    );
    let scale = 1.0 / (cfg.head_dim as f32).sqrt();
    let i = |v: usize| v as i32;
    let f = super::load::staged_attention_function(
        &module,
        plan::attention_prefill_kernel(cfg),
        plan::attention_prefill_smem_bytes(cfg.head_dim),
    )
    .unwrap()
    .unwrap();
    launch_prefill(
        &f,
        &stream,
        c,
        pass,
        &dev,
        &tiles_d,
        tiles.len(),
        of.ptr,
        ob.ptr,
    );
    let mut got = vec![0f32; n_out];
    of.read(&mut got, &stream).unwrap();
    let mut got_b = vec![0u16; n_out];
    ob.read(&mut got_b, &stream).unwrap();
    let old = decode.then(|| {
        let od = DevBuf::zeroed(4 * n_out).unwrap();
        let g = kernels::function(&module, &plan::attention_kernel(cfg)).unwrap();
        launch!(&g, &stream, false, (pass.rows as u32, cfg.num_kv_heads as u32, 1), plan::ATT_THREADS,
            plan::attention_smem_bytes(cfg);
            qd.ptr, i(pass.ld), kd.ptr, vd.ptr, pd.ptr, rd.ptr, td.ptr, i(c.max_blocks),
            i(cfg.num_heads), i(cfg.num_kv_heads), i(cfg.head_dim), i(c.block_size), scale, 0u64,
            0u64, 0u64, od.ptr, 0u64, 0u64, 0u64, 0u64, 0f32, 0u64)
        .unwrap();
        let mut v = vec![0f32; n_out];
        od.read(&mut v, &stream).unwrap();
        v
    });
    (got, got_b, old)
}

/// `attention_prefill` (`f`, the kernel as built or a variant) over `pass`: `dev` its inputs as
/// [`Cache::upload`] gives them, `tiles` its `n_tiles` tiles on the device; f32 out into `out_f32`,
/// bf16 into `out_bf16` (0: not written).
#[allow(clippy::too_many_arguments)]
fn launch_prefill(
    f: &cudarc::driver::CudaFunction,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    c: &Cache,
    pass: &Pass,
    dev: &[DevBuf; 6],
    tiles: &DevBuf,
    n_tiles: usize,
    out_f32: u64,
    out_bf16: u64,
) {
    let cfg = &c.cfg;
    let [kd, vd, td, qd, pd, rd] = dev;
    let scale = 1.0 / (cfg.head_dim as f32).sqrt();
    let i = |v: usize| v as i32;
    launch!(f, stream, false, (n_tiles as u32, cfg.num_heads as u32, 1),
        32 * plan::ATT_PF_WARPS as u32, plan::attention_prefill_smem_bytes(cfg.head_dim);
        qd.ptr, i(pass.ld), kd.ptr, vd.ptr, pd.ptr, rd.ptr, td.ptr, i(c.max_blocks), tiles.ptr,
        i(cfg.num_heads), i(cfg.num_kv_heads), i(c.block_size), scale, out_f32, out_bf16)
    .unwrap();
}

/// The largest error of `got` against the f64 reference over every row and head of `pass`,
/// relative to the largest output magnitude.
fn worst(c: &Cache, pass: &Pass, got: &[f32]) -> f64 {
    let cfg = &c.cfg;
    let d = cfg.head_dim;
    let scale = 1.0 / (d as f32).sqrt();
    let (mut err, mut big) = (0f64, 0f64);
    for r in 0..pass.rows {
        for h in 0..cfg.num_heads {
            let q = &pass.qkv[r * pass.ld + h * d..][..d];
            let want = c.reference(
                q,
                pass.row_table[r] as usize,
                h,
                pass.positions[r] as usize,
                scale,
            );
            for (k, w) in want.iter().enumerate() {
                let g = got[(r * cfg.num_heads + h) * d + k] as f64;
                err = err.max((g - w).abs());
                big = big.max(w.abs());
            }
        }
    }
    err / big
}

#[test]
fn prefill_attention_matches_the_reference_and_the_decode_kernel() {
    if gpu().is_none() {
        return;
    }
    for (heads, kvh, d, bs) in SHAPES {
        let c = Cache::new(config(heads, kvh, d), bs, 4, 400);
        // One row; a tile's worth and one past it; a long prompt; and prompt 3's positions
        // 130..330, its first 130 as a first piece would have left them in the cache.
        let pass = Pass::new(&c.cfg, &[(0, 0, 1), (1, 0, 65), (2, 0, 331), (3, 130, 200)]);
        let (got, got_b, old) = run(&c, &pass, true);
        let old = old.unwrap();
        let e = worst(&c, &pass, &got);
        let e_old = worst(&c, &pass, &old);
        assert!(
            e < 1e-4,
            "({heads}, {kvh}, {d}, {bs}): prefill attention off the f64 reference by {e:.2e} of its scale (decode kernel: {e_old:.2e})"
        );
        assert!(e_old < 2e-5, "decode kernel off by {e_old:.2e}");
        assert_bf16_is_f32_rounded(&got_b, &got);
        eprintln!("({heads}, {kvh}, {d}, {bs}): error {e:.2e}, decode kernel's {e_old:.2e}");
    }
}

#[test]
fn a_prefill_rows_bits_depend_on_its_own_prompt_and_position_only() {
    if gpu().is_none() {
        return;
    }
    let c = Cache::new(config(8, 2, 128), 16, 3, 400);
    // Prompt 2's positions 0..300 alone, then cut at 100 and packed behind two other prompts
    // (other tile boundaries, other neighbours, another order of blocks).
    let alone = Pass::new(&c.cfg, &[(2, 0, 300)]);
    let (a, _, _) = run(&c, &alone, false);
    let first = Pass::new(&c.cfg, &[(0, 0, 37), (2, 0, 100)]);
    let second = Pass::new(&c.cfg, &[(1, 0, 5), (0, 37, 50), (2, 100, 200)]);
    let (b1, _, _) = run(&c, &first, false);
    let (b2, _, _) = run(&c, &second, false);
    let w = c.cfg.q_dim();
    let alone_rows = |r: std::ops::Range<usize>| &a[r.start * w..r.end * w];
    assert!(
        alone_rows(0..100) == &b1[37 * w..137 * w],
        "prompt 2's first 100 rows differ when packed behind another prompt"
    );
    assert!(
        alone_rows(100..300) == &b2[55 * w..255 * w],
        "prompt 2's rows 100..300 differ when prefilled as a second piece"
    );
}

/// What the batched decode attention folds in, on the device: the rotation's frequencies (zeros:
/// the identity, each row's q taken as given) and the bias and q/k norm weights (null: none).
struct Fold {
    inv_freq: DevBuf,
    bias: Option<DevBuf>,
    q_norm: Option<DevBuf>,
    k_norm: Option<DevBuf>,
}

impl Fold {
    fn identity(cfg: &ModelConfig) -> Self {
        Self {
            inv_freq: upload(&vec![0f32; cfg.head_dim / 2]),
            bias: None,
            q_norm: None,
            k_norm: None,
        }
    }
}

fn ptr(b: &Option<DevBuf>) -> u64 {
    b.as_ref().map_or(0, |b| b.ptr)
}

/// attention_batch.cu's f32 and bf16 outputs for decode rows (one per sequence, each at its own
/// last position) over the device inputs `dev` ([`Cache::upload`]'s), its grid
/// [`plan::MAX_SPLITS`] deep as the step launches it, folding in `fold`; it writes each row's new
/// K/V into `dev`'s cache.
fn run_batch_on(c: &Cache, pass: &Pass, dev: &[DevBuf; 6], fold: &Fold) -> (Vec<f32>, Vec<u16>) {
    let (_ctx, stream, _) = gpu().unwrap();
    let module = module(&_ctx);
    let cfg = &c.cfg;
    let [kd, vd, td, qd, pd, rd] = dev;
    let n_out = pass.rows * cfg.q_dim();
    let (of, ob) = (
        DevBuf::zeroed(4 * n_out).unwrap(),
        DevBuf::zeroed(2 * n_out).unwrap(),
    );
    let part_o = DevBuf::zeroed(4 * n_out * plan::MAX_SPLITS).unwrap();
    let part_ml = DevBuf::zeroed(4 * pass.rows * cfg.num_heads * plan::MAX_SPLITS * 2).unwrap();
    let counts = DevBuf::zeroed(4 * pass.rows * cfg.num_kv_heads).unwrap();
    let scale = 1.0 / (cfg.head_dim as f32).sqrt();
    let i = |v: usize| v as i32;
    let f = super::load::staged_attention_function(
        &module,
        plan::attention_batch_kernel(cfg),
        plan::attention_batch_smem_bytes(cfg),
    )
    .unwrap()
    .unwrap();
    let launch_once = || {
        launch!(&f, &stream, false,
            (pass.rows as u32, cfg.num_kv_heads as u32, plan::MAX_SPLITS as u32),
            32 * plan::ATT_BATCH_WARPS as u32, plan::attention_batch_smem_bytes(cfg);
            qd.ptr, i(pass.ld), kd.ptr, vd.ptr, pd.ptr, rd.ptr, td.ptr, i(c.max_blocks),
            i(cfg.num_heads), i(cfg.num_kv_heads), i(c.block_size), scale, part_o.ptr,
            part_ml.ptr, counts.ptr, of.ptr, ob.ptr, ptr(&fold.bias), ptr(&fold.q_norm),
            ptr(&fold.k_norm), cfg.rms_norm_eps, fold.inv_freq.ptr)
        .unwrap();
        let mut got = vec![0f32; n_out];
        of.read(&mut got, &stream).unwrap();
        let mut got_b = vec![0u16; n_out];
        ob.read(&mut got_b, &stream).unwrap();
        (got, got_b)
    };
    // Twice: the merging blocks leave `counts` zero for the next launch, which must agree.
    let first = launch_once();
    let (second, _) = launch_once();
    assert!(
        differing_bits(&first.0, &second) == 0,
        "a second launch over the same inputs differs: the split tickets were not reset"
    );
    first
}

/// [`run_batch_on`] with the identity rotation over a fresh upload of the cache, each row's new
/// k and v those the cache already holds at its position (so writing them changes nothing and
/// the f64 reference over the cache holds).
fn run_batch(c: &Cache, pass: &Pass) -> (Vec<f32>, Vec<u16>) {
    // The context outlives the buffers made here (declared first, dropped last).
    let (_ctx, _, _) = gpu().unwrap();
    let cfg = &c.cfg;
    let (q, kv, d) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
    let mut pass_kv = Pass {
        segments: pass.segments.clone(),
        qkv: pass.qkv.clone(),
        positions: pass.positions.clone(),
        row_table: pass.row_table.clone(),
        ..*pass
    };
    for r in 0..pass.rows {
        let (table, pos) = (pass.row_table[r] as usize, pass.positions[r] as usize);
        for h in 0..cfg.num_kv_heads {
            let at = c.at(table, h, pos);
            let row = &mut pass_kv.qkv[r * pass.ld..][..pass.ld];
            row[q + h * d..][..d].copy_from_slice(&c.k.1[at..at + d]);
            row[q + kv + h * d..][..d].copy_from_slice(&c.v.1[at..at + d]);
        }
    }
    let (dev, fold) = (c.upload(&pass_kv), Fold::identity(cfg));
    run_batch_on(c, &pass_kv, &dev, &fold)
}
#[test]
fn batch_attention_matches_the_reference_and_a_row_is_the_same_in_any_batch() {
    if gpu().is_none() {
        return;
    }
    for (heads, kvh, d, bs) in SHAPES {
        // Contexts of one position, of less than a chunk, of one split and one chunk past it,
        // of several splits, and past MAX_SPLITS splits of ATT_BATCH_SPLIT (longer shares).
        let long = plan::MAX_SPLITS * plan::ATT_BATCH_SPLIT + 300;
        let ctxs = [1, 13, plan::ATT_BATCH_SPLIT + 16, 1_064, long];
        let c = Cache::new(config(heads, kvh, d), bs, ctxs.len(), long);
        let rows: Vec<_> = ctxs
            .iter()
            .enumerate()
            .map(|(s, &n)| (s, n - 1, 1))
            .collect();
        let pass = Pass::new(&c.cfg, &rows);
        let (got, got_b) = run_batch(&c, &pass);
        let e = worst(&c, &pass, &got);
        assert!(
            e < 1e-4,
            "({heads}, {kvh}, {d}, {bs}): batch attention off the f64 reference by {e:.2e} of its scale"
        );
        assert_bf16_is_f32_rounded(&got_b, &got);
        // Each row alone gives the bits it gave among the others.
        let q = c.cfg.q_dim();
        for (r, &row) in rows.iter().enumerate() {
            let (alone, _) = run_batch(&c, &Pass::new(&c.cfg, &[row]));
            assert!(
                differing_bits(&alone, &got[r * q..(r + 1) * q]) == 0,
                "({heads}, {kvh}, {d}, {bs}): context {}'s row alone differs from its bits in the batch",
                ctxs[r]
            );
        }
        eprintln!("({heads}, {kvh}, {d}, {bs}): batch attention error {e:.2e}");
    }
}

/// The batched decode attention with the rotation and K/V write folded in leaves the outputs and
/// the cache that rope_kv (as prefill runs it) followed by the same attention over the rotated
/// rows leaves, bit for bit: bias, q/k norm and rotation at each row's own position, the new K/V
/// at its slot, over a scattered cache; with and without the bias and norms (Qwen2's, Qwen3's).
#[test]
fn batch_attention_folds_rope_kv_in_to_the_bit() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    let rope_kv = kernels::function(&module, "rope_kv").unwrap();
    for (heads, kvh, d, bs) in SHAPES {
        let ctxs = [1, 13, plan::ATT_BATCH_SPLIT + 16, 1_064];
        let c = Cache::new(config(heads, kvh, d), bs, ctxs.len(), 1_064);
        let cfg = &c.cfg;
        let rows: Vec<_> = ctxs
            .iter()
            .enumerate()
            .map(|(s, &n)| (s, n - 1, 1))
            .collect();
        let mut pass = Pass::new(cfg, &rows);
        // Every head of every row, q, k and v, random (Pass::new leaves k and v zero).
        pass.qkv = values(pass.qkv.len(), 91);
        let inv_freq = upload(&crate::rope::inv_freq(&cfg.rope, d));
        for with_weights in [false, true] {
            let weights = |n: usize, seed: u64, off: f32| {
                with_weights.then(|| {
                    upload(
                        &bf16s(
                            &values(n, seed)
                                .iter()
                                .map(|x| off + 0.5 * x)
                                .collect::<Vec<_>>(),
                        )
                        .0,
                    )
                })
            };
            let fold = Fold {
                inv_freq: upload(&crate::rope::inv_freq(&cfg.rope, d)),
                bias: weights(pass.ld, 92, 0.0),
                q_norm: weights(d, 93, 1.0),
                k_norm: weights(d, 94, 1.0),
            };
            // rope_kv over the rows, then the kernel with nothing left to fold.
            let before = c.upload(&pass);
            let [kd, vd, td, qd, pd, rd] = &before;
            let i = |v: usize| v as i32;
            launch!(&rope_kv, &stream, false, (pass.rows as u32, 1, 1), 256, 0;
                qd.ptr, ptr(&fold.bias), ptr(&fold.q_norm), ptr(&fold.k_norm),
                cfg.rms_norm_eps, inv_freq.ptr, pd.ptr, rd.ptr, td.ptr, i(c.max_blocks), kd.ptr,
                vd.ptr, i(heads), i(kvh), i(d), i(bs))
            .unwrap();
            let (want, want_b) = run_batch_on(&c, &pass, &before, &Fold::identity(cfg));
            // The kernel folding it all in, over the rows as they came from the GEMM.
            let folded = c.upload(&pass);
            let (got, got_b) = run_batch_on(&c, &pass, &folded, &fold);
            let how = format!("({heads}, {kvh}, {d}, {bs}), bias and norms {with_weights}");
            assert_eq!(differing_bits(&got, &want), 0, "{how}: outputs differ");
            assert_eq!(got_b, want_b, "{how}: bf16 outputs differ");
            for (name, k) in [("K", 0), ("V", 1)] {
                let mut a = vec![0u16; c.k.0.len()];
                let mut b = vec![0u16; c.k.0.len()];
                before[k].read(&mut a, &stream).unwrap();
                folded[k].read(&mut b, &stream).unwrap();
                assert!(a == b, "{how}: the {name} caches differ");
                let original = if k == 0 { &c.k.0 } else { &c.v.0 };
                assert!(&a != original, "{how}: no new {name} row was written");
            }
        }
    }
}

/// A kernel's bf16 output is its f32 output rounded.
fn assert_bf16_is_f32_rounded(got_b: &[u16], got: &[f32]) {
    for (k, (&b, &f)) in got_b.iter().zip(got).enumerate() {
        assert_eq!(
            b,
            half::bf16::from_f32(f).to_bits(),
            "bf16 output {k} is not the f32 one rounded"
        );
    }
}

/// The prefill attention timed (ignored: a measurement, run by hand on the GPU box with
/// `--ignored --nocapture`) over the battery's batch-8 pass (prompts of 5 to 1,000 tokens, 2,712
/// rows, KV blocks of 16) on the 8B's heads (32 x 128, 8 KV heads) and the 1B's (32 x 64). Each
/// entry of `ATT_PF_VARIANTS` is the attention unit compiled with its defines
/// ([`variant_modules`]), timed, with its rate (the causal FLOPs, each once) and its f32 outputs'
/// largest difference from the first entry's over their largest. On an H100 (session 37): 210 us
/// a layer on the 8B's heads before the block size became a shift, 178-181 after (docs/ENGINE.md).
#[test]
#[ignore]
fn prefill_attention_timed() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let variants = variant_modules(&ctx, "attention_prefill.cu", "ATT_PF_VARIANTS");
    let lens = [5usize, 17, 60, 130, 250, 500, 750, 1000];
    for (heads, kvh, d) in [(32usize, 8usize, 128usize), (32, 8, 64)] {
        let c = Cache::new(config(heads, kvh, d), 16, lens.len(), 1000);
        let pieces: Vec<_> = lens.iter().enumerate().map(|(i, &l)| (i, 0, l)).collect();
        let pass = Pass::new(&c.cfg, &pieces);
        let dev = c.upload(&pass);
        let n_out = pass.rows * c.cfg.q_dim();
        let of = DevBuf::zeroed(4 * n_out).unwrap();
        let flops: f64 =
            lens.iter().map(|&l| (l * (l + 1) / 2) as f64).sum::<f64>() * (heads * d * 4) as f64;
        let mut first: Option<Vec<f32>> = None;
        let tiles = plan::attention_prefill_tiles(&pass.segments);
        let tiles_d = upload(tiles.as_flattened());
        let smem = plan::attention_prefill_smem_bytes(d);
        for (v, md) in &variants {
            let f = super::load::with_smem(
                md.load_function(&format!("attention_prefill_d{d}"))
                    .unwrap(),
                smem,
            )
            .unwrap();
            let run = || {
                launch_prefill(
                    &f,
                    &stream,
                    &c,
                    &pass,
                    &dev,
                    &tiles_d,
                    tiles.len(),
                    of.ptr,
                    0,
                );
                Ok(())
            };
            let ms = super::tune::time_runs(&ctx, &stream, 3, 20, run).unwrap();
            let mut got = vec![0f32; n_out];
            of.read(&mut got, &stream).unwrap();
            let worst = first.as_ref().map_or(0.0, |g0| {
                let (worst, scale) = worst_and_scale(g0, &got);
                worst / scale
            });
            println!(
                "attention_prefill {heads}x{d}/{kvh} {v}: {} rows, {:.1} us, {:.1} TFLOP/s; outputs {worst:.2e} of the first's largest, bits {:016x}",
                pass.rows,
                ms * 1e3,
                flops / (ms * 1e-3) / 1e12,
                fnv1a(&got)
            );
            if first.is_none() {
                first = Some(got);
            }
        }
    }
}

/// A hash of `v`'s bits, so that builds printing the same outputs can be told apart from ones
/// that differ, across processes.
fn fnv1a(v: &[f32]) -> u64 {
    v.iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        })
}
