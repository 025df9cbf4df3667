//! The GEMMs (prefill, and the decode step on cuBLAS) through cuBLASLt, with one algorithm
//! pinned per weight shape at load, so that a row's result does not depend on how many rows share
//! its GEMM. cuBLAS's own heuristic chooses its kernel by the number of rows (and may split K
//! over blocks), which would make a prompt's bits depend on the prompts prefilled beside it and a
//! decode row's on the batch; with one kernel and K never split, a row is one tile's sum over K in
//! one order whatever the row count. So a prefill pass is one GEMM over every prompt's rows, and
//! the decode step on cuBLAS gives a row the same bits at every batch it runs.
//!
//! The candidates for a shape are cuBLASLt's heuristic picks at the largest row count the shape
//! runs and at 32 rows, split-K forced off; each is checked at load, not assumed: rows 0-7 of a
//! GEMM over the largest row count, and rows `o`..`o + 8` further down, must have the bits of
//! GEMMs over those 8 rows alone, and row 0 those of a GEMM of one row (random inputs, the
//! model's own weights). A candidate that fails is kept in the report, never chosen. Each is
//! timed at each of the shape's [`LAYER_ROWS`]; the one chosen has the smallest sum over those
//! rows of its time over the fastest candidate's there, and cuBLASLt's first pick stays unless
//! another's sum is [`tune::MARGIN`] smaller (machines of one kind choose alike). What pinning
//! costs, per row count, is in `ready.features.gemm_tuning`. Cached beside the GEMV tuning
//! (tune.rs), keyed by cuBLASLt's version, the shape and its rows; the opaque algorithm is stored
//! as cuBLASLt gives it (it may be reused with the same cuBLASLt version).

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::time::Instant;

use cudarc::cublaslt::sys;
use serde::{Deserialize, Serialize};

use super::backend::{CudaBackend, BF16, F32};
use super::device::DevBuf;
use super::load::{Matrix, Mixer};
use super::plan::{self, PREFILL_CHUNK};
use super::tune;
use crate::error::{Error, Result};

/// The row counts a layer's GEMM is timed at: a short prompt (and the decode step of up to 8),
/// the decode step of 32, a medium prompt, a full prefill pass.
pub const LAYER_ROWS: [usize; 4] = [8, 32, 256, PREFILL_CHUNK];
/// The lm_head's GEMM runs in the decode step on cuBLAS only (a prompt's last row takes the
/// GEMV), so at most [`plan::MAX_BATCH`] rows.
pub const LM_HEAD_ROWS: [usize; 2] = [8, plan::MAX_BATCH];
/// Heuristic picks asked for at each of the two row counts.
const PICKS: i32 = 8;

/// One candidate algorithm for a shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Algo {
    /// cuBLASLt's opaque description (`cublasLtMatmulAlgo_t`), split-K off.
    pub data: [u64; 8],
    /// What it says of itself (`CUBLASLT_ALGO_CONFIG_*`), for the reader.
    pub id: u32,
    pub tile: u32,
    pub stages: u32,
    pub cluster: u32,
    pub swizzle: u32,
    pub custom: u32,
    /// Whether a row's bits were the same at every row count checked.
    pub invariant: bool,
    /// Microseconds per GEMM at each of the shape's `rows`.
    pub us: Vec<f64>,
}

/// One weight shape's candidates and the one chosen.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GemmShape {
    /// cuBLASLt's version: what the algorithms depend on besides the GPU (the cache file's name).
    pub key: String,
    /// The weight: `out` x `inp` (torch's [out, in]).
    pub out: usize,
    pub inp: usize,
    pub rows: Vec<usize>,
    /// cuBLASLt's first pick at the largest row count first.
    pub candidates: Vec<Algo>,
    pub chosen: usize,
    /// [`GemmShape::cost`], for the reader.
    pub cost: Vec<f64>,
}

impl GemmShape {
    /// What pinning costs at each row count: the chosen one's time over the fastest candidate's.
    pub fn cost(&self) -> Vec<f64> {
        let c = &self.candidates[self.chosen];
        (0..self.rows.len())
            .map(|r| c.us[r] / best_at(&self.candidates, r))
            .collect()
    }
}

