//! The residual decode GEMV on a GPU, on the CUDA cores (mode 1) and on the tensor cores
//! (mode 7): each against an f64 reference, and batch row b at batch 8 the same bits as that
//! row alone at batch 1. Skips without a CUDA device (CI); `scripts/gpu-tests.sh` runs it on the
//! GPU box (`test-engine-lib`, with ENGINE_REQUIRE_GPU set).

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
pub(super) fn module(
    ctx: &std::sync::Arc<CudaContext>,
) -> std::sync::Arc<cudarc::driver::CudaModule> {
    let mut driver = 0;
    // SAFETY: writes one int.
    let _ = unsafe { sys::cuDriverGetVersion(&mut driver) };
    let (major, minor) = ctx.compute_capability().unwrap();
    kernels::load(ctx, &format!("sm_{major}{minor}"), driver, &[])
        .unwrap()
        .0
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
        let resident = f
            .occupancy_max_active_blocks_per_multiprocessor(plan::GEMV_THREADS, 0, None)
            .unwrap() as usize
            * self.sms;
        let grid = plan::gemv_grid(l.units, l.ksplit, resident);
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
    // The 8B's down (one round of tiles) and a taller matrix (two rounds: both halves of the
    // tensor-core kernel's double-buffered reduction).
    for (rows, cols) in [(4096, 14336), (8192, 4096)] {
        assert!(plan::gemv_on_tensor_cores(rows, cols));
        let w: Vec<u16> = values(rows * cols, rows as u64)
            .iter()
            .map(|v| half::bf16::from_f32(v / 16.0).to_bits())
            .collect();
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
            let wr: Vec<f64> = w[r * cols..(r + 1) * cols]
                .iter()
                .map(|&h| half::bf16::from_bits(h).to_f64())
                .collect();
            for b in 0..B {
                let xb = &x[b * cols..(b + 1) * cols];
                let (mut s, mut q) = (0f64, 0f64);
                for (a, &v) in wr.iter().zip(xb) {
                    s += a * v as f64;
                    q += (a * v as f64).powi(2);
                }
                want[b * rows + r] = s;
                scale[b * rows + r] = q.sqrt();
            }
        }
        let stream_launch = plan::GemvLaunch {
            mode: plan::GemvMode::Residual,
            ksplit: plan::gemv_ksplit(rows, cols, false),
            units: rows,
        };
        for l in [
            stream_launch,
            plan::gemv_launch(rows, cols, plan::GemvMode::Residual, 1),
        ] {
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
            assert!(
                worst < 1e-4,
                "mode {:?} {rows}x{cols}: error {worst:e} of the products' norm",
                l.mode
            );
            for b in 0..B {
                let alone = g.run(&f1, l, 1, b);
                let at8 = &got[b * rows..(b + 1) * rows];
                let same = alone
                    .iter()
                    .zip(at8)
                    .all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(
                    same,
                    "mode {:?} {rows}x{cols}: row {b} at batch 8 differs from it alone",
                    l.mode
                );
            }
        }
    }
}
