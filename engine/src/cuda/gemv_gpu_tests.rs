//! The residual decode GEMV on a GPU, on the CUDA cores (mode 1) and on the tensor cores (mode 7)
//! at every split of K the tuning may choose, and the lm_head's GEMV and argmax on both (modes 5
//! and 12): each against an f64 reference, and batch row b at batch 8 the same bits as that row
//! alone at batch 1. Skips without a CUDA device (CI); `scripts/gpu-tests.sh` runs it on the GPU
//! box (`test-engine-lib`, with ENGINE_REQUIRE_GPU set).

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream};

use super::device::DevBuf;
use super::{kernels, plan};
use crate::launch;

pub(super) fn gpu() -> Option<(
    std::sync::Arc<CudaContext>,
    std::sync::Arc<CudaStream>,
    usize,
)> {
    if super::device_count() == 0 {
        eprintln!("skipped: no CUDA device here");
        assert!(
            std::env::var_os("ENGINE_REQUIRE_GPU").is_none(),
            "ENGINE_REQUIRE_GPU is set but no CUDA device was found"
        );
        return None;
    }
    let ctx = CudaContext::new(0).expect("context");
    let stream = ctx.new_stream().expect("stream");
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .expect("SM count") as usize;
    Some((ctx, stream, sms))
}

/// The engine's kernels, compiled for this device as the backend compiles them.
pub(super) fn module(ctx: &std::sync::Arc<CudaContext>) -> kernels::Kernels {
    let mut driver = 0;
    // SAFETY: writes one int.
    let _ = unsafe { sys::cuDriverGetVersion(&mut driver) };
    let (major, minor) = ctx.compute_capability().unwrap();
    kernels::load(ctx, &format!("sm_{major}{minor}"), driver, &[])
        .unwrap()
        .0
}

/// The kernel unit holding `file`, compiled once for each entry of the comma-separated
/// environment variable `var` (`base`, the default, is the unit as built; any other entry is
/// `+`-joined names passed as `-D` defines), each with its entry: how the ignored timed tests put
/// a kernel's variants side by side in one run.
pub(super) fn variant_modules(
    ctx: &std::sync::Arc<CudaContext>,
    file: &str,
    var: &str,
) -> Vec<(String, std::sync::Arc<cudarc::driver::CudaModule>)> {
    let (major, minor) = ctx.compute_capability().unwrap();
    let arch = format!("sm_{major}{minor}");
    let unit = kernels::UNITS
        .iter()
        .find(|u| u.files.contains(&file))
        .unwrap();
    let entries = std::env::var(var).unwrap_or_else(|_| "base".into());
    entries
        .split(',')
        .map(|v| {
            let defines: Vec<&str> = if v == "base" {
                vec![]
            } else {
                v.split('+').collect()
            };
            let cubin = kernels::compile(unit, &arch, &defines).unwrap();
            let md = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                .unwrap();
            (v.to_string(), md)
        })
        .collect()
}

/// The largest difference of `got` from `want`, and the largest magnitude in `want`.
pub(super) fn worst_and_scale(want: &[f32], got: &[f32]) -> (f32, f32) {
    let scale = want.iter().fold(0f32, |s, v| s.max(v.abs()));
    let worst = want
        .iter()
        .zip(got)
        .map(|(w, g)| (w - g).abs())
        .fold(0f32, f32::max);
    (worst, scale)
}

/// A device copy of `v`.
pub(super) fn upload<T: Copy>(v: &[T]) -> DevBuf {
    let b = DevBuf::zeroed(std::mem::size_of_val(v).max(4)).unwrap();
    b.write(0, v).unwrap();
    b
}

/// How many of `a` and `b` differ in their bits.
pub(super) fn differing_bits(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// `v` rounded to bf16: the bits and their values.
pub(super) fn bf16s(v: &[f32]) -> (Vec<u16>, Vec<f32>) {
    let b: Vec<u16> = v
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect();
    let f = widened(&b);
    (b, f)
}

/// The values of bf16 bits.
pub(super) fn widened(b: &[u16]) -> Vec<f32> {
    b.iter()
        .map(|&x| half::bf16::from_bits(x).to_f32())
        .collect()
}

/// Seeded values in [-1, 1): the same on every run.
pub(super) fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Seeded bf16 weights in [-1/16, 1/16): their bits.
fn bf16_weights(n: usize, seed: u64) -> Vec<u16> {
    values(n, seed)
        .iter()
        .map(|v| half::bf16::from_f32(v / 16.0).to_bits())
        .collect()
}

/// The f64 dot product of a bf16 weight row and an activation row, and the L2 norm of its
/// products (the scale its rounding error is measured against).
fn dot_f64(w: &[u16], x: &[f32]) -> (f64, f64) {
    let (mut s, mut q) = (0f64, 0f64);
    for (&h, &v) in w.iter().zip(x) {
        let p = half::bf16::from_bits(h).to_f64() * v as f64;
        s += p;
        q += p * p;
    }
    (s, q.sqrt())
}

/// Blocks of `f` resident on the whole GPU at once, the persistent grids' bound.
fn resident(f: &CudaFunction, sms: usize) -> usize {
    f.occupancy_max_active_blocks_per_multiprocessor(plan::GEMV_THREADS, 0, None)
        .unwrap() as usize
        * sms
}

struct Gemv<'a> {
    stream: &'a CudaStream,
    sms: usize,
    w: DevBuf,
    x: DevBuf,
    y: DevBuf,
    rows: usize,
    cols: usize,
}