fn best_at(candidates: &[Algo], r: usize) -> f64 {
    candidates
        .iter()
        .map(|c| c.us[r])
        .fold(f64::INFINITY, f64::min)
}

/// The rule: among the row-invariant candidates, the smallest sum over the row counts of the
/// time over the fastest candidate's time there; the first invariant candidate (cuBLASLt's
/// first pick) unless another's sum is [`tune::MARGIN`] smaller. None when no candidate is
/// row-invariant.
pub fn choose(candidates: &[Algo]) -> Option<usize> {
    let rows = candidates.first()?.us.len();
    let score = |c: &Algo| -> f64 { (0..rows).map(|r| c.us[r] / best_at(candidates, r)).sum() };
    let first = candidates.iter().position(|c| c.invariant)?;
    let best = (0..candidates.len())
        .filter(|&i| candidates[i].invariant)
        .fold(first, |b, i| {
            if score(&candidates[i]) < score(&candidates[b]) {
                i
            } else {
                b
            }
        });
    Some(
        if score(&candidates[best]) < (1.0 - tune::MARGIN) * score(&candidates[first]) {
            best
        } else {
            first
        },
    )
}

/// The choices for every GEMM shape of the loaded model.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GemmTuning {
    pub shapes: Vec<GemmShape>,
    pub cache: Option<String>,
    pub from_cache: bool,
    /// Seconds this load spent on it (checks, timing and cache).
    pub tune_s: f64,
}

impl GemmTuning {
    fn algo(&self, out: usize, inp: usize) -> Option<sys::cublasLtMatmulAlgo_t> {
        self.shapes
            .iter()
            .find(|s| s.out == out && s.inp == inp)
            .map(|s| sys::cublasLtMatmulAlgo_t {
                data: s.candidates[s.chosen].data,
            })
    }
}

fn lt_err(what: &'static str) -> impl Fn(sys::cublasStatus_t) -> Error {
    move |s| Error::Internal {
        message: format!("cuBLASLt {what} failed: {s:?}"),
    }
}

fn ok(s: sys::cublasStatus_t, what: &'static str) -> Result<()> {
    match s {
        sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        s => Err(lt_err(what)(s)),
    }
}

/// The three layouts of one GEMM (column-major, as cuBLASLt reads them): the weight as A
/// ([in, out], transposed by the op), the input rows as B ([in, rows]), the f32 output as C
/// and D ([out, rows]).
struct Layouts([sys::cublasLtMatrixLayout_t; 3]);

impl Layouts {
    fn new(out: usize, inp: usize, rows: usize) -> Result<Self> {
        let make = |ty, r: usize, c: usize| -> Result<sys::cublasLtMatrixLayout_t> {
            let mut l = MaybeUninit::uninit();
            // SAFETY: writes one layout handle, destroyed in Drop.
            ok(
                unsafe {
                    sys::cublasLtMatrixLayoutCreate(
                        l.as_mut_ptr(),
                        ty,
                        r as u64,
                        c as u64,
                        r as i64,
                    )
                },
                "layout create",
            )?;
            Ok(unsafe { l.assume_init() })
        };
        let bf16 = sys::cudaDataType::CUDA_R_16BF;
        let a = make(bf16, inp, out)?;
        let b = make(bf16, inp, rows).inspect_err(|_| unsafe {
            sys::cublasLtMatrixLayoutDestroy(a);
        })?;
        let c = make(sys::cudaDataType::CUDA_R_32F, out, rows).inspect_err(|_| unsafe {
            sys::cublasLtMatrixLayoutDestroy(a);
            sys::cublasLtMatrixLayoutDestroy(b);
        })?;
        Ok(Self([a, b, c]))
    }
}

impl Drop for Layouts {
    fn drop(&mut self) {
        for l in self.0 {
            // SAFETY: created in `new`, destroyed once.
            unsafe { sys::cublasLtMatrixLayoutDestroy(l) };
        }
    }
}

/// The cuBLASLt handle and the one operation every GEMM here is: Y^T [out, rows] (+)=
/// W^T X^T, bf16 in, f32 accumulate and out.
pub(super) struct Lt {
    handle: sys::cublasLtHandle_t,
    desc: sys::cublasLtMatmulDesc_t,
    pub version: usize,
}

