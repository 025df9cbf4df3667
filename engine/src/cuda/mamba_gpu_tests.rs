//! The Mamba-2 decode kernels (engine/kernels/mamba.cu) on a GPU against the CPU reference
//! (hybrid/mamba.rs), on the 8B's per-head sizes: three rows in scattered state slots, two steps
//! (the first from a fresh state, the second carrying it), the outputs and the states compared.
//! Skips without a CUDA device (CI); run on the GPU box with ENGINE_REQUIRE_GPU set.

use super::device::DevBuf;
use super::gemv_gpu_tests::{gpu, module, values};
use super::kernels;
use crate::hybrid::mamba::{step, Params, State};
use crate::hybrid::Mamba;
use crate::launch;

fn bf16s(v: &[f32]) -> (Vec<u16>, Vec<f32>) {
    let b: Vec<u16> = v
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect();
    let f = b
        .iter()
        .map(|&x| half::bf16::from_bits(x).to_f32())
        .collect();
    (b, f)
}

fn upload<T: Copy>(v: &[T]) -> DevBuf {
    let b = DevBuf::zeroed(std::mem::size_of_val(v).max(4)).unwrap();
    b.write(0, v).unwrap();
    b
}

#[test]
fn mamba_decode_kernels_match_the_cpu_reference_over_two_steps() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    let k = |n: &str| kernels::function(&module, n).unwrap();
    let m = Mamba {
        num_heads: 8,
        head_dim: 64,
        d_state: 128,
        n_groups: 2,
        conv_kernel: 4,
        chunk_size: 128,
        time_step_min: 0.001,
        conv_bias: true,
        proj_bias: false,
        ssm_cache_dtype: "float32".into(),
        eps: 1e-5,
    };
    let (inner, conv_dim, in_dim) = (m.inner(), m.conv_dim(), m.in_proj_dim());
    let (heads, hd, n, kk) = (m.num_heads, m.head_dim, m.d_state, m.conv_kernel);
    let (conv_w_b, conv_w) = bf16s(&values(conv_dim * kk, 1));
    let (conv_b_b, conv_b) = bf16s(&values(conv_dim, 2));
    let (dt_bias_b, dt_bias) = bf16s(&values(heads, 3).iter().map(|v| v - 2.0).collect::<Vec<_>>());
    let a: Vec<f32> = (0..heads).map(|h| -((h + 1) as f32)).collect();
    let (d_b, d) = bf16s(&values(heads, 4).iter().map(|v| 1.0 + v).collect::<Vec<_>>());
    let (norm_b, norm_w) = bf16s(
        &values(inner, 5)
            .iter()
            .map(|v| 1.0 + 0.2 * v)
            .collect::<Vec<_>>(),
    );
    let p = Params {
        conv_w: &conv_w,
        conv_b: Some(&conv_b),
        dt_bias: &dt_bias,
        a: &a,
        d: &d,
        norm_w: &norm_w,
    };
    let dev = [
        upload(&conv_w_b),
        upload(&conv_b_b),
        upload(&dt_bias_b),
        upload(&a),
        upload(&d_b),
        upload(&norm_b),
    ];
    let (slots, rows, n_slots) = (vec![2i32, 0, 1], 3usize, 3usize);
    let conv_state = DevBuf::zeroed(n_slots * conv_dim * (kk - 1) * 4).unwrap();
    let ssm_state = DevBuf::zeroed(n_slots * heads * n * hd * 4).unwrap();
    // Stale values in every slot: a row at position 0 must not read them.
    conv_state
        .write(0, &vec![9.0f32; n_slots * conv_dim * (kk - 1)])
        .unwrap();
    ssm_state
        .write(0, &vec![9.0f32; n_slots * heads * n * hd])
        .unwrap();
    let slots_d = upload(&slots);
    let (xbc, y, out) = (
        DevBuf::zeroed(rows * conv_dim * 4).unwrap(),
        DevBuf::zeroed(rows * inner * 4).unwrap(),
        DevBuf::zeroed(rows * inner * 4).unwrap(),
    );
    let mut cpu: Vec<(Vec<f32>, Vec<f32>)> = (0..rows)
        .map(|_| (vec![0.0; conv_dim * (kk - 1)], vec![0.0; inner * n]))
        .collect();
    for (t, dt_min) in [(0, 0.001f32), (1, 0.0)] {
        let zx = values(rows * in_dim, 10 + t as u64);
        let zx_d = upload(&zx);
        let pos = upload(&vec![t; rows]);
        let ints = |v: usize| v as i32;
        launch!(&k("mamba_conv_step"), &stream, false, ((conv_dim as u32).div_ceil(256), rows as u32, 1), 256, 0;
            zx_d.ptr, ints(in_dim), ints(inner), ints(conv_dim), ints(kk), dev[0].ptr, dev[1].ptr,
            conv_state.ptr, slots_d.ptr, pos.ptr, xbc.ptr)
        .unwrap();
        launch!(&k("mamba_ssm_step"), &stream, false, (heads as u32, rows as u32, 1), hd as u32, 0;
            zx_d.ptr, xbc.ptr, ints(in_dim), ints(inner), ints(conv_dim), ints(heads), ints(hd), ints(n),
            ints(m.n_groups), dev[2].ptr, dev[3].ptr, dev[4].ptr, ssm_state.ptr, slots_d.ptr, pos.ptr,
            dt_min, y.ptr)
        .unwrap();
        launch!(&k("mamba_gated_norm"), &stream, false, (m.n_groups as u32, rows as u32, 1), 256, 0;
            y.ptr, zx_d.ptr, ints(in_dim), ints(inner), ints(m.n_groups), dev[5].ptr, m.eps, out.ptr)
        .unwrap();
        let mut got = vec![0f32; rows * inner];
        out.read(&mut got, &stream).unwrap();
        for r in 0..rows {
            let (conv, ssm) = &mut cpu[r];
            let want = step(
                &m,
                &p,
                &mut State { conv, ssm },
                &zx[r * in_dim..(r + 1) * in_dim],
                dt_min,
            );
            let scale = want.iter().fold(0f32, |s, v| s.max(v.abs()));
            let worst = want
                .iter()
                .zip(&got[r * inner..(r + 1) * inner])
                .map(|(w, g)| (w - g).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 1e-4 * scale,
                "step {t} row {r}: {worst} of {scale}"
            );
        }
    }
    // The states each row carries, in its own slot: the device's SSM state is [heads][N][hd].
    let mut ssm_dev = vec![0f32; n_slots * heads * n * hd];
    ssm_state.read(&mut ssm_dev, &stream).unwrap();
    let mut conv_dev = vec![0f32; n_slots * conv_dim * (kk - 1)];
    conv_state.read(&mut conv_dev, &stream).unwrap();
    for (r, &slot) in slots.iter().enumerate() {
        let s = slot as usize;
        let (conv, ssm) = &cpu[r];
        assert_eq!(
            &conv_dev[s * conv.len()..(s + 1) * conv.len()],
            &conv[..],
            "row {r}"
        );
        for (h, i, j) in
            (0..heads).flat_map(|h| (0..hd).flat_map(move |i| (0..n).map(move |j| (h, i, j))))
        {
            let want = ssm[(h * hd + i) * n + j];
            let got = ssm_dev[((s * heads + h) * n + j) * hd + i];
            assert!(
                (want - got).abs() <= 1e-5 * want.abs().max(1.0),
                "row {r} h {h} i {i} n {j}"
            );
        }
    }
}

#[test]
fn relu2_squares_the_positive_part() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    let x = upload(&[-2.0f32, -0.5, 0.0, 0.5, 3.0]);
    launch!(&kernels::function(&module, "relu2").unwrap(), &stream, false, (1, 1, 1), 32, 0; x.ptr, 5i32)
        .unwrap();
    let mut got = [0f32; 5];
    x.read(&mut got, &stream).unwrap();
    assert_eq!(got, [0.0, 0.0, 0.0, 0.25, 9.0]);
}
