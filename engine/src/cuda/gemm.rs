//! The GEMMs (prefill, and the decode step on cuBLAS) through cuBLASLt, with algorithms pinned
//! per weight shape and [`Pass`] at load, so that a row's result does not depend on how many
//! rows share its GEMM. cuBLAS's own heuristic chooses its kernel by the number of rows, which
//! would make a prompt's bits depend on the prompts prefilled beside it and a decode row's on the
//! batch; with one kernel, and K split (if at all) into a fixed number of parts summed in a fixed
//! order, a row's sum over K runs in one order whatever the row count.
//!
//! The decode step pins one algorithm per shape, so a row has the same bits at every batch the
//! step runs on cuBLAS. Prefill pins one per class of prompt length ([`Pin`]): no one kernel is
//! fast at 16 rows and at 1,024 (session 12, H200: those fast at 1,024 rows use tiles that 16
//! rows leave mostly idle, 1.3-2x slower there; one chosen for all row counts cost 7-16% on the
//! first token at 512), so each timed row count gets the candidate fastest there, unless the
//! class below runs within [`tune::MARGIN`] of it (then that class reaches this far). A pass
//! holds its prompts shortest first (plan.rs), so each class present is one range of rows and one
//! GEMM; which algorithm a prompt's rows run depends on its own length only, so its bits are
//! those of its prefill alone.
//!
//! Candidates that give the same bits are *twins* ([`Algo::bits`]): each sums an output over K in
//! the same order, whatever its tile. A GEMM may run any twin of its pin, so each runs the twin
//! fastest at its row count, and neighbouring classes whose pins are twins share one GEMM. On
//! the H200 (cuBLASLt 13) every split-free candidate of a prefill shape is a twin of every other,
//! so a pass is one GEMM per weight however its prompts' lengths mix (session 20, docs/ENGINE.md);
//! the step's candidates fall into three or four families.
//!
//! The candidates for a shape are cuBLASLt's heuristic picks at each of the pass's row counts
//! ([`Pass::rows`]; pointers 16-byte aligned, as a range starting at any row is), as cuBLASLt
//! gives them and with split-K forced off; each is checked at load, not assumed: rows 0-7 of a
//! GEMM over the largest row count, and 8 rows from just past half-way down, must have the bits
//! of GEMMs over those 8 rows alone, and row 0 those of a GEMM of one row (random inputs, the
//! model's own weights); the rows read, and the last 8, are its print, and equal prints make
//! twins. A candidate that fails is kept in the report, never chosen. Each is timed at each row
//! count, and twice more there if its first timing is within [`RETIME`] of the fastest invariant
//! one's (each keeps its best, so a stray slow timing does not decide; one far behind costs the
//! load no more time). A timing averages up to five runs, fewer where the GEMM is expected (from
//! its time at the row count before) to take milliseconds ([`runs_for`]); a candidate's row
//! counts are timed smallest first, warmed up once, and the GEMM over the largest, timed last,
//! is the one its check and print read.
//! What pinning costs, per row count, is in `ready.features.gemm_tuning`. Cached beside the GEMV
//! tuning (tune.rs), keyed by cuBLASLt's version, the shape, the pass and its rows; the opaque
//! algorithm is stored as cuBLASLt gives it (it may be reused with the same cuBLASLt version).
//! The file is named by the GPU and driver, not by these kernels' source as the GEMV tuning's is:
//! builds that differ only in their kernels run the same GEMMs on one machine, so an A/B between
//! them does not also compare two tunings (whose near-tied twins differ from one timing to the
//! next: 111 against 116 ms of one batch-8 prefill, session 26).

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublaslt::sys;
use cudarc::driver::{CudaContext, CudaStream};
use serde::{Deserialize, Serialize};

use super::backend::{CudaBackend, BF16, F32};
use super::device::DevBuf;
use super::load::{Matrix, Mixer, Sublayer};
use super::plan::{self, PREFILL_CHUNK};
use super::tune;
use crate::error::{Error, Result};

/// Where a GEMM runs; each pass pins its own algorithm per shape.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// The decode step on cuBLAS: up to [`plan::MAX_BATCH`] rows (the lm_head's GEMM runs here
    /// only: a prompt's last row takes the GEMV).
    Step,
    /// A prefill pass: up to [`PREFILL_CHUNK`] rows.
    Prefill,
}

impl Pass {
    /// The row counts its GEMMs are timed at: for the step a batch the GEMVs could run, one
    /// between and the largest; for prefill prompt lengths from short to a full pass (the
    /// bounds of its classes).
    pub fn rows(self) -> &'static [usize] {
        match self {
            Pass::Step => &[8, 16, plan::MAX_BATCH],
            Pass::Prefill => &[16, 64, 128, 256, 512, 1024, PREFILL_CHUNK],
        }
    }
}

/// The rows a GEMM runs over.
#[derive(Debug, Clone, Copy)]
pub(super) enum Rows<'a> {
    /// A decode step's batch.
    Step(usize),
    /// A prefill pass: each segment's prompt length and its rows in the pass, shortest prompt
    /// first (plan.rs `prefill_passes`).
    Prefill(&'a [(usize, usize)]),
}

/// What a GEMM writes: f32, or bf16 where its output is read only as the input of an
/// element-wise kernel (the MLP's up GEMM, before SwiGLU or relu2), as vLLM's GEMMs write it:
/// half the bytes written, and read again, of the largest output of a layer.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Out {
    #[default]
    F32,
    Bf16,
}

