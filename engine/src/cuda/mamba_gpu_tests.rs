//! The Mamba-2 decode kernels (engine/kernels/mamba.cu) on a GPU against the CPU reference
//! (hybrid/mamba.rs): decode rows in scattered state slots and a prefill chunk in one launch, the
//! outputs and the states compared.
//! Skips without a CUDA device (CI); run on the GPU box with ENGINE_REQUIRE_GPU set.

use super::device::DevBuf;
use super::gemv_gpu_tests::{
    bf16s, differing_bits, gpu, module, upload, values, variant_modules, widened, worst_and_scale,
};
use super::kernels;
use super::plan;
use crate::hybrid::mamba::{step, Params, State};
use crate::hybrid::Mamba;
use crate::launch;

/// The mixer's constants on the host (bf16-rounded where the device keeps bf16) and the device.
struct Mixer {
    m: Mamba,
    conv_w: Vec<f32>,
    conv_b: Vec<f32>,
    dt_bias: Vec<f32>,
    a: Vec<f32>,
    d: Vec<f32>,
    norm_w: Vec<f32>,
    dev: [DevBuf; 6],
}

impl Mixer {
    fn new(m: Mamba) -> Self {
        let (inner, conv_dim, heads, kk) = (m.inner(), m.conv_dim(), m.num_heads, m.conv_kernel);
        let (conv_w_b, conv_w) = bf16s(&values(conv_dim * kk, 1));
        let (conv_b_b, conv_b) = bf16s(&values(conv_dim, 2));
        let dt_bias: Vec<f32> = values(heads, 3).iter().map(|v| v - 2.0).collect();
        let a: Vec<f32> = (0..heads).map(|h| -((h + 1) as f32)).collect();
        let d: Vec<f32> = values(heads, 4).iter().map(|v| 1.0 + v).collect();
        let (norm_b, norm_w) = bf16s(
            &values(inner, 5)
                .iter()
                .map(|v| 1.0 + 0.2 * v)
                .collect::<Vec<_>>(),
        );
        let dev = [
            upload(&conv_w_b),
            upload(&conv_b_b),
            upload(&dt_bias),
            upload(&a),
            upload(&d),
            upload(&norm_b),
        ];
        Self {
            m,
            conv_w,
            conv_b,
            dt_bias,
            a,
            d,
            norm_w,
            dev,
        }
    }

    /// A mixer of `heads` heads of `hd` channels and `n` state values, two groups, a window of 4.
    fn shaped(heads: usize, hd: usize, n: usize) -> Self {
        Self::new(Mamba {
            num_heads: heads,
            head_dim: hd,
            d_state: n,
            n_groups: 2,
            conv_kernel: 4,
            chunk_size: 128,
            time_step_min: 0.001,
            conv_bias: true,
            proj_bias: false,
            ssm_cache_dtype: "float32".into(),
            eps: 1e-5,
        })
    }

    /// inner, conv_dim, in_proj's width, the conv window.
    fn widths(&self) -> (usize, usize, usize, usize) {
        let m = &self.m;
        (m.inner(), m.conv_dim(), m.in_proj_dim(), m.conv_kernel)
    }

    fn params(&self) -> Params<'_> {
        Params {
            conv_w: &self.conv_w,
            conv_b: Some(&self.conv_b),
            dt_bias: &self.dt_bias,
            a: &self.a,
            d: &self.d,
            norm_w: &self.norm_w,
        }
    }
}

/// Device state and scratch for `slots` slots and up to `rows` rows.
struct Run {
    conv_state: DevBuf,
    ssm_state: DevBuf,
    xbc: DevBuf,
    y: DevBuf,
    out: DevBuf,
}

impl Run {
    /// `slots` state slots, every value `fill`, and scratch for `rows` rows.
    fn new(mx: &Mixer, slots: usize, rows: usize, fill: f32) -> Self {
        let (inner, conv_dim, _, kk) = mx.widths();
        let m = &mx.m;
        let scratch = |width: usize| DevBuf::zeroed(rows * width * 4).unwrap();
        Self {
            conv_state: upload(&vec![fill; slots * conv_dim * (kk - 1)]),
            ssm_state: upload(&vec![fill; slots * m.num_heads * m.d_state * m.head_dim]),
            xbc: scratch(conv_dim),
            y: scratch(inner),
            out: scratch(inner),
        }
    }
}

