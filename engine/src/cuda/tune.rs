//! Which kernel runs each decode GEMV, chosen per matrix shape at load: each shape's matrices are
//! timed on the CUDA cores and on the tensor cores, each at every split of K (warps per row or
//! per tile) the shape allows, as the step runs them (one after the other, in a CUDA graph, PDL
//! as configured), at batch 1 and at batch 8. Batch 1's kernel is chosen on the batch-1 times,
//! batches 2-8's on the batch-8 times, by one rule ([`choose`]): the candidates are taken in
//! order ([`kernels_for`]) and each replaces the one chosen so far only if it is [`MARGIN`]
//! faster, so a near draw stays with the earlier one and machines of one kind choose alike. The
//! choice does not depend on `--max-batch` (the timing has its own buffers for 8 rows). A row's
//! bits are the same at batches 2-8; at batch 1 they may differ from its bits in a larger batch,
//! where the two kernels differ (docs/ENGINE.md says what keeping one kernel for every batch
//! cost). The result is cached beside the compiled kernels, keyed by the kernels' own cache key
//! (source, architecture, driver), the GPU and its multiprocessors, so a machine tunes a model's
//! shapes once; `ready.features.gemv_tuning` reports every shape's times and choices.
//!
//! `ENGINE_GEMV_TUNING=<file>` takes every shape's choices from a file instead ([`pinned`]): so
//! that an A/B of two builds (scripts/ab-bench.sh `--same-picks`) runs both on one set of
//! choices, since a build with other kernel sources tunes afresh and near draws can fall either
//! way between processes. Said in `degraded`: the choices were not timed on this machine.
//! paths.rs takes the file's step path of batches 2-8 as well.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{sys, CudaContext, CudaStream};
use serde::{Deserialize, Serialize};

use super::backend::{CudaBackend, F32};
use super::device::{driver_err, DevBuf};
use super::kernels;
use super::ops::Gemv;
use super::plan::{self, GemvKernel, GemvMode};
use crate::error::{Error, Result};

/// One shape's measurement and the kernel chosen for it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShapeTuning {
    /// The GEMV's role ([`role`]): residual, norm, gate_up, relu2 or lm_head.
    pub role: String,
    /// Output rows (gate/up: each half's) and K.
    pub rows: usize,
    pub cols: usize,
    /// The model's matrices of this role and shape, timed one after the other.
    pub matrices: usize,
    /// The batches timed: 1 and 8.
    pub batches: [usize; 2],
    /// Every kernel timed, in [`kernels_for`]'s order: the CUDA cores at the shape's default
    /// split of K, the tensor cores at each of theirs (none where the shape does not fit them:
    /// plan.rs `mma_ksplits`), the CUDA cores at their other splits (plan.rs `gemv_ksplits`).
    pub candidates: Vec<Candidate>,
    /// The choices, at batch 1 and at batches 2-8.
    pub batch_1: GemvKernel,
    pub batched: GemvKernel,
}

/// One kernel's times for a shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Candidate {
    pub kernel: GemvKernel,
    /// Microseconds per matrix at each of the shape's `batches`.
    pub us: [f64; 2],
}

/// The choices for every GEMV shape of the loaded model.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tuning {
    pub shapes: Vec<ShapeTuning>,
    /// The cache file, and whether every shape came from it.
    pub cache: Option<String>,
    pub from_cache: bool,
    /// Seconds this load spent on it (timing and cache).
    pub tune_s: f64,
    /// The `ENGINE_GEMV_TUNING` file every choice came from, if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
}

impl Tuning {
    /// The kernel chosen for the GEMV of `mode` over `rows` x `cols` at `batch`; none for a
    /// shape not tuned (before the tuning ran), which runs plan.rs `gemv_launch`'s default.
    pub fn kernel(
        &self,
        mode: GemvMode,
        rows: usize,
        cols: usize,
        batch: usize,
    ) -> Option<GemvKernel> {
        let r = role(mode);
        self.shapes
            .iter()
            .find(|s| s.role == r && s.rows == rows && s.cols == cols)
            .map(|s| if batch == 1 { s.batch_1 } else { s.batched })
    }
}

/// A mode's role, the same for its CUDA-core and tensor-core kernels.
pub fn role(mode: GemvMode) -> &'static str {
    use GemvMode::*;
    match mode {
        Residual | ResidualMma => "residual",
        Norm | NormMma => "norm",
        NormSwiglu | NormSwigluOneWarp | NormSwigluMma => "gate_up",
        NormRelu2 | NormRelu2Mma => "relu2",
        LmHead | LmHeadMma => "lm_head",
    }
}