impl Out {
    /// Bytes of one output value.
    pub fn size(self) -> usize {
        match self {
            Out::F32 => F32,
            Out::Bf16 => BF16,
        }
    }

    fn cuda_type(self) -> sys::cudaDataType {
        match self {
            Out::F32 => sys::cudaDataType::CUDA_R_32F,
            Out::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        }
    }
}

/// Heuristic picks asked for at each row count.
const PICKS: i32 = 8;

/// One candidate algorithm for a shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Algo {
    /// cuBLASLt's opaque description (`cublasLtMatmulAlgo_t`).
    pub data: [u64; 8],
    /// What it says of itself (`CUBLASLT_ALGO_CONFIG_*`), for the reader.
    pub id: u32,
    pub tile: u32,
    pub stages: u32,
    pub cluster: u32,
    pub swizzle: u32,
    pub custom: u32,
    /// Parts K is split into (1: not split) and how they are summed
    /// (`CUBLASLT_REDUCTION_SCHEME_*`).
    pub split_k: u32,
    pub reduction: u32,
    /// Whether a row's bits were the same at every row count checked.
    pub invariant: bool,
    /// The first candidate whose GEMM over the largest row count gave the same bits as this
    /// one's in every row read: candidates with equal `bits` sum each output in one order, so
    /// one may run in place of another without a row's bits telling.
    pub bits: usize,
    /// Microseconds per GEMM at each of the shape's `rows`.
    pub us: Vec<f64>,
}

/// One weight shape's candidates and the ones pinned.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GemmShape {
    /// cuBLASLt's version: what the algorithms depend on besides the GPU (the cache file's name).
    pub key: String,
    /// The weight: `out` x `inp` (torch's [out, in]).
    pub out: usize,
    pub inp: usize,
    /// What it writes (absent in caches older than bf16 outputs: f32).
    #[serde(default)]
    pub written: Out,
    pub pass: Pass,
    pub rows: Vec<usize>,
    /// In the order cuBLASLt offered them: its picks at the smallest row count first.
    pub candidates: Vec<Algo>,
    /// The classes, shortest prompts first: the step has one, for every batch.
    pub pins: Vec<Pin>,
    /// [`GemmShape::cost`], for the reader.
    pub cost: Vec<f64>,
    /// Seconds the checks and timing took (0 when it came from the cache).
    #[serde(default)]
    pub tune_s: f64,
}

/// A class of prompts and the candidate their rows run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Pin {
    /// Prompts of at most this many tokens and more than the class before's (the last class
    /// also takes the longer ones).
    pub up_to: usize,
    /// Its index in the candidates.
    pub algo: usize,
}

impl GemmShape {
    /// Whether this is the tuning of a GEMM of `dims` in `pass`, timed at `rows` with the
    /// cuBLASLt of `key`: a cached entry another build or cuBLASLt made, or one of another
    /// output type (an entry older than bf16 outputs reads as f32), is not.
    fn tunes(&self, key: &str, dims: Dims, pass: Pass, rows: &[usize]) -> bool {
        self.key == key && (self.dims(), self.pass) == (dims, pass) && self.rows == rows
    }

    /// The GEMM it tunes, as [`Matrix::dims`] gives it.
    fn dims(&self) -> Dims {
        (self.out, self.inp, self.written)
    }

    /// The class a prompt of `len` tokens (a batch of `len`, in the step) is in.
    fn class(&self, len: usize) -> usize {
        self.pins
            .iter()
            .position(|p| len <= p.up_to)
            .unwrap_or(self.pins.len() - 1)
    }

    fn pinned(&self, len: usize) -> usize {
        self.pins[self.class(len)].algo
    }

    /// The candidate a GEMM of `rows` rows runs for `algo`: the fastest of its twins at the first
    /// timed row count that covers `rows` (the largest where none does); `algo` on a tie.
    fn runner(&self, algo: usize, rows: usize) -> usize {
        let r = self
            .rows
            .iter()
            .position(|&n| rows <= n)
            .unwrap_or(self.rows.len() - 1);
        fastest_twin(&self.candidates, algo, r)
    }

    /// A prefill pass's GEMMs: (candidate, first row, rows) over the `pieces` (prompt length,
    /// rows), which come shortest prompt first, so a class's rows are one range; neighbouring
    /// classes whose pins are twins share one GEMM, which runs the twin fastest at its rows.
    fn ranges<'a>(
        &'a self,
        pieces: &'a [(usize, usize)],
    ) -> impl Iterator<Item = (usize, usize, usize)> + 'a {
        let (mut from, mut i) = (0, 0);
        std::iter::from_fn(move || {
            while i < pieces.len() {
                let lead = self.pinned(pieces[i].0);
                let start = from;
                while i < pieces.len() && twins(&self.candidates, self.pinned(pieces[i].0), lead) {
                    from += pieces[i].1;
                    i += 1;
                }
                if from > start {
                    return Some((self.runner(lead, from - start), start, from - start));
                }
            }
            None
        })
    }

    /// The candidates that may run: the pins and their twins.
    fn in_use(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.candidates.len())
            .filter(|&i| self.pins.iter().any(|p| twins(&self.candidates, i, p.algo)))
    }

    /// What pinning costs at each row count: the time of the candidate those rows run (as one
    /// prompt) over the fastest candidate's.
    pub fn cost(&self) -> Vec<f64> {
        self.rows
            .iter()
            .enumerate()
            .map(|(r, &rows)| {
                self.candidates[self.runner(self.pinned(rows), rows)].us[r]
                    / best_at(&self.candidates, r)
            })
            .collect()
    }
}