// SAFETY: the handle and descriptor are used by one thread at a time (the backend's owner), as
// cudarc's own cuBLAS handle is.
unsafe impl Send for Lt {}
unsafe impl Sync for Lt {}

impl Lt {
    /// Whether libcublasLt can be loaded (checked before anything uses it).
    pub fn present() -> bool {
        // SAFETY: only tries to dlopen the library.
        unsafe { sys::is_culib_present() }
    }

    pub fn new() -> Result<Self> {
        let load = |s| Error::Load {
            message: format!("cuBLASLt (libcublasLt.so.13) could not start: {s:?}"),
        };
        let mut handle = MaybeUninit::uninit();
        // SAFETY: writes one handle, destroyed in Drop.
        let handle = match unsafe { sys::cublasLtCreate(handle.as_mut_ptr()) } {
            sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => unsafe { handle.assume_init() },
            s => return Err(load(s)),
        };
        let mut desc = MaybeUninit::uninit();
        // SAFETY: as above.
        let s = unsafe {
            sys::cublasLtMatmulDescCreate(
                desc.as_mut_ptr(),
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType::CUDA_R_32F,
            )
        };
        if s != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            unsafe { sys::cublasLtDestroy(handle) };
            return Err(load(s));
        }
        let lt = Self {
            handle,
            desc: unsafe { desc.assume_init() },
            // SAFETY: a plain query.
            version: unsafe { sys::cublasLtGetVersion() },
        };
        let transpose: i32 = 1; // CUBLAS_OP_T: the weight is stored [out, in]
                                // SAFETY: the descriptor is live; the attribute is one int.
        ok(
            unsafe {
                sys::cublasLtMatmulDescSetAttribute(
                    lt.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                    &transpose as *const i32 as *const c_void,
                    4,
                )
            },
            "descriptor",
        )?;
        Ok(lt)
    }

    /// cuBLASLt's picks for the shape at `rows`, best first, split-K forced off (duplicates
    /// dropped by the caller).
    fn picks(&self, out: usize, inp: usize, rows: usize, workspace: usize) -> Result<Vec<Algo>> {
        let l = Layouts::new(out, inp, rows)?;
        let mut pref = MaybeUninit::uninit();
        // SAFETY: writes one preference handle, destroyed below.
        ok(
            unsafe { sys::cublasLtMatmulPreferenceCreate(pref.as_mut_ptr()) },
            "preference",
        )?;
        let pref = unsafe { pref.assume_init() };
        let ws = workspace as u64;
        // SAFETY: live handles; results has room for PICKS entries (a zeroed result is valid:
        // status 0 is SUCCESS).
        let found = unsafe {
            let set = sys::cublasLtMatmulPreferenceSetAttribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            );
            let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> =
                (0..PICKS).map(|_| std::mem::zeroed()).collect();
            let mut n = 0;
            let got = sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                self.desc,
                l.0[0],
                l.0[1],
                l.0[2],
                l.0[2],
                pref,
                PICKS,
                results.as_mut_ptr(),
                &mut n,
            );
            sys::cublasLtMatmulPreferenceDestroy(pref);
            ok(set, "preference")?;
            ok(got, "heuristic")?;
            results.truncate(n.max(0) as usize);
            results
        };
        let mut out_algos = Vec::new();
        for r in found
            .iter()
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        {
            let mut algo = r.algo;
            let (one, none) = (1u32, 0u32);
            // SAFETY: a live algorithm struct; each attribute is one u32.
            unsafe {
                use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
                for (attr, v) in [
                    (A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one),
                    (A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none),
                ] {
                    ok(
                        sys::cublasLtMatmulAlgoConfigSetAttribute(
                            &mut algo,
                            attr,
                            v as *const u32 as *const c_void,
                            4,
                        ),
                        "algorithm config",
                    )?;
                }
            }
            let get = |attr| -> u32 {
                let (mut v, mut written) = (0u32, 0usize);
                // SAFETY: as above; reads one u32.
                unsafe {
                    sys::cublasLtMatmulAlgoConfigGetAttribute(
                        &algo,
                        attr,
                        &mut v as *mut u32 as *mut c_void,
                        4,
                        &mut written,
                    )
                };
                v
            };
            use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
            out_algos.push(Algo {
                data: algo.data,
                id: get(A::CUBLASLT_ALGO_CONFIG_ID),
                tile: get(A::CUBLASLT_ALGO_CONFIG_TILE_ID),
                stages: get(A::CUBLASLT_ALGO_CONFIG_STAGES_ID),
                cluster: get(A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                swizzle: get(A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                custom: get(A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                invariant: false,
                us: Vec::new(),
            });
        }
        Ok(out_algos)
    }

    /// Whether `algo` runs the shape at `rows` within `workspace` bytes.
    fn supports(
        &self,
        algo: &[u64; 8],
        out: usize,
        inp: usize,
        rows: usize,
        workspace: usize,
    ) -> bool {
        let Ok(l) = Layouts::new(out, inp, rows) else {
            return false;
        };
        let algo = sys::cublasLtMatmulAlgo_t { data: *algo };
        // SAFETY: live handles; writes one result.
        let mut result: sys::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        let s = unsafe {
            sys::cublasLtMatmulAlgoCheck(
                self.handle,
                self.desc,
                l.0[0],
                l.0[1],
                l.0[2],
                l.0[2],
                &algo,
                &mut result,
            )
        };
        s == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && result.workspaceSize <= workspace
    }

    /// y [rows, out] (+)= x [rows, inp] W^T through `algo`, on `stream`.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        algo: &sys::cublasLtMatmulAlgo_t,
        w: (u64, usize, usize),
        x: u64,
        y: u64,
        rows: usize,
        accumulate: bool,
        workspace: &DevBuf,
        stream: sys::cudaStream_t,
    ) -> Result<()> {
        let (w_ptr, out, inp) = w;
        let l = Layouts::new(out, inp, rows)?;
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        // SAFETY: the pointers are live device buffers sized for these shapes; the layouts
        // describe them; the workspace outlives the GEMM (and any graph that captured it).
        let s = unsafe {
            sys::cublasLtMatmul(
                self.handle,
                self.desc,
                &alpha as *const f32 as *const c_void,
                w_ptr as *const c_void,
                l.0[0],
                x as *const c_void,
                l.0[1],
                &beta as *const f32 as *const c_void,
                y as *const c_void,
                l.0[2],
                y as *mut c_void,
                l.0[2],
                algo,
                workspace.ptr as *mut c_void,
                workspace.bytes,
                stream,
            )
        };
        match s {
            sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
            s => Err(Error::Internal {
                message: format!("cuBLASLt GEMM ({rows}x{inp} by {out}x{inp}) failed: {s:?}"),
            }),
        }
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            sys::cublasLtMatmulDescDestroy(self.desc);
            sys::cublasLtDestroy(self.handle);
        }
    }
}