/// How much smaller a candidate's time must be than the one chosen before it to replace it.
pub const MARGIN: f64 = 0.02;

/// The rule, for the batch timed at `at` (0: batch 1, 1: batch 8): the first candidate, replaced
/// by each later one that is at least [`MARGIN`] faster than the one chosen so far. None without
/// candidates.
pub fn choose(candidates: &[Candidate], at: usize) -> Option<GemvKernel> {
    let first = candidates.first()?;
    let chosen = candidates.iter().fold(first, |b, c| {
        if c.us[at] < (1.0 - MARGIN) * b.us[at] {
            c
        } else {
            b
        }
    });
    Some(chosen.kernel)
}

/// The batches timed.
const BATCHES: [usize; 2] = [1, plan::MAX_GEMV_BATCH];

/// The environment variable naming a file of GEMV choices to take instead of timing.
pub const PINNED_VAR: &str = "ENGINE_GEMV_TUNING";

/// The file `ENGINE_GEMV_TUNING` names, read and parsed once at load for both of its readers:
/// [`pinned`] (the GEMV choices) and paths.rs `pinned_path` (the step path of batches 2-8).
pub struct PinnedFile {
    pub path: String,
    pub json: serde_json::Value,
}

const PINNED_FIX: &str =
    "give it an `engine bench` JSON or a gemv-tune cache file of a CUDA run, or unset it to tune";

impl PinnedFile {
    /// The file named by [`PINNED_VAR`], if it is set.
    pub fn from_env() -> Result<Option<PinnedFile>> {
        let Ok(path) = std::env::var(PINNED_VAR) else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Config {
            message: format!("{PINNED_VAR}={path}: cannot read it ({e}); unset it to tune"),
        })?;
        Self::parse(&path, &text).map(Some)
    }

    /// `text` as the file at `path`; not JSON is an error naming the file and the way out.
    pub fn parse(path: &str, text: &str) -> Result<PinnedFile> {
        let json = serde_json::from_str(text).map_err(|e| Error::Config {
            message: format!("{PINNED_VAR}={path}: not JSON ({e}); {PINNED_FIX}"),
        })?;
        Ok(PinnedFile {
            path: path.to_string(),
            json,
        })
    }
}

/// The shapes of a file of GEMV choices: the tuning cache's list, or a JSON object holding them
/// as `engine bench` writes them (`features.gemv_tuning.shapes`), as a `ready` line's features
/// (`gemv_tuning.shapes`) or as a [`Tuning`] (`shapes`). Where the object names its GPU and
/// multiprocessors, they must be this one's (`gpu`, `sms`): choices timed on another GPU are not
/// this one's.
pub fn pinned(file: &PinnedFile, gpu: &str, sms: usize) -> Result<Vec<ShapeTuning>> {
    let bad = |why: String| Error::Config {
        message: format!("{PINNED_VAR}={}: {why}; {PINNED_FIX}", file.path),
    };
    let v = &file.json;
    let features = if v["features"].is_object() {
        &v["features"]
    } else {
        v
    };
    if let (Some(g), Some(n)) = (
        features["gpu"].as_str(),
        features["multiprocessors"].as_u64(),
    ) {
        if (g, n as usize) != (gpu, sms) {
            return Err(bad(format!(
                "its choices were timed on {g} with {n} multiprocessors, and this is {gpu} with {sms}"
            )));
        }
    }
    let shapes = if v.is_array() {
        v
    } else {
        [
            &v["features"]["gemv_tuning"]["shapes"],
            &v["gemv_tuning"]["shapes"],
            &v["shapes"],
        ]
        .into_iter()
        .find(|s| s.is_array())
        .ok_or_else(|| bad("no GEMV choices in it (a CPU run has none)".into()))?
    };
    serde_json::from_value(shapes.clone())
        .map_err(|e| bad(format!("its GEMV choices do not parse ({e})")))
}

/// The entry of `list` for a group of `matrices` GEMVs of `role` over `rows` x `cols` that timed
/// exactly `kernels`, in that order (see [`timed_these`]).
fn tuned<'a>(
    list: &'a [ShapeTuning],
    role: &str,
    (rows, cols): (usize, usize),
    matrices: usize,
    kernels: &[GemvKernel],
) -> Option<&'a ShapeTuning> {
    list.iter().find(|s| {
        s.role == role
            && (s.rows, s.cols) == (rows, cols)
            && s.matrices == matrices
            && s.batches == BATCHES
            && timed_these(s, kernels)
    })
}