/// Whether candidate `a` may run in place of `b`: the same one, or both row-invariant and giving
/// the same bits.
fn twins(candidates: &[Algo], a: usize, b: usize) -> bool {
    let (ca, cb) = (&candidates[a], &candidates[b]);
    a == b || (ca.invariant && cb.invariant && ca.bits == cb.bits)
}

/// The twin of `c` fastest at row count `r` (which runs in its place there); `c` on a tie.
fn fastest_twin(candidates: &[Algo], c: usize, r: usize) -> usize {
    (0..candidates.len())
        .filter(|&i| twins(candidates, i, c))
        .fold(c, |b, i| {
            if candidates[i].us[r] < candidates[b].us[r] {
                i
            } else {
                b
            }
        })
}

/// The time at row count `r` of the fastest twin of `c`.
fn twin_best(candidates: &[Algo], c: usize, r: usize) -> f64 {
    candidates[fastest_twin(candidates, c, r)].us[r]
}

fn best_at(candidates: &[Algo], r: usize) -> f64 {
    candidates
        .iter()
        .map(|c| c.us[r])
        .fold(f64::INFINITY, f64::min)
}

/// The rule: among the row-invariant candidates, the smallest sum over the row counts of the
/// time (its fastest twin's) over the fastest candidate's time there; the first invariant
/// candidate unless another's sum is [`tune::MARGIN`] smaller. None when no candidate is
/// row-invariant.
pub fn choose(candidates: &[Algo]) -> Option<usize> {
    let rows = candidates.first()?.us.len();
    let score = |c: usize| -> f64 {
        (0..rows)
            .map(|r| twin_best(candidates, c, r) / best_at(candidates, r))
            .sum()
    };
    let first = candidates.iter().position(|c| c.invariant)?;
    let best = (0..candidates.len())
        .filter(|&i| candidates[i].invariant)
        .fold(first, |b, i| if score(i) < score(b) { i } else { b });
    Some(if score(best) < (1.0 - tune::MARGIN) * score(first) {
        best
    } else {
        first
    })
}

/// The step's pin: one candidate by [`choose`] over every row count, for every batch.
pub fn pin_step(candidates: &[Algo], rows: &[usize]) -> Option<Vec<Pin>> {
    let algo = choose(candidates)?;
    Some(vec![Pin {
        up_to: *rows.last()?,
        algo,
    }])
}

/// Prefill's pins: from the smallest row count up, the class so far reaches a row count where
/// its candidate or a twin of it runs within [`tune::MARGIN`] of the fastest invariant one
/// there; elsewhere a new class starts with that fastest one. None when no candidate is
/// row-invariant.
pub fn pin_prefill(candidates: &[Algo], rows: &[usize]) -> Option<Vec<Pin>> {
    let fastest = |r: usize| {
        (0..candidates.len())
            .filter(|&i| candidates[i].invariant)
            .min_by(|&a, &b| candidates[a].us[r].total_cmp(&candidates[b].us[r]))
    };
    let mut pins: Vec<Pin> = Vec::new();
    for (r, &up_to) in rows.iter().enumerate() {
        let best = fastest(r)?;
        match pins.last_mut() {
            Some(p)
                if twin_best(candidates, p.algo, r)
                    <= (1.0 + tune::MARGIN) * candidates[best].us[r] =>
            {
                p.up_to = up_to
            }
            _ => pins.push(Pin { up_to, algo: best }),
        }
    }
    Some(pins)
}

/// How far behind the fastest first timing at a row count a candidate may be and still be
/// timed twice more there: far past any noise seen between timings, and past [`tune::MARGIN`].
const RETIME: f64 = 0.15;

/// Runs a timing averages at most, and the GPU time it aims for: a GEMM expected to take as long
/// as [`TIMED_US`] (a prefill shape at a thousand rows or more) is timed once after its warm-up,
/// where five runs of it cost the load seconds and steady nothing a millisecond's run has not.
const RUNS: usize = 5;
const TIMED_US: f64 = 2000.0;

/// Runs for a timing whose GEMM is expected to take `expected_us` (none known: [`RUNS`]).
fn runs_for(expected_us: Option<f64>) -> usize {
    expected_us.map_or(RUNS, |us| {
        ((TIMED_US / us.max(1.0)).ceil() as usize).clamp(1, RUNS)
    })
}