/// Deterministic values in [-1, 1) as bf16, for the checks and the timing.
fn random_bf16(n: usize) -> Vec<u16> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            half::bf16::from_f32(2.0 * u - 1.0).to_bits()
        })
        .collect()
}

/// Rows checked against GEMMs of their own, beside rows 0-7: 8 rows starting half-way down
/// (a multiple of 128, so the input's address keeps cuBLASLt's 256-byte alignment).
fn offset_rows(max: usize) -> Option<usize> {
    let o = max / 2 / 128 * 128;
    (o > 0 && o + 8 <= max).then_some(o)
}

impl CudaBackend {
    /// y [rows, out] (+)= x [rows, in] W[out, in]^T on the tensor cores: bf16 in, f32 out, through
    /// the shape's pinned algorithm.
    pub(super) fn gemm(
        &self,
        w: &Matrix,
        x: u64,
        y: u64,
        rows: usize,
        accumulate: bool,
    ) -> Result<()> {
        let algo = self
            .gemms
            .algo(w.rows, w.cols)
            .ok_or_else(|| Error::Internal {
                message: format!("GEMM of a {}x{} weight before its tuning", w.rows, w.cols),
            })?;
        self.lt.matmul(
            &algo,
            (w.buf.ptr, w.rows, w.cols),
            x,
            y,
            rows,
            accumulate,
            &self.gemm_workspace,
            self.stream.cu_stream() as sys::cudaStream_t,
        )
    }