/// One launch's rows: segment s is the rows `starts[s]..starts[s + 1]` of `zx`, in slot
/// `slots[s]`, each row at its position; the conv over chunks of `conv_rows` rows (0: a block row
/// per segment, as decode) and the SSM staging `tile` rows at a time through shared memory (0:
/// none, as decode), dt clamped at `dt_min` (0 in decode).
struct Segments<'a> {
    starts: &'a [i32],
    slots: &'a [i32],
    positions: &'a [i32],
    dt_min: f32,
    conv_rows: usize,
    tile: usize,
    /// Decode's step: None for `mamba_ssm_step` (a block an item), else `mamba_ssm_step_staged`
    /// on this many blocks (0: the backend's grid, every block resident).
    step_blocks: Option<usize>,
}

impl<'a> Segments<'a> {
    /// Decode: every row its own segment.
    fn decode(starts: &'a [i32], slots: &'a [i32], positions: &'a [i32]) -> Self {
        Self {
            starts,
            slots,
            positions,
            dt_min: 0.0,
            conv_rows: 0,
            tile: 0,
            step_blocks: None,
        }
    }
}

/// The tests' heads, channels a head and state values: the 8B's per-head sizes and a small state,
/// both prefilled by the chunked scan (mamba_ssd.cu), and heads of 80 channels (Nemotron-Nano-9B's),
/// past the chunked scan's tiles, prefilled by the sequential one.
const SHAPES: [(usize, usize, usize); 3] = [(8, 64, 128), (4, 32, 32), (2, 80, 64)];

/// Rows of the tests' long prompt: past two of the chunked scan's chunks.
const LONG: usize = 2 * plan::MAMBA_SSD_ROWS + 22;

/// Launches conv, SSM and gated norm over `seg`, as the backend does (ops.rs `mamba`), and
/// returns the gated output.
fn launch_mixer(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    module: &super::kernels::Kernels,
    mx: &Mixer,
    r: &Run,
    zx: &[f32],
    seg: &Segments<'_>,
) -> Vec<f32> {
    let Segments {
        starts,
        slots,
        positions,
        dt_min,
        conv_rows,
        tile,
        step_blocks,
    } = *seg;
    let k = |n: &str| kernels::function(module, n).unwrap();
    let m = &mx.m;
    let (inner, conv_dim, in_dim) = (m.inner(), m.conv_dim(), m.in_proj_dim());
    let split = plan::mamba_ssm_split(m.d_state).unwrap();
    let (segs, rows) = (slots.len(), *starts.last().unwrap() as usize);
    let (zx_d, slots_d, pos_d, starts_d) =
        (upload(zx), upload(slots), upload(positions), upload(starts));
    let i = |v: usize| v as i32;
    let dev = &mx.dev;
    let lens = starts.windows(2).map(|w| (w[1] - w[0]) as usize);
    let blocks = if conv_rows == 0 {
        segs
    } else {
        plan::mamba_conv_chunks(lens, conv_rows)
    };
    launch!(&k("mamba_conv"), stream, false, ((conv_dim as u32).div_ceil(128), blocks as u32, 1), 128, 0;
        zx_d.ptr, starts_d.ptr, i(segs), i(conv_rows), i(in_dim), i(inner), i(conv_dim),
        i(m.conv_kernel), dev[0].ptr, dev[1].ptr, r.conv_state.ptr, slots_d.ptr, pos_d.ptr, r.xbc.ptr)
    .unwrap();
    // Decode (tile 0) is the step's kernel, on the backend's grid unless the test names one;
    // prefill the chunked scan where the heads fit it, else the sequential one staging `tile`
    // rows: as ops.rs launches them.
    if tile == 0 {
        let items = m.num_heads * segs;
        let threads = plan::mamba_ssm_threads(m, false);
        let (step, grid, smem) = match step_blocks {
            None => (k("mamba_ssm_step"), (m.num_heads as u32, segs as u32, 1), 0),
            Some(blocks) => {
                let sms = stream
                    .context()
                    .attribute(
                        cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                    )
                    .unwrap() as usize;
                let (f, resident) = super::load::mamba_step_function(module, m, sms).unwrap();
                let blocks = if blocks == 0 { resident } else { blocks }.min(items);
                (f, (blocks as u32, 1, 1), plan::mamba_step_smem_bytes(m))
            }
        };
        launch!(&step, stream, false, grid, threads, smem;
            zx_d.ptr, r.xbc.ptr, starts_d.ptr, i(segs), i(in_dim), i(inner), i(conv_dim), i(m.num_heads),
            i(m.head_dim), i(m.d_state), i(m.n_groups), i(split), dev[2].ptr, dev[3].ptr, dev[4].ptr,
            r.ssm_state.ptr, slots_d.ptr, pos_d.ptr, dt_min, r.y.ptr)
        .unwrap();
    } else {
        let (ssm, threads, smem) = if plan::mamba_ssd(m) {
            let smem = plan::mamba_ssd_smem_bytes();
            let f = super::load::staged_function(module, "mamba_ssd", smem).unwrap();
            (f, plan::MAMBA_SSD_THREADS, smem)
        } else {
            let smem = plan::mamba_scan_smem_bytes(m, tile);
            (k("mamba_ssm"), plan::mamba_ssm_threads(m, true), smem)
        };
        launch!(&ssm, stream, false, (m.num_heads as u32, segs as u32, 1), threads, smem;
            zx_d.ptr, r.xbc.ptr, starts_d.ptr, i(in_dim), i(inner), i(conv_dim), i(m.num_heads), i(m.head_dim),
            i(m.d_state), i(m.n_groups), i(split), i(tile), dev[2].ptr, dev[3].ptr, dev[4].ptr, r.ssm_state.ptr,
            slots_d.ptr, pos_d.ptr, dt_min, r.y.ptr)
        .unwrap();
    }
    launch!(&k("mamba_gated_norm"), stream, false, (m.n_groups as u32, rows as u32, 1),
        plan::mamba_norm_threads(m), 0;
        r.y.ptr, zx_d.ptr, i(in_dim), i(inner), i(m.n_groups), dev[5].ptr, m.eps, r.out.ptr, 0u64)
    .unwrap();
    let mut got = vec![0f32; rows * inner];
    r.out.read(&mut got, stream).unwrap();
    got
}