/// The candidates whose first timing `us[i]` is within [`RETIME`] of the fastest that can be
/// chosen (an invariant one, where any is: pins never take the others).
fn contenders(us: &[f64], invariant: &[bool]) -> Vec<usize> {
    let any = invariant.contains(&true);
    let best = (0..us.len())
        .filter(|&i| invariant[i] || !any)
        .map(|i| us[i])
        .fold(f64::INFINITY, f64::min);
    (0..us.len())
        .filter(|&i| us[i] <= (1.0 + RETIME) * best)
        .collect()
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
    fn shape(&self, w: &Matrix, pass: Pass) -> Option<&GemmShape> {
        self.shapes
            .iter()
            .find(|s| (s.dims(), s.pass) == (w.dims(), pass))
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
/// ([in, out], transposed by the op), the input rows as B ([in, rows]), the output as C and D
/// ([out, rows], f32 or bf16).
struct Layouts([sys::cublasLtMatrixLayout_t; 3]);

/// A GEMM's shape as cuBLASLt is asked for it: the weight's `out` x `inp` and what it writes.
pub(super) type Dims = (usize, usize, Out);

impl Layouts {
    fn new((out, inp, written): Dims, rows: usize) -> Result<Self> {
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
        let c = make(written.cuda_type(), out, rows).inspect_err(|_| unsafe {
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
/// W^T X^T, bf16 in, f32 accumulate, f32 or bf16 out ([`Out`]).
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

    /// cuBLASLt's picks for the shape at `rows`, best first, each as given and (where it splits
    /// K) again with split-K off; duplicates are dropped by the caller.
    fn picks(&self, dims: Dims, rows: usize, workspace: usize) -> Result<Vec<Algo>> {
        let l = Layouts::new(dims, rows)?;
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
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            let mut set = sys::cublasLtMatmulPreferenceSetAttribute(
                pref,
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            );
            // A prefill part may start at any row: only 16 bytes of alignment are promised.
            let align = 16u32;
            for attr in [
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
            ] {
                if set == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                    set = sys::cublasLtMatmulPreferenceSetAttribute(
                        pref,
                        attr,
                        &align as *const u32 as *const c_void,
                        4,
                    );
                }
            }
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
        use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
        let get = |algo: &sys::cublasLtMatmulAlgo_t, attr| -> u32 {
            let (mut v, mut written) = (0u32, 0usize);
            // SAFETY: a live algorithm struct; reads one u32.
            unsafe {
                sys::cublasLtMatmulAlgoConfigGetAttribute(
                    algo,
                    attr,
                    &mut v as *mut u32 as *mut c_void,
                    4,
                    &mut written,
                )
            };
            v
        };
        let describe = |algo: &sys::cublasLtMatmulAlgo_t| Algo {
            data: algo.data,
            id: get(algo, A::CUBLASLT_ALGO_CONFIG_ID),
            tile: get(algo, A::CUBLASLT_ALGO_CONFIG_TILE_ID),
            stages: get(algo, A::CUBLASLT_ALGO_CONFIG_STAGES_ID),
            cluster: get(algo, A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
            swizzle: get(algo, A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
            custom: get(algo, A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
            split_k: get(algo, A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
            reduction: get(algo, A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
            invariant: false,
            bits: 0,
            us: Vec::new(),
        };
        let mut out_algos = Vec::new();
        for r in found
            .iter()
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        {
            out_algos.push(describe(&r.algo));
            let mut whole = r.algo;
            let (one, none) = (1u32, 0u32);
            // SAFETY: a live algorithm struct; each attribute is one u32.
            unsafe {
                for (attr, v) in [
                    (A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one),
                    (A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none),
                ] {
                    ok(
                        sys::cublasLtMatmulAlgoConfigSetAttribute(
                            &mut whole,
                            attr,
                            v as *const u32 as *const c_void,
                            4,
                        ),
                        "algorithm config",
                    )?;
                }
            }
            out_algos.push(describe(&whole));
        }
        Ok(out_algos)
    }

    /// Whether `algo` runs the shape at `rows` within `workspace` bytes.
    fn supports(&self, algo: &[u64; 8], dims: Dims, rows: usize, workspace: usize) -> bool {
        let Ok(l) = Layouts::new(dims, rows) else {
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

    /// y [rows, out] (+)= x [rows, inp] W^T through `algo`, on `stream`; W at `w_ptr`.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        algo: &sys::cublasLtMatmulAlgo_t,
        w_ptr: u64,
        dims: Dims,
        x: u64,
        y: u64,
        rows: usize,
        accumulate: bool,
        workspace: &DevBuf,
        stream: sys::cudaStream_t,
    ) -> Result<()> {
        let (out, inp, _) = dims;
        let l = Layouts::new(dims, rows)?;
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

/// Rows checked against GEMMs of their own, beside rows 0-7: 8 rows starting just past half-way
/// down, at an odd row (as a prefill part may start).
fn offset_rows(max: usize) -> Option<usize> {
    let o = max / 2 + 1;
    (o + 8 <= max).then_some(o)
}

impl CudaBackend {
    /// y [rows, out] (+)= x [rows, in] W[out, in]^T on the tensor cores: bf16 in, the weight's
    /// [`Out`] out, through the algorithms pinned for the shape: in prefill, each class of prompt
    /// length's rows through its own.
    pub(super) fn gemm(
        &self,
        w: &Matrix,
        x: u64,
        y: u64,
        rows: Rows<'_>,
        accumulate: bool,
    ) -> Result<()> {
        let pass = match rows {
            Rows::Step(_) => Pass::Step,
            Rows::Prefill(_) => Pass::Prefill,
        };
        let shape = self.gemms.shape(w, pass).ok_or_else(|| Error::Internal {
            message: format!(
                "{pass:?} GEMM of a {}x{} weight before its tuning",
                w.rows, w.cols
            ),
        })?;
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        let run = |algo: usize, from: usize, count: usize| {
            self.lt.matmul(
                &sys::cublasLtMatmulAlgo_t {
                    data: shape.candidates[algo].data,
                },
                w.buf.ptr,
                w.dims(),
                x + (from * w.cols * BF16) as u64,
                y + (from * w.rows * w.out.size()) as u64,
                count,
                accumulate,
                &self.gemm_workspace,
                stream,
            )
        };
        match rows {
            Rows::Step(n) => run(shape.runner(shape.pinned(n), n), 0, n),
            Rows::Prefill(pieces) => shape
                .ranges(pieces)
                .try_for_each(|(algo, from, count)| run(algo, from, count)),
        }
    }
}

/// What timing cuBLASLt's GEMMs takes: the stream, the handle and its workspace, and none of the
/// engine's own kernels, so a load tunes the GEMMs while NVRTC compiles those (load.rs).
pub(super) struct GemmBench<'a> {
    pub ctx: &'a Arc<CudaContext>,
    pub stream: &'a Arc<CudaStream>,
    pub lt: &'a Lt,
    pub workspace: &'a DevBuf,
}

impl GemmBench<'_> {
    /// Checks and times cuBLASLt's candidates for one shape in one pass.
    /// `x` holds at least the pass's largest row count of rows of `w.cols` random bf16 values
    /// ([`random_bf16`]'s sequence, whose prefix is the same at any length).
    fn tune_gemm(&self, w: &Matrix, pass: Pass, key: &str, x: &DevBuf) -> Result<GemmShape> {
        let started = Instant::now();
        let (out, inp) = (w.rows, w.cols);
        let dims = w.dims();
        let rows = pass.rows();
        let max = *rows.last().expect("rows are listed");
        debug_assert!(rows.windows(2).all(|w| w[0] < w[1]), "rows ascend");
        let ws = self.workspace.bytes;
        let mut candidates: Vec<Algo> = Vec::new();
        for &at in rows {
            for a in self.lt.picks(dims, at, ws)? {
                if !candidates.iter().any(|c| c.data == a.data)
                    && std::iter::once(1)
                        .chain(rows.iter().copied())
                        .all(|r| self.lt.supports(&a.data, dims, r, ws))
                {
                    candidates.push(a);
                }
            }
        }
        if candidates.is_empty() {
            return Err(Error::Load {
                message: format!(
                    "cuBLASLt (version {}) offers no algorithm that runs a {out}x{inp} bf16 \
                     GEMM writing {:?} at every row count from 1 to {max}; the engine needs one",
                    self.lt.version, w.out
                ),
            });
        }
        let y = DevBuf::zeroed(max * out * w.out.size())?;
        let y_small = DevBuf::zeroed(8 * out * w.out.size())?;
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        let run = |a: &sys::cublasLtMatmulAlgo_t, x: u64, y: u64, r: usize| {
            self.lt
                .matmul(a, w.buf.ptr, dims, x, y, r, false, self.workspace, stream)
        };
        // Rows as their bits, whatever their width.
        let read = |buf: &DevBuf, row: usize, n: usize| -> Result<Vec<u32>> {
            Ok(match w.out {
                Out::F32 => {
                    let mut v = vec![0f32; n * out];
                    buf.read_at(row * out, &mut v, self.stream)?;
                    v.into_iter().map(f32::to_bits).collect()
                }
                Out::Bf16 => {
                    let mut v = vec![0u16; n * out];
                    buf.read_at(row * out, &mut v, self.stream)?;
                    v.into_iter().map(u32::from).collect()
                }
            })
        };
        let time = |c: &Algo, r: usize, warm: usize, expected_us: Option<f64>| -> Result<f64> {
            let a = sys::cublasLtMatmulAlgo_t { data: c.data };
            let runs = runs_for(expected_us);
            let ms = tune::time_runs(self.ctx, self.stream, warm, runs, || {
                run(&a, x.ptr, y.ptr, r)
            })?;
            Ok(ms * 1e3)
        };
        // Each candidate is timed at each row count, smallest first, warmed up before the first
        // only (each count's runs warm the next's); the last, over `max` rows, leaves its output
        // in `y`, whose rows read (the last 8 too, a partial tile where any is) are its print:
        // equal prints, twins.
        let mut prints: Vec<Vec<u32>> = Vec::new();
        for c in &mut candidates {
            let mut us: Vec<f64> = Vec::with_capacity(rows.len());
            for (k, &r) in rows.iter().enumerate() {
                // Its time at the row count before, scaled by the rows: what this one should take.
                let expected = k.checked_sub(1).map(|p| us[p] * r as f64 / rows[p] as f64);
                us.push(time(c, r, usize::from(k == 0), expected)?);
            }
            c.us = us;
            let a = sys::cublasLtMatmulAlgo_t { data: c.data };
            let mut same = true;
            let n = 8.min(max);
            let mut print = read(&y, max - n, n)?;
            for (from, count) in [(0, n), (0, 1)]
                .into_iter()
                .chain(offset_rows(max).map(|o| (o, 8)))
            {
                run(&a, x.at(from * inp, BF16), y_small.ptr, count)?;
                let whole = read(&y, from, count)?;
                same &= whole == read(&y_small, 0, count)?;
                print.extend(whole);
            }
            c.invariant = same;
            c.bits = prints
                .iter()
                .position(|p| *p == print)
                .unwrap_or(prints.len());
            prints.push(print);
        }
        // Two more timings for those a stray slow first one could have misplaced; one far
        // behind keeps its first.
        let invariant: Vec<bool> = candidates.iter().map(|c| c.invariant).collect();
        for (at, &r) in rows.iter().enumerate() {
            let us: Vec<f64> = candidates.iter().map(|c| c.us[at]).collect();
            for i in contenders(&us, &invariant) {
                for _ in 0..2 {
                    let t = time(&candidates[i], r, 1, Some(candidates[i].us[at]))?;
                    candidates[i].us[at] = candidates[i].us[at].min(t);
                }
            }
        }
        let pins = match pass {
            Pass::Step => pin_step(&candidates, rows),
            Pass::Prefill => pin_prefill(&candidates, rows),
        }
        .unwrap_or_else(|| {
            vec![Pin {
                up_to: max,
                algo: 0,
            }]
        });
        let mut shape = GemmShape {
            key: key.to_string(),
            out,
            inp,
            written: w.out,
            pass,
            rows: rows.to_vec(),
            pins,
            candidates,
            cost: Vec::new(),
            tune_s: 0.0,
        };
        shape.cost = shape.cost();
        shape.tune_s = started.elapsed().as_secs_f64();
        Ok(shape)
    }

    /// Pins (or reads from the cache) the algorithms of every GEMM shape and pass; every GEMM
    /// after this uses them. A shape with no row-invariant candidate runs cuBLASLt's first pick
    /// and says so in `degraded`.
    pub(super) fn tune_gemms(
        &self,
        weights: &[(&Matrix, Pass)],
        device_key: &str,
        device_name: &str,
        sms: usize,
    ) -> Result<(GemmTuning, Vec<String>)> {
        let started = Instant::now();
        let path = tune::cache_file("gemm-algos", device_key, device_name, sms);
        let mut cached: Vec<GemmShape> = path.as_ref().map(tune::read_cache).unwrap_or_default();
        let key = format!("cublasLt{}", self.lt.version);
        let (mut shapes, mut timed) = (Vec::new(), false);
        // One buffer of random inputs for every shape timed, made when the first needs it:
        // writing them took longer than timing a small shape.
        let largest = weights
            .iter()
            .map(|(w, pass)| pass.rows().iter().max().expect("rows are listed") * w.cols)
            .max()
            .unwrap_or(0);
        let mut inputs: Option<DevBuf> = None;
        for &(w, pass) in weights {
            let rows = pass.rows();
            let hit = cached.iter().find(|c| {
                c.tunes(&key, w.dims(), pass, rows)
                    && !c.pins.is_empty()
                    // The stored algorithms are cuBLASLt's own bytes: they must still check out.
                    && c.in_use().all(|i| {
                        i < c.candidates.len()
                            && std::iter::once(1).chain(rows.iter().copied()).all(|r| {
                                let a = &c.candidates[i].data;
                                self.lt.supports(a, w.dims(), r, self.workspace.bytes)
                            })
                    })
            });
            let s = match hit {
                Some(s) => GemmShape {
                    tune_s: 0.0,
                    ..s.clone()
                },
                None => {
                    timed = true;
                    if inputs.is_none() {
                        let x = DevBuf::zeroed(largest * BF16)?;
                        x.write(0, &random_bf16(largest))?;
                        inputs = Some(x);
                    }
                    let x = inputs.as_ref().expect("made above");
                    self.tune_gemm(w, pass, &key, x)?
                }
            };
            shapes.push(s);
        }
        if timed {
            if let Some(p) = &path {
                // Entries of other row counts stay: builds that time other rows share the file
                // (kernels::device_key) and would otherwise re-time at every load of either.
                cached.retain(|c| {
                    !shapes
                        .iter()
                        .any(|s| c.tunes(&s.key, s.dims(), s.pass, &s.rows))
                });
                cached.extend(shapes.iter().cloned());
                tune::write_cache(p, &cached);
            }
        }
        let mut degraded = Vec::new();
        for s in &shapes {
            if !s.in_use().all(|i| s.candidates[i].invariant) {
                degraded.push(format!(
                    "gemm_rows_vary: no cuBLASLt algorithm for the {}x{} GEMM ({:?} out) of the \
                     {:?} pass gave a row the same bits at every row count checked; its rows may \
                     depend on their neighbours",
                    s.out, s.inp, s.written, s.pass
                ));
            }
        }
        let tuning = GemmTuning {
            shapes,
            cache: path.map(|p| p.display().to_string()),
            from_cache: !timed,
            tune_s: started.elapsed().as_secs_f64(),
        };
        Ok((tuning, degraded))
    }
}

/// Every distinct GEMM weight shape (and output type) of the model in each pass it runs in, one
/// matrix of it.
pub(super) fn gemm_shapes<'a>(
    layers: &'a [Sublayer],
    lm_head: &'a Matrix,
    max_batch: usize,
) -> Vec<(&'a Matrix, Pass)> {
    let step = max_batch > 1;
    let mut all: Vec<(&Matrix, Pass)> = Vec::new();
    for l in layers {
        let (a, b) = match &l.mixer {
            Mixer::Attention(a) => (&a.qkv, &a.o),
            Mixer::Mlp(m) => (&m.up, &m.down),
            Mixer::Mamba(m) => (&m.in_proj, &m.out_proj),
        };
        for m in [a, b] {
            all.push((m, Pass::Prefill));
            if step {
                all.push((m, Pass::Step));
            }
        }
    }
    if step {
        all.push((lm_head, Pass::Step));
    }
    let mut shapes: Vec<(&Matrix, Pass)> = Vec::new();
    for (m, pass) in all {
        if !shapes
            .iter()
            .any(|(s, p)| (s.dims(), *p) == (m.dims(), pass))
        {
            shapes.push((m, pass));
        }
    }
    shapes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A candidate that is nobody's twin.
    fn algo(invariant: bool, us: &[f64]) -> Algo {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1000);
        Algo {
            data: [0; 8],
            id: 0,
            tile: 0,
            stages: 0,
            cluster: 0,
            swizzle: 0,
            custom: 0,
            split_k: 1,
            reduction: 0,
            invariant,
            bits: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            us: us.to_vec(),
        }
    }

    #[test]
    fn only_candidates_near_the_fastest_choosable_one_are_timed_again() {
        let us = [100.0, 114.0, 116.0, 80.0, 300.0];
        // The 80 us candidate is not invariant, so it sets no bar, though it is timed again.
        assert_eq!(
            contenders(&us, &[true, true, true, false, true]),
            vec![0, 1, 3]
        );
        // With no invariant candidate at all, the fastest of all sets it.
        assert_eq!(contenders(&us, &[false; 5]), vec![3]);
        assert_eq!(contenders(&[5.0], &[true]), vec![0]);
    }

    #[test]
    fn a_timing_runs_a_long_gemm_fewer_times() {
        // Nothing known (a shape's first row count): five runs; a GEMM of tens or hundreds of
        // microseconds still five; then as many as take about 2 ms, at least one.
        assert_eq!(runs_for(None), RUNS);
        assert_eq!(runs_for(Some(63.0)), 5);
        assert_eq!(runs_for(Some(450.0)), 5);
        assert_eq!(runs_for(Some(800.0)), 3);
        assert_eq!(runs_for(Some(2244.0)), 1);
        assert_eq!(runs_for(Some(9318.0)), 1);
        // A nonsense estimate never asks for more than five or fewer than one.
        assert_eq!(runs_for(Some(0.0)), 5);
        assert_eq!(runs_for(Some(f64::INFINITY)), 1);
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
    fn prefill_classes_start_where_the_class_below_stops_keeping_up() {
        let rows = Pass::Prefill.rows();
        assert_eq!(rows, &[16, 64, 128, 256, 512, 1024, PREFILL_CHUNK]);
        // Small tiles: fast up to 64 rows; large tiles from 128; a third fastest at 1,024 and a
        // full pass by 1% only, and one whose rows vary, fastest everywhere.
        let small = algo(true, &[10.0, 12.0, 30.0, 60.0, 120.0, 240.0, 960.0]);
        let large = algo(true, &[20.0, 20.0, 21.0, 30.0, 45.0, 80.0, 300.0]);
        let third = algo(true, &[30.0, 30.0, 30.0, 40.0, 60.0, 79.2, 297.0]);
        let varies = algo(false, &[1.0; 7]);
        let c = [varies, small.clone(), large.clone(), third];
        let pins = pin_prefill(&c, rows).unwrap();
        assert_eq!(
            pins,
            vec![
                Pin { up_to: 64, algo: 1 },
                Pin {
                    up_to: PREFILL_CHUNK,
                    algo: 2
                }
            ]
        );
        let s = GemmShape {
            key: "k".into(),
            out: 8,
            inp: 8,
            written: Out::F32,
            pass: Pass::Prefill,
            rows: rows.to_vec(),
            candidates: c.to_vec(),
            pins,
            cost: Vec::new(),
            tune_s: 0.0,
        };
        assert_eq!((s.pinned(1), s.pinned(64), s.pinned(65)), (1, 1, 2));
        // Longer than a pass: the last class.
        assert_eq!(s.pinned(PREFILL_CHUNK + 1), 2);
        // A pass of a 5-, two 64- and a 1,500-token prompt's first 900 rows: two GEMMs, the
        // short prompts' rows through the small tiles, the long one's after them.
        let pieces = [(5, 5), (64, 64), (64, 64), (1500, 900)];
        assert_eq!(
            s.ranges(&pieces).collect::<Vec<_>>(),
            vec![(1, 0, 133), (2, 133, 900)]
        );
        // One class: one GEMM over the pass.
        assert_eq!(
            s.ranges(&[(200, 200), (300, 300)]).collect::<Vec<_>>(),
            vec![(2, 0, 500)]
        );
        // Against every candidate, the one whose rows vary included: what invariance costs.
        assert_eq!(s.cost(), vec![10.0, 12.0, 21.0, 30.0, 45.0, 80.0, 300.0]);
        // One kernel fastest everywhere: one class.
        let c = [small, large, algo(true, &[9.0; 7])];
        assert_eq!(
            pin_prefill(&c, rows),
            Some(vec![Pin {
                up_to: PREFILL_CHUNK,
                algo: 2
            }])
        );
        assert_eq!(pin_prefill(&[algo(false, &[1.0; 7])], rows), None);
    }

    #[test]
    fn the_step_pins_one_candidate_for_every_batch() {
        let c = [
            algo(true, &[10.0, 10.0, 20.0]),
            algo(true, &[12.0, 12.0, 12.0]),
        ];
        assert_eq!(
            pin_step(&c, Pass::Step.rows()),
            Some(vec![Pin { up_to: 32, algo: 1 }])
        );
        assert_eq!(pin_step(&[algo(false, &[1.0; 3])], Pass::Step.rows()), None);
    }

    #[test]
    fn cost_is_the_pinned_time_over_the_fastest() {
        let s = GemmShape {
            key: "k".into(),
            out: 8,
            inp: 8,
            written: Out::F32,
            pass: Pass::Step,
            rows: vec![8, 32],
            candidates: vec![algo(true, &[20.0, 100.0]), algo(false, &[10.0, 110.0])],
            pins: vec![Pin { up_to: 32, algo: 0 }],
            cost: Vec::new(),
            tune_s: 0.0,
        };
        assert_eq!(s.cost(), vec![2.0, 1.0]);
    }

    fn twin(bits: usize, us: &[f64]) -> Algo {
        Algo {
            bits,
            ..algo(true, us)
        }
    }

    fn prefill_shape(candidates: Vec<Algo>, pins: Vec<Pin>) -> GemmShape {
        GemmShape {
            key: "k".into(),
            out: 8,
            inp: 8,
            written: Out::F32,
            pass: Pass::Prefill,
            rows: Pass::Prefill.rows().to_vec(),
            candidates,
            pins,
            cost: Vec::new(),
            tune_s: 0.0,
        }
    }

    #[test]
    fn twins_of_neighbouring_classes_run_as_one_gemm_through_the_fastest_at_its_rows() {
        // Candidates 0 and 2 give the same bits (group 0); 1 does not (group 1); 3 would, but
        // its rows vary, so it never runs.
        let small = twin(0, &[10.0, 12.0, 30.0, 60.0, 120.0, 240.0, 960.0]);
        let other = twin(1, &[20.0, 14.0, 25.0, 40.0, 50.0, 90.0, 350.0]);
        let large = twin(0, &[20.0, 20.0, 21.0, 30.0, 45.0, 80.0, 300.0]);
        let varies = Algo {
            bits: 0,
            ..algo(false, &[1.0; 7])
        };
        let s = prefill_shape(
            vec![small, other, large, varies],
            vec![
                Pin { up_to: 16, algo: 0 },
                Pin { up_to: 64, algo: 1 },
                Pin {
                    up_to: PREFILL_CHUNK,
                    algo: 2,
                },
            ],
        );
        // A lone prompt runs the fastest twin of its class's pin at its length, never one
        // whose rows vary.
        assert_eq!(s.runner(0, 5), 0);
        assert_eq!(s.runner(0, 300), 2);
        assert_eq!(s.runner(2, 16), 0);
        assert_eq!(s.runner(1, 300), 1);
        // 5-, 200- and 700-token prompts (classes 0, 2 and 2; 0 and 2 twins): one GEMM of 905
        // rows through the twin fastest at 1,024 rows.
        assert_eq!(
            s.ranges(&[(5, 5), (200, 200), (700, 700)])
                .collect::<Vec<_>>(),
            vec![(2, 0, 905)]
        );
        // A 40-token prompt between them (class 1, no twin of theirs): three GEMMs.
        assert_eq!(
            s.ranges(&[(5, 5), (40, 40), (700, 700)])
                .collect::<Vec<_>>(),
            vec![(0, 0, 5), (1, 5, 40), (2, 45, 700)]
        );
        // What a class costs is its fastest twin's time over the fastest candidate's (the one
        // whose rows vary, at 1 us): 128 rows run candidate 2, 16 rows candidate 0.
        assert_eq!(s.cost(), vec![10.0, 14.0, 21.0, 30.0, 45.0, 80.0, 300.0]);
    }

    #[test]
    fn a_class_reaches_as_far_as_a_twin_of_its_pin_keeps_up() {
        let rows = Pass::Prefill.rows();
        // 0 is fastest at 16 rows, its twin 2 from 64 up, 1 (no twin) within a hair of 2: one
        // class, where without twins 0's class would stop at 16.
        let c = [
            twin(0, &[10.0, 30.0, 60.0, 120.0, 240.0, 480.0, 1900.0]),
            twin(1, &[20.0, 20.5, 21.0, 30.0, 45.0, 80.0, 300.0]),
            twin(0, &[20.0, 20.0, 21.0, 30.0, 45.0, 80.0, 300.0]),
        ];
        assert_eq!(
            pin_prefill(&c, rows),
            Some(vec![Pin {
                up_to: PREFILL_CHUNK,
                algo: 0
            }])
        );
        // The step's choice scores a candidate by its fastest twin: 0 and 2 together beat 1.
        let c = [
            twin(0, &[10.0, 30.0, 60.0]),
            twin(1, &[12.0, 12.0, 12.0]),
            twin(0, &[20.0, 11.0, 11.0]),
        ];
        assert_eq!(choose(&c), Some(0));
        let s = GemmShape {
            pass: Pass::Step,
            rows: Pass::Step.rows().to_vec(),
            ..prefill_shape(c.to_vec(), pin_step(&c, Pass::Step.rows()).unwrap())
        };
        assert_eq!(s.runner(s.pinned(4), 4), 0);
        assert_eq!(s.runner(s.pinned(12), 12), 2);
        assert_eq!(s.runner(s.pinned(32), 32), 2);
    }

    #[test]
    fn a_cached_tuning_serves_only_a_gemm_that_writes_what_it_was_timed_writing() {
        let rows = Pass::Prefill.rows();
        let mut s = prefill_shape(vec![twin(0, &[1.0; 7])], vec![]);
        // As a cache written before bf16 outputs stored it: no `written`, so f32.
        let mut json = serde_json::to_value(&s).unwrap();
        json.as_object_mut().unwrap().remove("written");
        let old: GemmShape = serde_json::from_value(json).unwrap();
        assert!(old.tunes("k", (8, 8, Out::F32), Pass::Prefill, rows));
        assert!(!old.tunes("k", (8, 8, Out::Bf16), Pass::Prefill, rows));
        assert!(!old.tunes("k", (8, 8, Out::F32), Pass::Step, rows));
        assert!(!old.tunes("k2", (8, 8, Out::F32), Pass::Prefill, rows));
        assert!(!old.tunes("k", (8, 8, Out::F32), Pass::Prefill, &rows[1..]));
        s.written = Out::Bf16;
        let new: GemmShape = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert!(new.tunes("k", (8, 8, Out::Bf16), Pass::Prefill, rows));
        assert!(!new.tunes("k", (8, 8, Out::F32), Pass::Prefill, rows));
    }

    #[test]
    fn offset_rows_start_past_half_way_and_stay_inside() {
        assert_eq!(offset_rows(1024), Some(513));
        assert_eq!(offset_rows(32), Some(17));
        assert_eq!(offset_rows(8), None);
    }
}