/// The cache file `what` (gemv-tune, step-paths) for this kernel build on this GPU.
pub(super) fn cache_file(what: &str, kernel_key: &str, gpu: &str, sms: usize) -> Option<PathBuf> {
    let slug: String = gpu
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    kernels::cache_dir().map(|d| d.join(format!("{what}-{kernel_key}-{slug}-{sms}sm.json")))
}

/// The cached entries; an unreadable or corrupt file is no cache (they are timed again and the
/// file rewritten).
pub(super) fn read_cache<T: serde::de::DeserializeOwned>(path: &PathBuf) -> Vec<T> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes the cache atomically; a failed write only costs the next load the timing.
pub(super) fn write_cache<T: Serialize>(path: &PathBuf, shapes: &[T]) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let Ok(text) = serde_json::to_vec_pretty(shapes) else {
        return;
    };
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Launches per timing: enough that a few-microsecond GEMV is timed over tens of launches.
const MIN_LAUNCHES: usize = 16;
/// Replays of the captured launches that are timed (after one untimed).
const REPLAYS: usize = 3;

impl CudaBackend {
    /// Every decode GEMV of the step grouped by role and shape, in the step's order, reading
    /// `x` and writing `y`.
    pub(super) fn gemv_groups(&self, x: u64, y: u64) -> Vec<Vec<Gemv<'_>>> {
        let mut groups: Vec<Vec<Gemv<'_>>> = Vec::new();
        let gemvs = self
            .layers
            .iter()
            .flat_map(|l| self.sublayer_gemvs(l))
            .chain([self.lm_head_gemv(x, 0)]);
        for mut g in gemvs {
            (g.x, g.y) = (x, y);
            let key = |g: &Gemv| (role(g.mode), g.shape());
            match groups.iter_mut().find(|gr| key(&gr[0]) == key(&g)) {
                Some(gr) => gr.push(g),
                None => groups.push(vec![g]),
            }
        }
        groups
    }

    /// Microseconds per matrix of `group` at `batch` on `kernel`: the group's
    /// launches (repeated to at least [`MIN_LAUNCHES`]) captured into a graph, replayed once,
    /// then [`REPLAYS`] times between two events. Where capture fails, the same launches direct.
    fn time_group(
        &self,
        group: &[Gemv<'_>],
        parts: u64,
        batch: usize,
        kernel: GemvKernel,
    ) -> Result<f64> {
        let reps = MIN_LAUNCHES.div_ceil(group.len());
        let launch_all = || -> Result<()> {
            for _ in 0..reps {
                for g in group {
                    self.gemv_on(g, batch, parts, Some(kernel))?;
                }
            }
            Ok(())
        };
        let captured = self
            .stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .ok()
            .and_then(|()| {
                let launched = launch_all();
                let ended = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
                launched.ok().and(ended.ok().flatten())
            });
        let ms = self.time_runs(1, REPLAYS, || match &captured {
            Some(g) => g.launch().map_err(driver_err("graph launch")),
            None => launch_all(),
        })?;
        Ok(ms * 1e3 / (reps * group.len()) as f64)
    }

    /// [`time_runs`] on the backend's stream.
    pub(super) fn time_runs(
        &self,
        warm: usize,
        runs: usize,
        run: impl Fn() -> Result<()>,
    ) -> Result<f64> {
        time_runs(&self.ctx, &self.stream, warm, runs, run)
    }

    /// Tunes (or reads from the cache, or takes from the `ENGINE_GEMV_TUNING` file) every GEMV
    /// shape of the model; the step launched after this uses the choices.
    pub(super) fn tune_gemvs(&mut self, file: Option<&PinnedFile>) -> Result<()> {
        let started = Instant::now();
        let path = cache_file(
            "gemv-tune",
            &self.kernels.cache_key,
            &self.device_name,
            self.sms,
        );
        let pinned = file
            .map(|f| pinned(f, &self.device_name, self.sms))
            .transpose()?;
        // A pinned file stands where the cache would, and a shape it lacks is an error, not a
        // timing; the cache is neither read nor written.
        let mut cached: Vec<ShapeTuning> = match &pinned {
            Some(_) => Vec::new(),
            None => path.as_ref().map(read_cache).unwrap_or_default(),
        };
        let known: &[ShapeTuning] = pinned.as_deref().unwrap_or(&cached);
        let batches = BATCHES;
        // Zeroed scratch for 8 rows of every GEMV's input and output: zeros in, zeros out.
        let c = &self.cfg;
        let widest = self
            .layers
            .iter()
            .flat_map(|l| self.sublayer_gemvs(l))
            .map(|g| g.w.rows.max(g.w.cols))
            .max()
            .unwrap_or(0)
            .max(c.hidden_size);
        let rows = BATCHES[1];
        let x = DevBuf::zeroed(rows * widest * F32)?;
        let y = DevBuf::zeroed(rows * widest * F32)?;
        let parts = DevBuf::zeroed(rows * 2 * plan::lm_head_blocks(c) * F32)?;
        let mut shapes = Vec::new();
        let mut timed = false;
        for group in self.gemv_groups(x.ptr, y.ptr) {
            let g = &group[0];
            let (rows, cols) = g.shape();
            let r = role(g.mode);
            let kernels = kernels_for(g.mode, rows, cols);
            if let Some(s) = tuned(known, r, (rows, cols), group.len(), &kernels) {
                shapes.push(s.clone());
                continue;
            }
            if let Some(f) = file {
                return Err(Error::Config {
                    message: format!(
                        "{PINNED_VAR}={} has no choice for the {} {r} GEMVs of {rows}x{cols} over this build's candidates ({}): it was made for another model, GPU or set of kernels; unset it to tune",
                        f.path,
                        group.len(),
                        kernels.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
                    ),
                });
            }
            timed = true;
            let candidates = kernels
                .into_iter()
                .map(|kernel| {
                    Ok(Candidate {
                        kernel,
                        us: [
                            self.time_group(&group, parts.ptr, batches[0], kernel)?,
                            self.time_group(&group, parts.ptr, batches[1], kernel)?,
                        ],
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let pick = |at| choose(&candidates, at).expect("the CUDA cores are always a candidate");
            shapes.push(ShapeTuning {
                role: r.to_string(),
                rows,
                cols,
                matrices: group.len(),
                batches,
                batch_1: pick(0),
                batched: pick(1),
                candidates,
            });
        }
        if let (true, Some(p)) = (timed, &path) {
            cached.retain(|c| !shapes.iter().any(|s| same_key(s, c)));
            cached.extend(shapes.iter().cloned());
            write_cache(p, &cached);
        }
        if let Some(f) = file {
            self.degraded.push(format!(
                "gemv_tuning: every choice from {} ({PINNED_VAR} is set), none timed here",
                f.path
            ));
        }
        self.tuning = Tuning {
            shapes,
            cache: path.map(|p| p.display().to_string()),
            from_cache: !timed,
            tune_s: started.elapsed().as_secs_f64(),
            pinned: file.map(|f| f.path.clone()),
        };
        Ok(())
    }
}

/// Milliseconds per run of `run` on `stream`: `warm` untimed runs, then `runs` between two
/// events.
pub(super) fn time_runs(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    warm: usize,
    runs: usize,
    run: impl Fn() -> Result<()>,
) -> Result<f64> {
    let event = || {
        ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver_err("event create"))
    };
    let (start, end) = (event()?, event()?);
    for _ in 0..warm {
        run()?;
    }
    start.record(stream).map_err(driver_err("event record"))?;
    for _ in 0..runs {
        run()?;
    }
    end.record(stream).map_err(driver_err("event record"))?;
    stream.synchronize().map_err(driver_err("synchronize"))?;
    let ms = start.elapsed_ms(&end).map_err(driver_err("event time"))? as f64;
    Ok(ms / runs as f64)
}

/// The kernels timed for a GEMV of `mode` over `rows` x `cols`, in the order [`choose`] takes
/// them: the CUDA cores at the shape's default split (plan.rs `gemv_ksplit`; the lm_head's at its
/// own one), the tensor cores at each split of theirs where the shape fits them, then the CUDA
/// cores' other splits. The tensor cores come before those because in the step they won the
/// near draws that the tuning's timing of one shape alone called for the CUDA cores: on
/// Nemotron-H-8B's in_proj and up (CUDA cores at two warps 0.6 us faster alone, tensor cores at
/// four in the step) the step was 1.9% slower per token (docs/ENGINE.md, session 18).
pub fn kernels_for(mode: GemvMode, rows: usize, cols: usize) -> Vec<GemvKernel> {
    let cuda = if mode.is_lm_head() {
        vec![plan::lm_head_ksplit(rows, cols)]
    } else {
        plan::gemv_ksplits(rows, cols, mode == GemvMode::NormSwiglu)
    };
    let tensor = if plan::tensor_cores_fit(rows, cols) {
        plan::mma_ksplits(cols)
    } else {
        Vec::new()
    };
    let (default, others) = cuda
        .split_first()
        .expect("a CUDA-core split for every shape");
    std::iter::once(GemvKernel::CudaCores(*default))
        .chain(tensor.into_iter().map(GemvKernel::TensorCores))
        .chain(others.iter().copied().map(GemvKernel::CudaCores))
        .collect()
}

/// Whether a cached tuning timed exactly `kernels`, in that order: one made when the candidates
/// were others (a split since ruled out, a kernel since added) is timed again rather than trusted.
fn timed_these(s: &ShapeTuning, kernels: &[GemvKernel]) -> bool {
    s.candidates
        .iter()
        .map(|c| c.kernel)
        .eq(kernels.iter().copied())
}

fn same_key(a: &ShapeTuning, b: &ShapeTuning) -> bool {
    (&a.role, a.rows, a.cols, a.matrices, a.batches)
        == (&b.role, b.rows, b.cols, b.matrices, b.batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    use GemvKernel::{CudaCores, TensorCores};

    fn cand(kernel: GemvKernel, us: [f64; 2]) -> Candidate {
        Candidate { kernel, us }
    }

    fn shape(role: &str, rows: usize, batch_1: GemvKernel, batched: GemvKernel) -> ShapeTuning {
        ShapeTuning {
            role: role.into(),
            rows,
            cols: 4096,
            matrices: 32,
            batches: BATCHES,
            candidates: vec![
                cand(CudaCores(2), [10.0, 40.0]),
                cand(TensorCores(8), [11.0, 14.0]),
            ],
            batch_1,
            batched,
        }
    }

    #[test]
    fn each_batch_class_gets_its_fastest_kernel() {
        // Llama-3.2-1B's down as measured on the H200: the CUDA cores at batch 1, the tensor
        // cores at batch 8, the fastest split there.
        let c = [
            cand(CudaCores(2), [11.7, 61.1]),
            cand(TensorCores(8), [14.7, 16.5]),
            cand(TensorCores(4), [22.9, 24.4]),
            cand(TensorCores(2), [38.5, 40.9]),
        ];
        assert_eq!(choose(&c, 0), Some(CudaCores(2)));
        assert_eq!(choose(&c, 1), Some(TensorCores(8)));
        // Another split on the CUDA cores wins as the tensor cores do, and each candidate must
        // beat the one chosen before it: Qwen3-4B's gate/up and Nemotron-H-8B's in_proj as
        // timed on the H200.
        let c = [
            cand(CudaCores(2), [31.6, 81.7]),
            cand(TensorCores(4), [30.1, 35.8]),
            cand(TensorCores(2), [37.7, 43.6]),
            cand(CudaCores(1), [27.7, 73.5]),
            cand(CudaCores(4), [36.7, 150.8]),
        ];
        assert_eq!(choose(&c, 0), Some(CudaCores(1)));
        assert_eq!(choose(&c, 1), Some(TensorCores(4)));
        let c = [
            cand(CudaCores(1), [45.7, 168.0]),
            cand(TensorCores(8), [47.0, 50.6]),
            cand(TensorCores(4), [44.5, 56.0]),
            cand(CudaCores(2), [43.9, 175.1]),
        ];
        assert_eq!(choose(&c, 0), Some(TensorCores(4)));
        assert_eq!(choose(&c, 1), Some(TensorCores(8)));
        // The first listed wins a tie.
        let c = [
            cand(CudaCores(1), [20.0, 60.0]),
            cand(TensorCores(8), [15.0, 25.0]),
            cand(TensorCores(4), [15.0, 25.0]),
        ];
        assert_eq!(
            (choose(&c, 0), choose(&c, 1)),
            (Some(TensorCores(8)), Some(TensorCores(8)))
        );
        // A near draw stays on the first candidate; a win by the margin does not.
        let first = cand(CudaCores(2), [10.0, 12.0]);
        for other in [CudaCores(4), TensorCores(8)] {
            assert_eq!(
                choose(&[first.clone(), cand(other, [9.9, 11.9])], 0),
                Some(CudaCores(2))
            );
            assert_eq!(
                choose(&[first.clone(), cand(other, [9.7, 11.9])], 0),
                Some(other)
            );
            assert_eq!(
                choose(&[first.clone(), cand(other, [9.7, 11.9])], 1),
                Some(CudaCores(2))
            );
        }
        // A shape with one kernel keeps it; none without candidates.
        assert_eq!(choose(&[first], 1), Some(CudaCores(2)));
        assert_eq!(choose(&[], 0), None);
    }

    #[test]
    fn every_shape_times_the_cuda_cores_first_at_its_default_split() {
        // Qwen3-4B's down: the CUDA cores at 2 warps per row (the default), the tensor cores at 4
        // and 2 warps per tile (K in 76 steps of 128: one warp's would be too long, plan.rs
        // `mma_ksplits`), the CUDA cores at 1, 4 and 8.
        assert_eq!(
            kernels_for(GemvMode::Residual, 2560, 9728),
            [
                CudaCores(2),
                TensorCores(4),
                TensorCores(2),
                CudaCores(1),
                CudaCores(4),
                CudaCores(8)
            ]
        );
        // The lm_head's CUDA-core kernel has one split; a shape off the tensor cores' tiles has
        // none of theirs.
        assert_eq!(
            kernels_for(GemvMode::LmHead, 151936, 896),
            [CudaCores(plan::lm_head_ksplit(151936, 896)), TensorCores(1)]
        );
        assert_eq!(
            kernels_for(GemvMode::Norm, 4104, 4096),
            [CudaCores(2), CudaCores(1), CudaCores(4), CudaCores(8)]
        );
        for (mode, rows, cols) in [
            (GemvMode::NormSwiglu, 14336, 4096),
            (GemvMode::Residual, 896, 4864),
        ] {
            let ks = kernels_for(mode, rows, cols);
            let gate_up = mode == GemvMode::NormSwiglu;
            assert_eq!(ks[0], CudaCores(plan::gemv_ksplit(rows, cols, gate_up)));
            // Each is launched as it was timed.
            for k in ks {
                let l = plan::gemv_launch(rows, cols, mode, 1, Some(k));
                match k {
                    CudaCores(n) => assert_eq!((l.mode, l.ksplit), (mode, n)),
                    TensorCores(n) => {
                        assert_eq!((l.mode.on_tensor_cores(), l.ksplit), (None, n))
                    }
                }
            }
        }
    }

    #[test]
    fn a_choice_applies_to_both_kernels_of_its_role_to_its_shape_and_batch_class() {
        let t = Tuning {
            shapes: vec![
                shape("gate_up", 14336, CudaCores(2), TensorCores(8)),
                shape("residual", 4096, TensorCores(4), CudaCores(2)),
            ],
            ..Default::default()
        };
        for b in 2..=plan::MAX_GEMV_BATCH {
            assert_eq!(
                t.kernel(GemvMode::NormSwiglu, 14336, 4096, b),
                Some(TensorCores(8))
            );
            assert_eq!(
                t.kernel(GemvMode::NormSwigluOneWarp, 14336, 4096, b),
                Some(TensorCores(8))
            );
            assert_eq!(
                t.kernel(GemvMode::Residual, 4096, 4096, b),
                Some(CudaCores(2))
            );
        }
        assert_eq!(
            t.kernel(GemvMode::NormSwiglu, 14336, 4096, 1),
            Some(CudaCores(2))
        );
        assert_eq!(
            t.kernel(GemvMode::Residual, 4096, 4096, 1),
            Some(TensorCores(4))
        );
        // Another shape or role: not tuned, the default launch.
        assert_eq!(t.kernel(GemvMode::NormSwiglu, 14336, 2048, 8), None);
        assert_eq!(t.kernel(GemvMode::Norm, 14336, 4096, 8), None);
        assert_eq!(
            Tuning::default().kernel(GemvMode::Residual, 4096, 4096, 8),
            None
        );
        for m in GemvMode::ALL {
            assert_eq!(role(m), role(m.on_tensor_cores().unwrap_or(m)));
        }
    }

    #[test]
    fn a_cached_tuning_is_trusted_only_for_the_candidates_it_timed() {
        let s = shape("residual", 4096, TensorCores(8), CudaCores(2));
        assert!(timed_these(&s, &[CudaCores(2), TensorCores(8)]));
        // Another order, a candidate more or fewer: timed again.
        assert!(!timed_these(&s, &[TensorCores(8), CudaCores(2)]));
        assert!(!timed_these(
            &s,
            &[CudaCores(2), TensorCores(8), CudaCores(4)]
        ));
        assert!(!timed_these(&s, &[CudaCores(2)]));
    }

    #[test]
    fn the_cache_survives_a_round_trip_and_a_corrupt_file_is_no_cache() {
        let dir = std::env::temp_dir().join(format!("gemv-tune-test-{}", std::process::id()));
        let path = dir.join("t.json");
        let shapes = vec![
            shape("norm", 6144, CudaCores(1), TensorCores(8)),
            shape("lm_head", 128256, TensorCores(2), CudaCores(1)),
        ];
        write_cache(&path, &shapes);
        assert_eq!(read_cache::<ShapeTuning>(&path), shapes);
        std::fs::write(&path, b"{not json").unwrap();
        assert!(read_cache::<ShapeTuning>(&path).is_empty());
        assert!(read_cache::<ShapeTuning>(&dir.join("absent.json")).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
        // The file is per kernel build and GPU, its name safe whatever the GPU's name.
        if let Some(a) = cache_file("gemv-tune", "k1", "NVIDIA H200", 132) {
            let name = a.file_name().unwrap().to_string_lossy().to_string();
            assert_eq!(name, "gemv-tune-k1-NVIDIA-H200-132sm.json");
            assert_ne!(Some(a), cache_file("gemv-tune", "k2", "NVIDIA H200", 132));
        }
    }

    #[test]
    fn pinned_choices_come_from_a_bench_json_a_ready_line_or_the_cache() {
        let shapes = vec![
            shape("norm", 6144, CudaCores(1), TensorCores(8)),
            shape("gate_up", 14336, CudaCores(2), TensorCores(4)),
        ];
        let tuning = Tuning {
            shapes: shapes.clone(),
            cache: None,
            from_cache: false,
            tune_s: 0.5,
            pinned: None,
        };
        let t = serde_json::to_value(&tuning).unwrap();
        let h100 = |t: &serde_json::Value| serde_json::json!({"gpu": "NVIDIA H100 80GB HBM3", "multiprocessors": 132, "gemv_tuning": t});
        for text in [
            serde_json::json!({"device": "cuda:0", "features": h100(&t)}),
            h100(&t),
            serde_json::to_value(&shapes).unwrap(),
        ] {
            let f = PinnedFile::parse("f.json", &text.to_string()).unwrap();
            let got = pinned(&f, "NVIDIA H100 80GB HBM3", 132);
            assert_eq!(got.unwrap(), shapes);
        }
        // Another GPU's choices are not this one's.
        let h200 = serde_json::json!({"features": h100(&t)}).to_string();
        let e = pinned(
            &PinnedFile::parse("h.json", &h200).unwrap(),
            "NVIDIA H200",
            132,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("timed on NVIDIA H100 80GB HBM3 with 132 multiprocessors, and this is NVIDIA H200 with 132"),
            "{e}"
        );
        // A CPU run's JSON has no choices; a broken file is not JSON: each names the file and
        // the way out.
        let cpu = serde_json::json!({"device": "cpu", "features": {}}).to_string();
        let e = pinned(&PinnedFile::parse("cpu.json", &cpu).unwrap(), "g", 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ENGINE_GEMV_TUNING=cpu.json: no GEMV choices in it")
                && e.contains("unset it"),
            "{e}"
        );
        let e = PinnedFile::parse("x.json", "{oops")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("ENGINE_GEMV_TUNING=x.json: not JSON"), "{e}");
        // Found only for its role, shape, count and candidates.
        let k = [CudaCores(2), TensorCores(8)];
        let hit = tuned(&shapes, "gate_up", (14336, 4096), 32, &k).unwrap();
        assert_eq!((hit.batch_1, hit.batched), (CudaCores(2), TensorCores(4)));
        assert!(tuned(&shapes, "gate_up", (14336, 4096), 28, &k).is_none());
        assert!(tuned(&shapes, "residual", (14336, 4096), 32, &k).is_none());
        assert!(tuned(&shapes, "gate_up", (14336, 4096), 32, &[CudaCores(2)]).is_none());
    }
}