/// `got` within `tol` of the largest value of `want`.
fn assert_within(want: &[f32], got: &[f32], tol: f32, what: &str) {
    let (worst, scale) = worst_and_scale(want, got);
    assert!(worst <= tol * scale, "{what}: {worst} of {scale}");
}

/// f32 kernels against the f32 reference: sums in another order.
fn assert_close(want: &[f32], got: &[f32], what: &str) {
    assert_within(want, got, 1e-4, what);
}

/// What prefill's outputs and states may differ by from f32 on `m`'s heads: the chunked scan
/// rounds its products' operands to tf32 (2^-11 of each at most; mamba_ssd.cu), the sequential
/// one computes in f32.
fn prefill_tolerance(m: &Mamba) -> f32 {
    if plan::mamba_ssd(m) {
        2e-3
    } else {
        1e-4
    }
}

/// Decode (rows in scattered slots, one step each, twice: from a fresh state, then carrying it),
/// prefill (one sequence of [`LONG`] rows in one launch, as the backend cuts it: conv chunks of 16
/// rows, the scan's chunks or tiles; then a decode step from the state it left) and two prompts
/// prefilled together in conv chunks of three (the window's length), continuing from their states
/// mid-chunk, on each of [`SHAPES`], against the CPU reference step by step; then the states each
/// slot holds.
#[test]
fn mamba_kernels_match_the_cpu_reference_in_decode_and_prefill() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    for (heads, hd, n) in SHAPES {
        let mx = Mixer::shaped(heads, hd, n);
        let (m, (inner, conv_dim, in_dim, kk)) = (&mx.m, mx.widths());
        let (n_slots, max_rows) = (3usize, LONG);
        let r = Run::new(&mx, n_slots, max_rows, 9.0);
        // Stale values (9.0) fill every slot: a sequence at position 0 must not read them.
        let mut cpu: Vec<(Vec<f32>, Vec<f32>)> = (0..n_slots)
            .map(|_| (vec![0.0; conv_dim * (kk - 1)], vec![0.0; inner * n]))
            .collect();
        let mut reference = |slot: usize, zx: &[f32], dt_min: f32| {
            let (conv, ssm) = &mut cpu[slot];
            step(m, &mx.params(), &mut State { conv, ssm }, zx, dt_min)
        };
        // Decode: rows in slots 2, 0 (positions 0, then 1), each its own segment.
        let slots = [2i32, 0];
        for t in 0..2 {
            let zx = values(slots.len() * in_dim, 10 + t as u64);
            let positions = [t; 2];
            let seg = Segments::decode(&[0, 1, 2], &slots, &positions);
            let got = launch_mixer(&stream, &module, &mx, &r, &zx, &seg);
            for (row, &slot) in slots.iter().enumerate() {
                let want = reference(slot as usize, &zx[row * in_dim..(row + 1) * in_dim], 0.0);
                let what = format!("{heads}x{hd}x{n} decode step {t} row {row}");
                assert_close(&want, &got[row * inner..(row + 1) * inner], &what);
            }
        }
        // Prefill: slot 1, rows at positions 0..LONG in one launch (dt clamped), chunked and
        // staged as the backend does it; then a decode step.
        let zx = values(LONG * in_dim, 20);
        let positions: Vec<i32> = (0..LONG as i32).collect();
        let seg = Segments {
            starts: &[0, LONG as i32],
            slots: &[1],
            positions: &positions,
            dt_min: 0.001,
            conv_rows: plan::MAMBA_CONV_ROWS,
            tile: plan::mamba_scan_tile(m),
            step_blocks: None,
        };
        let got = launch_mixer(&stream, &module, &mx, &r, &zx, &seg);
        let tol = prefill_tolerance(m);
        for t in 0..LONG {
            let want = reference(1, &zx[t * in_dim..(t + 1) * in_dim], 0.001);
            let what = format!("{heads}x{hd}x{n} prefill row {t}");
            assert_within(&want, &got[t * inner..(t + 1) * inner], tol, &what);
        }
        let zx = values(in_dim, 21);
        let seg = Segments::decode(&[0, 1], &[1], &[LONG as i32]);
        let got = launch_mixer(&stream, &module, &mx, &r, &zx, &seg);
        let want = reference(1, &zx, 0.0);
        let what = format!("{heads}x{hd}x{n} decode after prefill");
        assert_within(&want, &got, tol, &what);
        // Two prompts prefilled together, continuing from their states (slots 0 and 2 at
        // positions 2..6 and 2..4: a chunk cut short at both ends), in tiles of two rows (the
        // sequential scan) and conv chunks of three: four rows of
        // one (a chunk past the first, whose window is the first's rows; the first writes the
        // window back from the last rows), two of the other (shorter than the window).
        let zx = values(6 * in_dim, 22);
        let seg = Segments {
            starts: &[0, 4, 6],
            slots: &[0, 2],
            positions: &[2, 3, 4, 5, 2, 3],
            dt_min: 0.001,
            conv_rows: kk - 1,
            tile: 2,
            step_blocks: None,
        };
        let got = launch_mixer(&stream, &module, &mx, &r, &zx, &seg);
        for (row, slot) in [0usize, 0, 0, 0, 2, 2].into_iter().enumerate() {
            let want = reference(slot, &zx[row * in_dim..(row + 1) * in_dim], 0.001);
            let what = format!("{heads}x{hd}x{n} two-prompt prefill row {row}");
            assert_within(&want, &got[row * inner..(row + 1) * inner], tol, &what);
        }
        // The states each slot holds: the device's SSM state is [heads][N][hd].
        let mut ssm_dev = vec![0f32; n_slots * heads * n * hd];
        r.ssm_state.read(&mut ssm_dev, &stream).unwrap();
        let mut conv_dev = vec![0f32; n_slots * conv_dim * (kk - 1)];
        r.conv_state.read(&mut conv_dev, &stream).unwrap();
        for (s, (conv, ssm)) in cpu.iter().enumerate() {
            assert_eq!(
                &conv_dev[s * conv.len()..(s + 1) * conv.len()],
                &conv[..],
                "slot {s}"
            );
            let scale = ssm.iter().fold(1f32, |a, v| a.max(v.abs()));
            let state_tol = if plan::mamba_ssd(m) { tol } else { 1e-5 };
            for (h, i, j) in
                (0..heads).flat_map(|h| (0..hd).flat_map(move |i| (0..n).map(move |j| (h, i, j))))
            {
                let want = ssm[(h * hd + i) * n + j];
                let got = ssm_dev[((s * heads + h) * n + j) * hd + i];
                assert!(
                    (want - got).abs() <= state_tol * scale,
                    "{heads}x{hd}x{n} slot {s} h {h} i {i} n {j}: {got} vs {want} (of {scale})"
                );
            }
        }
    }
}