impl Gemv<'_> {
    /// y = W x over `batch` rows of x starting at row `x_row`, by `f` as the engine launches
    /// `launch` (persistent grid over the resident blocks); returns y's `batch` x `rows`.
    fn run(&self, f: &CudaFunction, l: plan::GemvLaunch, batch: usize, x_row: usize) -> Vec<f32> {
        let n = batch * self.rows;
        self.y.write(0, &vec![0f32; n]).unwrap();
        let grid = l.grid(resident(f, self.sms));
        let (rows, cols) = (self.rows as i32, self.cols as i32);
        launch!(f, self.stream, false, (grid, 1, 1), plan::GEMV_THREADS, 0;
            self.w.ptr, self.x.at(x_row * self.cols, 4), self.y.ptr, rows, cols, cols, rows,
            l.ksplit as i32, 0u64, 0f32, 0u64)
        .unwrap();
        let mut out = vec![0f32; n];
        self.y.read(&mut out, self.stream).unwrap();
        out
    }
}

#[test]
fn residual_gemv_matches_f64_and_gives_each_row_the_same_bits_at_every_batch() {
    let Some((ctx, stream, sms)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    const B: usize = plan::MAX_GEMV_BATCH;
    // The 8B's down (one round of tiles), a taller matrix (two rounds: both halves of the
    // tensor-core kernel's double-buffered reduction) and Qwen3-4B's down (K in 76 steps).
    let mut failed = Vec::new();
    for (rows, cols) in [(4096, 14336), (8192, 4096), (2560, 9728)] {
        assert!(plan::tensor_cores_fit(rows, cols));
        let w = bf16_weights(rows * cols, rows as u64);
        let x = values(B * cols, 7);
        let g = Gemv {
            stream: &stream,
            sms,
            w: DevBuf::zeroed(w.len() * 2).unwrap(),
            x: DevBuf::zeroed(x.len() * 4).unwrap(),
            y: DevBuf::zeroed(B * rows * 4).unwrap(),
            rows,
            cols,
        };
        g.w.write(0, &w).unwrap();
        g.x.write(0, &x).unwrap();
        // The reference, and each output's scale: the L2 norm of its products.
        let mut want = vec![0f64; B * rows];
        let mut scale = vec![0f64; B * rows];
        for r in 0..rows {
            for b in 0..B {
                let (s, q) = dot_f64(&w[r * cols..(r + 1) * cols], &x[b * cols..(b + 1) * cols]);
                want[b * rows + r] = s;
                scale[b * rows + r] = q;
            }
        }
        // The CUDA cores and the tensor cores, each at every split of K the tuning may choose.
        let launches = super::tune::kernels_for(plan::GemvMode::Residual, rows, cols)
            .into_iter()
            .map(|k| plan::gemv_launch(rows, cols, plan::GemvMode::Residual, 1, Some(k)));
        for l in launches {
            let name = |b: usize| l.mode.kernel(b);
            let f8 = kernels::function(&module, &name(B)).unwrap();
            let f1 = kernels::function(&module, &name(1)).unwrap();
            let got = g.run(&f8, l, B, 0);
            // Activations as two bf16 terms keep about 16 bits (at most 2^-18 of each product
            // lost; the tensor cores' f32 sums add ~1e-5 of the norm in gemv-bench): an order
            // below what bf16 activations alone give (2^-9 of each product, ~1e-3 of the norm).
            let worst = got
                .iter()
                .zip(&want)
                .zip(&scale)
                .map(|((&y, &t), &s)| (y as f64 - t).abs() / s)
                .fold(0f64, f64::max);
            eprintln!(
                "mode {:?} ksplit {} {rows}x{cols}: error {worst:e} of the products' norm",
                l.mode, l.ksplit
            );
            if worst >= 1e-4 {
                failed.push(format!(
                    "mode {:?} ksplit {} {rows}x{cols}: {worst:e}",
                    l.mode, l.ksplit
                ));
            }
            for b in 0..B {
                let alone = g.run(&f1, l, 1, b);
                let at8 = &got[b * rows..(b + 1) * rows];
                assert!(
                    differing_bits(&alone, at8) == 0,
                    "mode {:?} ksplit {} {rows}x{cols}: row {b} at batch 8 differs from it alone",
                    l.mode,
                    l.ksplit
                );
            }
        }
    }
    assert!(
        failed.is_empty(),
        "over 1e-4 of the products' norm: {failed:?}"
    );
}

/// The lm_head on the CUDA cores and on the tensor cores, as the verify request runs it (the
/// logits variant): its logits near the f64 reference, each block's argmax candidates reducing to
/// the argmax of its own logits with the lowest row winning a tie, and batch row b's logits and
/// candidates the same bits at batch 8 as alone.
#[test]
fn lm_head_argmax_is_its_own_logits_argmax_lowest_row_on_ties_at_every_batch() {
    let Some((ctx, stream, sms)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    const B: usize = plan::MAX_GEMV_BATCH;
    // A Llama-sized head (8 warps per tile, several tiles per block) and a Qwen2.5-0.5B-wide one
    // (K = 896: one warp per tile).
    for (rows, cols) in [(16384, 2048), (4096, 896)] {
        let mut w = bf16_weights(rows * cols, rows as u64 ^ 5);
        // Rows 7 and rows - 3 equal and large: a tie the lowest row must win.
        for k in 0..cols {
            let v = half::bf16::from_f32(if k % 2 == 0 { 0.5 } else { -0.25 }).to_bits();
            w[7 * cols + k] = v;
            w[(rows - 3) * cols + k] = v;
        }
        let mut x = values(B * cols, 11);
        // Row 0 of the batch leans on the planted rows so that the tie is its argmax.
        for (k, v) in x[..cols].iter_mut().enumerate() {
            *v = if k % 2 == 0 { 1.0 } else { -1.0 };
        }
        let dev = |n: usize| DevBuf::zeroed(n).unwrap();
        let (wd, xd, yd) = (dev(w.len() * 2), dev(x.len() * 4), dev(B * rows * 4));
        wd.write(0, &w).unwrap();
        xd.write(0, &x).unwrap();
        let partsd =
            dev(B * 2 * plan::gemv_blocks(rows, plan::lm_head_ksplit(rows, cols)) as usize * 4);
        // The CUDA cores, and the tensor cores at every split of K the tuning may choose.
        for tc in super::tune::kernels_for(plan::GemvMode::LmHead, rows, cols) {
            let l = plan::gemv_launch(rows, cols, plan::GemvMode::LmHead, 1, Some(tc));
            assert!(l.mode.is_lm_head());
            assert_eq!(
                l.mode == plan::GemvMode::LmHeadMma,
                matches!(tc, plan::GemvKernel::TensorCores(_))
            );
            // (logits [batch][rows], the argmax from the candidates, per b)
            let run = |batch: usize, x_row: usize| -> (Vec<f32>, Vec<usize>) {
                let f = kernels::function(&module, &l.mode.logits_kernel(batch)).unwrap();
                let grid = l.grid(resident(&f, sms));
                let (r, c) = (rows as i32, cols as i32);
                launch!(&f, &stream, false, (grid, 1, 1), plan::GEMV_THREADS, 0;
                    wd.ptr, xd.at(x_row * cols, 4), yd.ptr, r, c, c, r, l.ksplit as i32, 0u64,
                    0f32, partsd.ptr)
                .unwrap();
                let mut y = vec![0f32; batch * rows];
                yd.read(&mut y, &stream).unwrap();
                let mut parts = vec![0f32; batch * grid as usize * 2];
                partsd.read(&mut parts, &stream).unwrap();
                let best = (0..batch)
                    .map(|b| {
                        let mut best = (f32::NEG_INFINITY, usize::MAX);
                        for p in parts[b * 2 * grid as usize..(b + 1) * 2 * grid as usize].chunks(2)
                        {
                            let i = p[1].to_bits() as usize;
                            if p[0] > best.0 || (p[0] == best.0 && i < best.1) {
                                best = (p[0], i);
                            }
                        }
                        best.1
                    })
                    .collect();
                (y, best)
            };
            let (y8, best8) = run(B, 0);
            for b in 0..B {
                let yb = &y8[b * rows..(b + 1) * rows];
                // The first of the largest logits.
                let want = yb
                    .iter()
                    .enumerate()
                    .fold(
                        (f32::NEG_INFINITY, 0),
                        |m, (i, &v)| if v > m.0 { (v, i) } else { m },
                    )
                    .1;
                assert_eq!(best8[b], want, "tc {tc:?} {rows}x{cols}: b {b}");
                // Every logit is the f64 sum rounded to bf16, give or take the summation.
                let xb = &x[b * cols..(b + 1) * cols];
                for r in (0..rows).step_by(97).chain([7, rows - 3]) {
                    let (s, q) = dot_f64(&w[r * cols..(r + 1) * cols], xb);
                    let err = (yb[r] as f64 - s).abs();
                    assert!(
                        err <= s.abs() / 128.0 + 1e-4 * q,
                        "tc {tc:?} {rows}x{cols}: logit {r} of b {b} is {}, want {s}",
                        yb[r]
                    );
                }
                let (alone, best1) = run(1, b);
                assert!(
                    differing_bits(&alone, yb) == 0,
                    "tc {tc:?} {rows}x{cols}: b {b}'s logits at batch 8 differ from it alone"
                );
                assert_eq!(best1[0], best8[b]);
            }
            assert_eq!(
                best8[0], 7,
                "tc {tc:?} {rows}x{cols}: the tie goes to the lowest row"
            );
        }
    }
}