    /// Every distinct GEMM weight shape of the model, one matrix of it, and its row counts.
    fn gemm_shapes(&self) -> Vec<(&Matrix, &'static [usize])> {
        let mut all: Vec<(&Matrix, &'static [usize])> = Vec::new();
        for l in &self.layers {
            let (a, b) = match &l.mixer {
                Mixer::Attention(a) => (&a.qkv, &a.o),
                Mixer::Mlp(m) => (&m.up, &m.down),
                Mixer::Mamba(m) => (&m.in_proj, &m.out_proj),
            };
            all.push((a, &LAYER_ROWS));
            all.push((b, &LAYER_ROWS));
        }
        if self.max_batch > 1 {
            all.push((self.lm_head(), &LM_HEAD_ROWS));
        }
        let mut shapes: Vec<(&Matrix, &'static [usize])> = Vec::new();
        for (m, rows) in all {
            if !shapes
                .iter()
                .any(|(s, _)| (s.rows, s.cols) == (m.rows, m.cols))
            {
                shapes.push((m, rows));
            }
        }
        shapes
    }

    /// Checks and times cuBLASLt's candidates for one shape.
    fn tune_gemm(&self, w: &Matrix, rows: &[usize], key: &str) -> Result<GemmShape> {
        let (out, inp) = (w.rows, w.cols);
        let max = *rows.iter().max().expect("rows are listed");
        let ws = self.gemm_workspace.bytes;
        let mut candidates: Vec<Algo> = Vec::new();
        for at in [max, 32.min(max)] {
            for a in self.lt.picks(out, inp, at, ws)? {
                if !candidates.iter().any(|c| c.data == a.data)
                    && std::iter::once(1)
                        .chain(rows.iter().copied())
                        .all(|r| self.lt.supports(&a.data, out, inp, r, ws))
                {
                    candidates.push(a);
                }
            }
        }
        if candidates.is_empty() {
            return Err(Error::Load {
                message: format!(
                    "cuBLASLt (version {}) offers no algorithm for a {out}x{inp} bf16 GEMM \
                     without split-K; the engine needs one",
                    self.lt.version
                ),
            });
        }
        let x = DevBuf::zeroed(max * inp * BF16)?;
        x.write(0, &random_bf16(max * inp))?;
        let y = DevBuf::zeroed(max * out * F32)?;
        let y_small = DevBuf::zeroed(8 * out * F32)?;
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        let run = |a: &sys::cublasLtMatmulAlgo_t, x: u64, y: u64, r: usize| {
            self.lt.matmul(
                a,
                (w.buf.ptr, out, inp),
                x,
                y,
                r,
                false,
                &self.gemm_workspace,
                stream,
            )
        };
        let read = |buf: &DevBuf, row: usize, n: usize| -> Result<Vec<u32>> {
            let mut v = vec![0f32; n * out];
            buf.read_at(row * out, &mut v, &self.stream)?;
            Ok(v.into_iter().map(f32::to_bits).collect())
        };
        for c in &mut candidates {
            let a = sys::cublasLtMatmulAlgo_t { data: c.data };
            run(&a, x.ptr, y.ptr, max)?;
            let mut same = true;
            let n = 8.min(max);
            for (from, count) in [(0, n), (0, 1)]
                .into_iter()
                .chain(offset_rows(max).map(|o| (o, 8)))
            {
                run(&a, x.at(from * inp, BF16), y_small.ptr, count)?;
                same &= read(&y, from, count)? == read(&y_small, 0, count)?;
            }
            c.invariant = same;
            c.us = rows
                .iter()
                .map(|&r| {
                    self.time_runs(1, 5, || run(&a, x.ptr, y.ptr, r))
                        .map(|ms| ms * 1e3)
                })
                .collect::<Result<_>>()?;
        }
        let mut shape = GemmShape {
            key: key.to_string(),
            out,
            inp,
            rows: rows.to_vec(),
            chosen: choose(&candidates).unwrap_or(0),
            candidates,
            cost: Vec::new(),
        };
        shape.cost = shape.cost();
        Ok(shape)
    }

    /// Pins (or reads from the cache) one algorithm per GEMM shape; every GEMM after this uses
    /// it. A shape with no row-invariant candidate runs cuBLASLt's first pick and says so in
    /// `degraded`.
    pub(super) fn tune_gemms(&mut self) -> Result<()> {
        let started = Instant::now();
        let path = tune::cache_file(
            "gemm-algos",
            &self.kernels.cache_key,
            &self.device_name,
            self.sms,
        );
        let mut cached: Vec<GemmShape> = path.as_ref().map(tune::read_cache).unwrap_or_default();
        let key = format!("cublasLt{}", self.lt.version);
        let (mut shapes, mut timed) = (Vec::new(), false);
        for (w, rows) in self.gemm_shapes() {
            let hit = cached.iter().find(|c| {
                c.key == key
                    && (c.out, c.inp) == (w.rows, w.cols)
                    && c.rows == rows
                    && c.chosen < c.candidates.len()
                    // The stored algorithm is cuBLASLt's own bytes: it must still check out.
                    && std::iter::once(1).chain(rows.iter().copied()).all(|r| {
                        let a = &c.candidates[c.chosen].data;
                        self.lt.supports(a, w.rows, w.cols, r, self.gemm_workspace.bytes)
                    })
            });
            let s = match hit {
                Some(s) => s.clone(),
                None => {
                    timed = true;
                    self.tune_gemm(w, rows, &key)?
                }
            };
            shapes.push(s);
        }
        if timed {
            if let Some(p) = &path {
                cached.retain(|c| {
                    !shapes
                        .iter()
                        .any(|s| s.key == c.key && (s.out, s.inp) == (c.out, c.inp))
                });
                cached.extend(shapes.iter().cloned());
                tune::write_cache(p, &cached);
            }
        }
        for s in &shapes {
            if !s.candidates[s.chosen].invariant {
                self.degraded.push(format!(
                    "gemm_rows_vary: no cuBLASLt algorithm for the {}x{} GEMM gave a row the \
                     same bits at every row count checked; its rows may depend on their \
                     neighbours",
                    s.out, s.inp
                ));
            }
        }
        self.gemms = GemmTuning {
            shapes,
            cache: path.map(|p| p.display().to_string()),
            from_cache: !timed,
            tune_s: started.elapsed().as_secs_f64(),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn algo(invariant: bool, us: &[f64]) -> Algo {
        Algo {
            data: [0; 8],
            id: 0,
            tile: 0,
            stages: 0,
            cluster: 0,
            swizzle: 0,
            custom: 0,
            invariant,
            us: us.to_vec(),
        }
    }

    #[test]
    fn the_first_pick_stays_unless_another_wins_by_the_margin() {
        // Second is 1% better in sum: a draw, the first stays.
        let c = [algo(true, &[10.0, 100.0]), algo(true, &[9.9, 99.0])];
        assert_eq!(choose(&c), Some(0));
        // Second is much faster at the small rows, a little slower at the large.
        let c = [algo(true, &[20.0, 100.0]), algo(true, &[10.0, 102.0])];
        assert_eq!(choose(&c), Some(1));
    }

    #[test]
    fn a_candidate_whose_rows_vary_is_never_chosen() {
        let c = [algo(false, &[5.0, 50.0]), algo(true, &[10.0, 100.0])];
        assert_eq!(choose(&c), Some(1));
        assert_eq!(choose(&[algo(false, &[1.0])]), None);
        assert_eq!(choose(&[]), None);
    }

    #[test]
    fn cost_is_the_chosen_time_over_the_fastest() {
        let s = GemmShape {
            key: "k".into(),
            out: 8,
            inp: 8,
            rows: vec![8, 1024],
            candidates: vec![algo(true, &[20.0, 100.0]), algo(false, &[10.0, 110.0])],
            chosen: 0,
            cost: Vec::new(),
        };
        assert_eq!(s.cost(), vec![2.0, 1.0]);
    }

    #[test]
    fn offset_rows_keep_the_alignment_and_stay_inside() {
        assert_eq!(offset_rows(1024), Some(512));
        assert_eq!(offset_rows(256), Some(128));
        assert_eq!(offset_rows(32), None);
        assert_eq!(offset_rows(8), None);
    }
}