/// Prefill and decode agree: one sequence of [`LONG`] rows prefilled in one launch and the same
/// rows as decode steps (one channel a thread, from global memory) give the same outputs and
/// leave the same states, dt unclamped in both (prefill's clamp is transformers', decode has
/// none): bit for bit where prefill scans sequentially (the same expressions in the same order),
/// within [`prefill_tolerance`] where it scans in chunks (tf32 operands, the sums in another
/// order).
#[test]
fn prefill_and_decode_agree() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    for (heads, hd, n) in SHAPES {
        let mx = Mixer::shaped(heads, hd, n);
        let (m, (inner, conv_dim, in_dim, kk)) = (&mx.m, mx.widths());
        let exact = !plan::mamba_ssd(m);
        let r = Run::new(&mx, 2, LONG, 0.0);
        let zx = values(LONG * in_dim, 30);
        let positions: Vec<i32> = (0..LONG as i32).collect();
        let seg = Segments {
            starts: &[0, LONG as i32],
            slots: &[0],
            positions: &positions,
            dt_min: 0.0,
            conv_rows: plan::MAMBA_CONV_ROWS,
            tile: plan::mamba_scan_tile(m),
            step_blocks: None,
        };
        let prefilled = launch_mixer(&stream, &module, &mx, &r, &zx, &seg);
        for t in 0..LONG {
            let one = &zx[t * in_dim..(t + 1) * in_dim];
            let got = launch_mixer(
                &stream,
                &module,
                &mx,
                &r,
                one,
                &Segments::decode(&[0, 1], &[1], &[t as i32]),
            );
            let want = &prefilled[t * inner..(t + 1) * inner];
            let what = format!("{heads}x{hd}x{n} row {t}");
            if exact {
                let differ = differing_bits(want, &got);
                assert_eq!(differ, 0, "{what}: {differ} of {inner} outputs differ");
            } else {
                assert_within(want, &got, prefill_tolerance(m), &what);
            }
        }
        let mut ssm = vec![0f32; 2 * heads * n * hd];
        r.ssm_state.read(&mut ssm, &stream).unwrap();
        let (a, b) = ssm.split_at(heads * n * hd);
        let scale = a.iter().fold(1f32, |s, v| s.max(v.abs()));
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let agree = if exact {
                x.to_bits() == y.to_bits()
            } else {
                (x - y).abs() <= prefill_tolerance(m) * scale
            };
            assert!(agree, "{heads}x{hd}x{n}: SSM state value {i}: {x} vs {y}");
        }
        let mut conv = vec![0f32; 2 * conv_dim * (kk - 1)];
        r.conv_state.read(&mut conv, &stream).unwrap();
        let (a, b) = conv.split_at(conv_dim * (kk - 1));
        assert_eq!(a, b, "{heads}x{hd}x{n}: the conv windows differ");
    }
}

