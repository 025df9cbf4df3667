//! One token through the Mamba-2 mixer's recurrent core, in f32, as transformers' torch path
//! computes it (`causal_conv1d_update`, `mamba2_selective_state_update`, `Zamba2RMSNormGated`).
//! Prefill runs the same step token by token: mathematically transformers' chunked scan, summed
//! in another order.

use super::Mamba;
use crate::cpu::silu;

/// One sequence's state in one Mamba layer, borrowed from the state pool.
pub struct State<'a> {
    /// `[conv_dim][conv_kernel - 1]`: each conv channel's last inputs, oldest first.
    pub conv: &'a mut [f32],
    /// `[num_heads][head_dim][d_state]`.
    pub ssm: &'a mut [f32],
}

/// The mixer's constants per head, precomputed at load.
pub struct Params<'a> {
    pub conv_w: &'a [f32],
    pub conv_b: Option<&'a [f32]>,
    pub dt_bias: &'a [f32],
    /// A = -exp(A_log).
    pub a: &'a [f32],
    pub d: &'a [f32],
    pub norm_w: &'a [f32],
}

/// softplus as torch computes it (beta 1, threshold 20: linear above).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// One token: `zxbcdt` is in_proj's output for it; returns the gated, normed `[inner]` vector
/// that out_proj takes, and advances `state`. `dt_min` clamps dt from below (transformers'
/// chunked prefill does, with `time_step_min`; its decode step does not: 0 there).
pub fn step(
    m: &Mamba,
    p: &Params<'_>,
    st: &mut State<'_>,
    zxbcdt: &[f32],
    dt_min: f32,
) -> Vec<f32> {
    let (inner, conv_dim, k) = (m.inner(), m.conv_dim(), m.conv_kernel);
    let (z, rest) = zxbcdt.split_at(inner);
    let (xbc_in, dt_raw) = rest.split_at(conv_dim);
    // Causal depthwise conv over [window..., x], then SiLU; the window moves on by one.
    let mut xbc = vec![0.0f32; conv_dim];
    for c in 0..conv_dim {
        let win = &mut st.conv[c * (k - 1)..(c + 1) * (k - 1)];
        let w = &p.conv_w[c * k..(c + 1) * k];
        let mut acc = 0.0f32;
        for j in 0..k - 1 {
            acc += w[j] * win[j];
        }
        acc += w[k - 1] * xbc_in[c];
        if let Some(b) = p.conv_b {
            acc += b[c];
        }
        xbc[c] = silu(acc);
        win.copy_within(1.., 0);
        win[k - 2] = xbc_in[c];
    }
    let (x, bc) = xbc.split_at(inner);
    let (b, c) = bc.split_at(m.n_groups * m.d_state);
    let (hd, n) = (m.head_dim, m.d_state);
    let per_group = m.num_heads / m.n_groups;
    let mut y = vec![0.0f32; inner];
    for h in 0..m.num_heads {
        let dt = softplus(dt_raw[h] + p.dt_bias[h]).max(dt_min);
        let da = (dt * p.a[h]).exp();
        let g = h / per_group;
        let (bg, cg) = (&b[g * n..(g + 1) * n], &c[g * n..(g + 1) * n]);
        for i in 0..hd {
            let xi = x[h * hd + i];
            let s = &mut st.ssm[(h * hd + i) * n..(h * hd + i + 1) * n];
            let mut acc = 0.0f32;
            for j in 0..n {
                s[j] = s[j] * da + dt * bg[j] * xi;
                acc += s[j] * cg[j];
            }
            y[h * hd + i] = acc + xi * p.d[h];
        }
    }
    // Gated RMSNorm per group: y * silu(z), normed over each group's channels, times the weight.
    let gs = inner / m.n_groups;
    for (yg, (zg, wg)) in y
        .chunks_exact_mut(gs)
        .zip(z.chunks_exact(gs).zip(p.norm_w.chunks_exact(gs)))
    {
        for (v, &zv) in yg.iter_mut().zip(zg) {
            *v *= silu(zv);
        }
        let inv = 1.0 / (yg.iter().map(|v| v * v).sum::<f32>() / gs as f32 + m.eps).sqrt();
        for (v, &w) in yg.iter_mut().zip(wg) {
            *v = w * (*v * inv);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Mamba {
        Mamba {
            num_heads: 2,
            head_dim: 1,
            d_state: 1,
            n_groups: 1,
            conv_kernel: 2,
            chunk_size: 4,
            time_step_min: 0.0,
            conv_bias: false,
            proj_bias: false,
            ssm_cache_dtype: "float32".into(),
            eps: 0.0,
        }
    }

    /// One step on the given conv window and SSM state.
    fn run(
        p: &Params<'_>,
        conv: &mut [f32],
        ssm: &mut [f32],
        input: &[f32],
        dt_min: f32,
    ) -> Vec<f32> {
        step(&tiny(), p, &mut State { conv, ssm }, input, dt_min)
    }

    #[test]
    fn one_step_matches_a_hand_computation_and_the_state_carries() {
        // conv_dim = inner (2) + 2 * 1 * 1 = 4 channels, kernel 2: out = w0 * prev + w1 * now.
        let conv_w = [0.5, 1.0, 0.5, 1.0, 0.5, 1.0, 0.5, 1.0];
        let p = Params {
            conv_w: &conv_w,
            conv_b: None,
            dt_bias: &[0.0, 0.0],
            a: &[-1.0, -2.0],
            d: &[0.0, 1.0],
            norm_w: &[1.0, 1.0],
        };
        let (mut conv, mut ssm) = (vec![0.0; 4], vec![0.0; 2]);
        // z = [10, 10] (silu ~ 10), x = [1, 2], B = 1, C = 1, dt_raw = [0, 0] -> dt = ln 2.
        let input = [10.0, 10.0, 1.0, 2.0, 1.0, 1.0, 0.0, 0.0];
        let y = run(&p, &mut conv, &mut ssm, &input, 0.0);
        let dt = 2f32.ln();
        let (x0, x1, bc) = (silu(1.0), silu(2.0), silu(1.0));
        let s0 = dt * bc * x0;
        let s1 = dt * bc * x1;
        assert!(
            (ssm[0] - s0).abs() < 1e-6 && (ssm[1] - s1).abs() < 1e-6,
            "{ssm:?}"
        );
        assert_eq!(
            conv,
            vec![1.0, 2.0, 1.0, 1.0],
            "the window holds the raw inputs"
        );
        // y before the norm: [s0 * C, s1 * C + x1 * D], each times silu(10); normed over 2.
        let raw = [s0 * bc * silu(10.0), (s1 * bc + x1) * silu(10.0)];
        let inv = 1.0 / ((raw[0] * raw[0] + raw[1] * raw[1]) / 2.0).sqrt();
        assert!((y[0] - raw[0] * inv).abs() < 1e-5 && (y[1] - raw[1] * inv).abs() < 1e-5);
        // A second step decays the state by exp(dt * A) and sees the previous input in its conv.
        let before = ssm.clone();
        let zero_x = [10.0, 10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        run(&p, &mut conv, &mut ssm, &zero_x, 0.0);
        let (x0b, bcb) = (silu(0.5 * 1.0), silu(0.5 * 1.0));
        let want = before[0] * (-dt).exp() + dt * bcb * x0b; // A = -1
        assert!((ssm[0] - want).abs() < 1e-6, "{} vs {want}", ssm[0]);
    }

    #[test]
    fn dt_is_clamped_from_below_only_where_asked() {
        let conv_w = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0];
        let p = Params {
            conv_w: &conv_w,
            conv_b: None,
            dt_bias: &[-30.0, -30.0],
            a: &[-1.0, -1.0],
            d: &[0.0, 0.0],
            norm_w: &[1.0, 1.0],
        };
        let state_after = |dt_min: f32| {
            let (mut conv, mut ssm) = (vec![0.0; 4], vec![0.0; 2]);
            run(
                &p,
                &mut conv,
                &mut ssm,
                &[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
                dt_min,
            );
            ssm[0]
        };
        // softplus(-30) ~ 9e-14: unclamped the state barely moves; clamped at 0.01 it does.
        assert!(state_after(0.0) < 1e-12);
        assert!((state_after(0.01) - 0.01 * silu(1.0) * silu(1.0)).abs() < 1e-7);
    }
}
