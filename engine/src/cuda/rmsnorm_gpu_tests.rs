//! The RMSNorm kernel (engine/kernels/rmsnorm.cu) on a GPU against an f64 reference, on the
//! widths of the supported shapes (its registers path) and on widths past it or not a multiple of
//! four (its loop), its bf16 output the f32 one rounded. Skips without a CUDA device (CI).

use super::device::DevBuf;
use super::gemv_gpu_tests::{bf16s, gpu, module, upload, values};
use super::kernels;
use crate::launch;

#[test]
fn rmsnorm_matches_the_reference_at_every_width() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    let f = kernels::function(&module, "rmsnorm").unwrap();
    let eps = 1e-5f32;
    // Qwen2.5-0.5B's 896, the 1B's 2,048, Qwen3-4B's 2,560, the 8B's 4,096, the widest the
    // registers hold (8,192), and the loop's: 8,196, 100 + 2 (not a multiple of four), 64.
    for hidden in [896, 2048, 2560, 4096, 8192, 8196, 102, 64] {
        let rows = 3;
        let x: Vec<f32> = values(rows * hidden, hidden as u64)
            .iter()
            .map(|v| 3.0 * v)
            .collect();
        let (w_bits, w) = bf16s(&values(hidden, 7 + hidden as u64));
        let (xd, wd) = (upload(&x), upload(&w_bits));
        let (of, ob) = (
            DevBuf::zeroed(4 * rows * hidden).unwrap(),
            DevBuf::zeroed(2 * rows * hidden).unwrap(),
        );
        launch!(&f, &stream, false, (rows as u32, 1, 1), 256, 0;
            xd.ptr, wd.ptr, eps, hidden as i32, of.ptr, ob.ptr)
        .unwrap();
        let mut got = vec![0f32; rows * hidden];
        of.read(&mut got, &stream).unwrap();
        let mut got_b = vec![0u16; rows * hidden];
        ob.read(&mut got_b, &stream).unwrap();
        for r in 0..rows {
            let xr = &x[r * hidden..][..hidden];
            let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / hidden as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            for d in 0..hidden {
                let want = w[d] as f64 * (xr[d] as f64 * inv);
                let g = got[r * hidden + d] as f64;
                assert!(
                    (g - want).abs() <= 1e-5 * want.abs().max(1e-2),
                    "width {hidden}, row {r}, dim {d}: {g} against {want}"
                );
                assert_eq!(
                    got_b[r * hidden + d],
                    half::bf16::from_f32(got[r * hidden + d]).to_bits(),
                    "width {hidden}, row {r}, dim {d}: the bf16 output is not the f32 one rounded"
                );
            }
        }
    }
}