/// A prompt's outputs and the state it leaves do not depend on what else its pass holds: [`LONG`]
/// rows prefilled alone, then again beside a shorter prompt and a longer one (so it is neither
/// the first segment nor the last, nor the first block to start), bit for bit.
#[test]
fn a_prompts_bits_do_not_depend_on_its_pass() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    for (heads, hd, n) in SHAPES {
        let mx = Mixer::shaped(heads, hd, n);
        let (m, (inner, _, in_dim, _)) = (&mx.m, mx.widths());
        let (short, long) = (37usize, LONG + 40);
        let r = Run::new(&mx, 4, short + LONG + long, 0.0);
        let zx = values(LONG * in_dim, 40);
        let prefill = |starts: &[i32], slots: &[i32], zx: &[f32]| {
            let rows = *starts.last().unwrap() as usize;
            let positions: Vec<i32> = starts.windows(2).flat_map(|w| 0..w[1] - w[0]).collect();
            assert_eq!(positions.len(), rows);
            let seg = Segments {
                starts,
                slots,
                positions: &positions,
                dt_min: 0.001,
                conv_rows: plan::MAMBA_CONV_ROWS,
                tile: plan::mamba_scan_tile(m),
                step_blocks: None,
            };
            launch_mixer(&stream, &module, &mx, &r, zx, &seg)
        };
        let alone = prefill(&[0, LONG as i32], &[0], &zx);
        // Shortest first, as plan.rs prefill_passes orders a pass.
        let mut together = values(short * in_dim, 41);
        together.extend_from_slice(&zx);
        together.extend_from_slice(&values(long * in_dim, 42));
        let b = (short + LONG) as i32;
        let got = prefill(
            &[0, short as i32, b, b + long as i32],
            &[2, 1, 3],
            &together,
        );
        let got = &got[short * inner..(short + LONG) * inner];
        let differ = differing_bits(&alone, got);
        assert_eq!(differ, 0, "{heads}x{hd}x{n}: {differ} outputs differ");
        let mut ssm = vec![0f32; 4 * heads * n * hd];
        r.ssm_state.read(&mut ssm, &stream).unwrap();
        let slot = |s: usize| &ssm[s * heads * n * hd..(s + 1) * heads * n * hd];
        assert_eq!(
            differing_bits(slot(0), slot(1)),
            0,
            "{heads}x{hd}x{n}: the SSM states differ"
        );
    }
}

#[test]
fn relu2_squares_the_positive_part() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    let relu2 = kernels::function(&module, "relu2").unwrap();
    // bf16 in (the up GEMM's output), bf16 out, the square taken in f32 and rounded once: 1.5^2
    // is exact, (1 + 2^-7)^2 = 1.0156860 rounds to 1.015625 (bf16 keeps 8 bits).
    let x = upload(&bf16s(&[-2.0, -0.5, 0.0, 0.5, 3.0, 1.5, 1.0078125, -7.0]).0);
    let out = DevBuf::zeroed(8 * 2).unwrap();
    launch!(&relu2, &stream, false, (1, 1, 1), 32, 0; x.ptr, 8i32, out.ptr).unwrap();
    let mut got = [0u16; 8];
    out.read(&mut got, &stream).unwrap();
    assert_eq!(
        widened(&got),
        [0.0, 0.0, 0.0, 0.25, 9.0, 2.25, 1.015625, 0.0]
    );
    // From a pointer 2 bytes past 8-byte alignment, and a count that is not a multiple of four:
    // one value at a time, the same values.
    let out = DevBuf::zeroed(8 * 2).unwrap();
    launch!(&relu2, &stream, false, (1, 1, 1), 32, 0; x.ptr + 2, 7i32, out.ptr + 2).unwrap();
    out.read(&mut got, &stream).unwrap();
    assert_eq!(
        widened(&got),
        [0.0, 0.0, 0.0, 0.25, 9.0, 2.25, 1.015625, 0.0]
    );
}

#[test]
fn swiglu_reads_gate_and_up_as_bf16() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    let swiglu = kernels::function(&module, "swiglu").unwrap();
    // Rows of gate then up (bf16, the stacked GEMM's output); silu(g) * u in f32, rounded once.
    // An intermediate width of 4 takes the 8-byte path, 3 the one-at-a-time path.
    for inter in [4usize, 3] {
        let rows = 2;
        let gu: Vec<f32> = (0..rows * 2 * inter)
            .map(|i| ((i * 7) % 11) as f32 * 0.375 - 1.75)
            .collect();
        let (gu, guf) = bf16s(&gu);
        let want: Vec<f32> = (0..rows * inter)
            .map(|k| {
                let (r, j) = (k / inter, k % inter);
                let (g, u) = (guf[r * 2 * inter + j], guf[r * 2 * inter + inter + j]);
                half::bf16::from_f32(g / (1.0 + (-g).exp()) * u).to_f32()
            })
            .collect();
        let x = upload(&gu);
        let out = DevBuf::zeroed(rows * inter * 2).unwrap();
        launch!(&swiglu, &stream, false, (1, rows as u32, 1), 32, 0; x.ptr, out.ptr, inter as i32)
            .unwrap();
        let mut got = vec![0u16; rows * inter];
        out.read(&mut got, &stream).unwrap();
        // expf against Rust's exp: the same bf16 but where the f32 results straddle a rounding
        // boundary, one bf16 step at most.
        for (k, (g, w)) in widened(&got).iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= w.abs() / 128.0,
                "inter {inter}, value {k}: {g} against {w}"
            );
        }
    }
}

/// The decode step's two forms (mamba.cu): a block an item (sequence, head), and persistent, a
/// block taking the items a grid apart, each staged into shared memory an item ahead. Both give
/// the same outputs and leave the same states, whatever the staged form's grid: five sequences
/// in scattered slots (one of them fresh), one step by the first form, then by the second on
/// grids of 1, 2, 3 and 7 blocks and the backend's, bit for bit, on each of [`SHAPES`]. A mix-up
/// of stages, slots or rows between items would show as other bits on some grid.
#[test]
fn the_decode_steps_forms_and_grids_give_the_same_bits() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    let (starts, slots, positions) = ([0, 1, 2, 3, 4, 5], [4, 0, 5, 2, 1], [3, 0, 7, 1, 2]);
    for (heads, hd, n) in SHAPES {
        let mx = Mixer::shaped(heads, hd, n);
        let (inner, conv_dim, in_dim, kk) = mx.widths();
        let r = Run::new(&mx, 6, 5, 0.0);
        let ssm0 = values(6 * heads * n * hd, 50);
        let conv0 = values(6 * conv_dim * (kk - 1), 51);
        let zx = values(5 * in_dim, 52);
        let mut first: Option<(Vec<f32>, Vec<f32>, Vec<f32>)> = None;
        for blocks in [None, Some(0), Some(1), Some(2), Some(3), Some(7)] {
            r.ssm_state.write(0, &ssm0).unwrap();
            r.conv_state.write(0, &conv0).unwrap();
            let seg = Segments {
                step_blocks: blocks,
                ..Segments::decode(&starts, &slots, &positions)
            };
            let out = launch_mixer(&stream, &module, &mx, &r, &zx, &seg);
            let mut y = vec![0f32; 5 * inner];
            r.y.read(&mut y, &stream).unwrap();
            let mut ssm = vec![0f32; ssm0.len()];
            r.ssm_state.read(&mut ssm, &stream).unwrap();
            assert!(
                differing_bits(&ssm, &ssm0) > 0,
                "{heads}x{hd}x{n}: the step left the states as they were"
            );
            match &first {
                None => first = Some((out, y, ssm)),
                Some((o, y0, s0)) => {
                    let what = format!("{heads}x{hd}x{n}, staged on {blocks:?} blocks");
                    assert_eq!(differing_bits(o, &out), 0, "{what}: gated outputs differ");
                    assert_eq!(differing_bits(y0, &y), 0, "{what}: y differs");
                    assert_eq!(differing_bits(s0, &ssm), 0, "{what}: SSM states differ");
                }
            }
        }
    }
}

/// Nemotron-H-8B's conv (10,240 channels, a window of 4, rows 18,560 wide) and the battery's
/// batch-8 pass (eight prompts, 2,712 rows; `fresh`: every one from position 0, else each
/// continuing from a window in its slot).
struct ConvPass {
    mx: Mixer,
    lens: Vec<usize>,
    run: Run,
    zx: DevBuf,
    starts: DevBuf,
    slots: DevBuf,
    positions: DevBuf,
    conv0: Vec<f32>,
}

impl ConvPass {
    fn new(fresh: bool) -> Self {
        let mx = Mixer::new(Mamba {
            n_groups: 8,
            ..Mixer::shaped(128, 64, 128).m
        });
        let (_, conv_dim, in_dim, kk) = mx.widths();
        let lens = vec![5usize, 95, 180, 260, 340, 420, 612, 800];
        let mut starts = vec![0i32];
        for n in &lens {
            starts.push(starts.last().unwrap() + *n as i32);
        }
        let rows = *starts.last().unwrap() as usize;
        // Slots in another order than the segments, and positions past 0 unless fresh.
        let slots: Vec<i32> = (0..lens.len() as i32).rev().collect();
        let from = if fresh { 0 } else { 7 };
        let positions: Vec<i32> = lens.iter().flat_map(|&n| from..from + n as i32).collect();
        let conv0 = values(lens.len() * conv_dim * (kk - 1), 61);
        let run = Run::new(&mx, lens.len(), rows, 0.0);
        Self {
            zx: upload(&values(rows * in_dim, 60)),
            starts: upload(&starts),
            slots: upload(&slots),
            positions: upload(&positions),
            mx,
            lens,
            run,
            conv0,
        }
    }

    /// One launch of `mamba_conv` at `rows_per` rows a chunk and `threads` a block.
    fn launch(
        &self,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
        f: &cudarc::driver::CudaFunction,
        rows_per: usize,
        threads: u32,
    ) -> crate::error::Result<()> {
        let (inner, conv_dim, in_dim, kk) = self.mx.widths();
        let i = |v: usize| v as i32;
        let blocks = plan::mamba_conv_chunks(self.lens.iter().copied(), rows_per) as u32;
        launch!(f, stream, false, ((conv_dim as u32).div_ceil(threads), blocks, 1), threads, 0;
            self.zx.ptr, self.starts.ptr, i(self.lens.len()), i(rows_per), i(in_dim), i(inner), i(conv_dim),
            i(kk), self.mx.dev[0].ptr, self.mx.dev[1].ptr, self.run.conv_state.ptr, self.slots.ptr,
            self.positions.ptr, self.run.xbc.ptr)
    }

    /// The outputs and the slots' windows after one launch from the first windows.
    fn outputs(
        &self,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
        f: &cudarc::driver::CudaFunction,
        rows_per: usize,
        threads: u32,
    ) -> (Vec<f32>, Vec<f32>) {
        self.run.conv_state.write(0, &self.conv0).unwrap();
        self.launch(stream, f, rows_per, threads).unwrap();
        let rows: usize = self.lens.iter().sum();
        let mut xbc = vec![0f32; rows * self.mx.m.conv_dim()];
        self.run.xbc.read(&mut xbc, stream).unwrap();
        let mut state = vec![0f32; self.conv0.len()];
        self.run.conv_state.read(&mut state, stream).unwrap();
        (xbc, state)
    }
}

/// The prefill conv's outputs and the windows it leaves have the same bits whatever the cut into
/// chunks and blocks (a row's sum is one expression whatever the chunking, mamba.cu), on the 8B's
/// widths, whether the prompts start fresh or continue from their slots' windows: so the cut is
/// chosen for speed alone ([`prefill_conv_timed`]).
#[test]
fn the_prefill_convs_cut_does_not_change_its_bits() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    let f = kernels::function(&module, "mamba_conv").unwrap();
    for fresh in [true, false] {
        let pass = ConvPass::new(fresh);
        let (x0, s0) = pass.outputs(&stream, &f, plan::MAMBA_CONV_ROWS, 128);
        assert!(
            differing_bits(&s0, &pass.conv0) > 0,
            "the conv left the windows as they were"
        );
        for (rows_per, threads) in [(4, 128), (16, 128), (64, 256), (1000, 64)] {
            let (x, s) = pass.outputs(&stream, &f, rows_per, threads);
            let what = format!("fresh {fresh}, {rows_per} rows a chunk, {threads} threads");
            assert_eq!(differing_bits(&x0, &x), 0, "{what}: outputs differ");
            assert_eq!(differing_bits(&s0, &s), 0, "{what}: windows differ");
        }
    }
}

/// The prefill conv timed (ignored: a measurement, run by hand on the GPU box with `--ignored
/// --nocapture`) on [`ConvPass`] at several rows a chunk and threads a block; the rate counts the
/// conv's input and output columns once. On an H100 (session 31): 16 rows a chunk 133.5 us, 32
/// 123.2, 64 122.1 (128 threads; 256 slower at each), hence [`plan::MAMBA_CONV_ROWS`].
#[test]
#[ignore]
fn prefill_conv_timed() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    let f = kernels::function(&module, "mamba_conv").unwrap();
    let pass = ConvPass::new(true);
    let rows: usize = pass.lens.iter().sum();
    let bytes = (rows * pass.mx.m.conv_dim() * 8) as f64;
    for (rows_per, threads) in [(16, 128), (16, 256), (32, 128), (64, 128), (64, 256)] {
        let run = || pass.launch(&stream, &f, rows_per, threads);
        let s = super::tune::time_runs(&ctx, &stream, 5, 50, run).unwrap() / 1e3;
        println!(
            "mamba_conv {rows} rows, {rows_per} rows a chunk, {threads} threads: {:.1} us, {:.2} TB/s",
            s * 1e6,
            bytes / s / 1e12
        );
    }
}

/// The chunked prefill scan (`mamba_ssd`) timed (ignored: a measurement, run by hand on the GPU
/// box with `--ignored --nocapture`) on [`ConvPass`]'s 2,712 rows, the conv run once before it. Each
/// entry of `SSD_VARIANTS` is the Mamba unit compiled with its defines ([`variant_modules`]), so one
/// call times a kernel's variants side by side; each prints its time and its outputs' largest
/// difference from the first's over their largest. On an H100 (session 33): 390 us before the
/// scan's operands were rounded once a chunk and the 8B's shape made a constant, 266 us after
/// (docs/ENGINE.md).
#[test]
#[ignore]
fn prefill_ssd_timed() {
    let Some((ctx, stream, _)) = gpu() else {
        return;
    };
    let module = module(&ctx);
    let pass = ConvPass::new(true);
    pass.outputs(
        &stream,
        &kernels::function(&module, "mamba_conv").unwrap(),
        plan::MAMBA_CONV_ROWS,
        128,
    );
    let m = &pass.mx.m;
    let (inner, conv_dim, in_dim, _) = pass.mx.widths();
    let rows: usize = pass.lens.iter().sum();
    let smem = plan::mamba_ssd_smem_bytes();
    let i = |v: usize| v as i32;
    let (r, dev) = (&pass.run, &pass.mx.dev);
    let split = plan::mamba_ssm_split(m.d_state).unwrap();
    let mut first: Option<Vec<f32>> = None;
    for (v, md) in variant_modules(&ctx, "mamba_ssd.cu", "SSD_VARIANTS") {
        let f = super::load::with_smem(md.load_function("mamba_ssd").unwrap(), smem).unwrap();
        let run = || {
            launch!(&f, &stream, false, (m.num_heads as u32, pass.lens.len() as u32, 1),
                plan::MAMBA_SSD_THREADS, smem;
                pass.zx.ptr, r.xbc.ptr, pass.starts.ptr, i(in_dim), i(inner), i(conv_dim), i(m.num_heads),
                i(m.head_dim), i(m.d_state), i(m.n_groups), i(split), 0i32, dev[2].ptr, dev[3].ptr,
                dev[4].ptr, r.ssm_state.ptr, pass.slots.ptr, pass.positions.ptr, 0.001f32, r.y.ptr)
        };
        let ms = super::tune::time_runs(&ctx, &stream, 3, 20, run).unwrap();
        let mut y = vec![0f32; rows * inner];
        r.y.read(&mut y, &stream).unwrap();
        let worst = first.as_ref().map_or(0.0, |y0| {
            let (worst, scale) = worst_and_scale(y0, &y);
            worst / scale
        });
        println!(
            "mamba_ssd {v}: {rows} rows, {:.1} us; outputs {worst:.2e} of the first's largest",
            ms * 1e3
        );
        if first.is_none() {
            first = Some(y);
        }
    }
}
