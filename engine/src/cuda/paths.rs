//! Which path each decode batch runs (plan.rs [`StepPath`]): batch 1 the GEMVs, batches over
//! [`plan::MAX_GEMV_BATCH`] cuBLAS, and batches 2-8 whichever ran the step faster at load: the
//! step of min(8, `--max-batch`) rows, standing at contexts spread below [`TIMED_CONTEXT`]
//! positions and each in a state slot of its own, is captured on each path and its graph
//! replayed between two events, the paths in alternated rounds ([`ROUNDS`]), and cuBLAS must
//! win by [`tune::MARGIN`] (a near draw stays on the GEMVs, so machines of one kind choose
//! alike). The choice is cached beside the GEMV tuning, keyed by the kernels' cache key, the GPU
//! and its multiprocessors, cuBLASLt's version, the model's GEMV shapes with the kernel chosen
//! for each, the decode attention kernel, the timed context and rounds, and the batch timed, so
//! a machine times a model once; `ready.features.step_paths` reports it. Where
//! `ENGINE_GEMV_TUNING` pins the GEMV choices (tune.rs), the file's step path is taken too
//! ([`pinned_path`]): an A/B on one set of choices runs its batches on one path. A
//! row's bits depend on the path (bf16 activations on cuBLAS, f32 on the GEMVs; batch 1 has
//! attention.cu and GEMV kernels of its own, every larger batch attention_batch.cu), so batches
//! of another path than batch 1 are held to the token gate at their own batch size
//! (docs/ENGINE.md).

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::backend::CudaBackend;
use super::device::driver_err;
use super::plan::{self, StepPath};
use super::tune::{self, role};
use crate::error::{Error, Result};

/// One timing of the step on both paths.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PathTiming {
    /// [`CudaBackend::path_key`]: what the times depend on besides the kernels and the GPU,
    /// which name the cache file.
    pub key: String,
    pub batch: usize,
    /// Milliseconds per step on each path.
    pub gemv_ms: f64,
    pub blas_ms: f64,
    /// Why a path's graph was not captured where graphs are on, so that its time is its kernels
    /// launched one by one, host launch cost included, which the served step's graph does not
    /// pay; absent where it was captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemv_uncaptured: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blas_uncaptured: Option<String>,
}

impl PathTiming {
    /// The rule: cuBLAS when it is at least [`tune::MARGIN`] faster than the GEMVs.
    pub fn chosen(&self) -> StepPath {
        if self.blas_ms < (1.0 - tune::MARGIN) * self.gemv_ms {
            StepPath::Blas
        } else {
            StepPath::Gemv
        }
    }
}

/// The paths of every batch class, and how the batched one was chosen.
#[derive(Debug, Clone, Serialize)]
pub struct StepPaths {
    pub batch_1: StepPath,
    /// Batches 2 to 8.
    pub batched: StepPath,
    /// Batches 9 to [`plan::MAX_BATCH`].
    pub beyond: StepPath,
    /// None where `--max-batch` is 1 (nothing to choose).
    pub timing: Option<PathTiming>,
    pub from_cache: bool,
    /// Seconds this load spent on it.
    pub choose_s: f64,
    /// The `ENGINE_GEMV_TUNING` file the timing came from, if it held one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
}

impl Default for StepPaths {
    fn default() -> Self {
        Self {
            batch_1: StepPath::of(1, StepPath::Gemv),
            batched: StepPath::Gemv,
            beyond: StepPath::of(plan::MAX_BATCH, StepPath::Gemv),
            timing: None,
            from_cache: false,
            choose_s: 0.0,
            pinned: None,
        }
    }
}

/// Untimed replays before each round's timed ones, and the timed ones of a round.
const WARM: usize = 2;
const REPLAYS: usize = 10;
/// Rounds of [`REPLAYS`] per path, the paths alternated GEMVs-cuBLAS, cuBLAS-GEMVs, ... so that
/// a clock drifting over the timing weighs on both alike (the GEMM tuning just before it holds
/// an 8B's H100 at its power cap, the SM clock between 1,515 and 1,980 MHz: docs/ENGINE.md,
/// session 49); each path's time is the median of its rounds. Even, so a steady drift falls on
/// both paths evenly.
const ROUNDS: usize = 4;

/// The timed step's rows stand at contexts spread evenly below this many positions, as a
/// served batch's do, each over blocks of its own: at position 0 the attention reads nothing,
/// and there the two paths ranked unlike their served steps (docs/ENGINE.md, session 47).
const TIMED_CONTEXT: usize = 1024;

/// Steps one timing of a path runs, each advancing every row by one position (argmax.cu
/// `advance`, as a served step's graph does): the rows are staged again before each round, and
/// stand far enough from the model's end that the last of these steps is within it.
const TIMED_STEPS: usize = WARM + REPLAYS;

/// Position of row `r` of `batch` timed rows: the middle of its share of [`TIMED_CONTEXT`],
/// with room for [`TIMED_STEPS`] within the model's context.
fn timed_position(r: usize, batch: usize, max_position: usize) -> usize {
    ((2 * r + 1) * TIMED_CONTEXT / (2 * batch)).min(max_position.saturating_sub(TIMED_STEPS))
}

/// The timed rows as staged on the device: each row's position, its block table (`max_blocks`
/// entries a row), covering every position a round's [`TIMED_STEPS`] reach with blocks of its
/// own while the pool has them (then from block 0 again), and its state slot, its own while
/// the pool has one per row. Rows staged once, at the model's last position, stepped 96
/// positions past it over the rounds, through entries past their row's and, on the last row,
/// past the tables buffer (tiny-llama, 512 positions, at --max-batch 4: an illegal address at
/// load).
#[derive(Debug)]
struct TimedRows {
    positions: Vec<i32>,
    tables: Vec<i32>,
    slots: Vec<i32>,
}

impl TimedRows {
    fn new(
        batch: usize,
        max_position: usize,
        block_size: usize,
        max_blocks: usize,
        num_blocks: usize,
        state_slots: usize,
    ) -> Self {
        let mut tables = vec![0i32; batch * max_blocks];
        let mut next = 0;
        let positions = (0..batch)
            .map(|r| {
                let at = timed_position(r, batch, max_position);
                let reached = (at + TIMED_STEPS).div_ceil(block_size).min(max_blocks);
                for e in &mut tables[r * max_blocks..][..reached] {
                    *e = (next % num_blocks) as i32;
                    next += 1;
                }
                at as i32
            })
            .collect();
        let slots = (0..batch)
            .map(|r| (r % state_slots.max(1)) as i32)
            .collect();
        Self {
            positions,
            tables,
            slots,
        }
    }

    /// Every row back at position 0, block 0 and slot 0.
    fn reset(batch: usize, max_blocks: usize) -> Self {
        Self {
            positions: vec![0; batch],
            tables: vec![0; batch * max_blocks],
            slots: vec![0; batch],
        }
    }
}

impl CudaBackend {
    /// The cache key of this model's step at `batch`: what the two paths' times depend on besides
    /// the kernels' source and the GPU (which name the cache file): each GEMV shape with the
    /// kernel the tuning chose for it at `batch`, the decode attention kernel, and the cuBLASLt
    /// version. A change of either choice times the paths again.
    fn path_key(&self, batch: usize) -> String {
        let shapes: Vec<(&str, usize, usize, usize, Option<plan::GemvKernel>)> = self
            .gemv_groups(0, 0)
            .iter()
            .map(|g| {
                let (r, c) = g[0].shape();
                let kernel = self.tuning.kernel(g[0].mode, r, c, batch);
                (role(g[0].mode), r, c, g.len(), kernel)
            })
            .collect();
        path_key(
            self.lt.version,
            &shapes,
            &self.decode_attention_kernel(batch),
        )
    }

    /// Stages the timed step's `batch` rows as a served batch's stand ([`TimedRows`]), a
    /// hybrid's each in a state slot of its own (the pool has one per row), so the step reads
    /// and writes what a served one does; on one slot the rows' Mamba states (4 MiB a layer on
    /// Nemotron-H-8B) would stay in the L2. Returns the positions, which each round stages
    /// again. `reset` puts every row back at position 0, block 0 and slot 0. What the rows
    /// write is in free blocks and slots, which a prefill overwrites or starts from zeros
    /// before any read.
    fn stage_timed_rows(&self, batch: usize, reset: bool) -> Result<Vec<i32>> {
        let mb = self.dec.layout.max_blocks;
        let rows = if reset {
            TimedRows::reset(batch, mb)
        } else {
            TimedRows::new(
                batch,
                self.cfg.max_position_embeddings,
                self.pool.block_size,
                mb,
                self.pool.num_blocks,
                self.pool.state_slots,
            )
        };
        self.dec.positions.write(0, &rows.positions)?;
        self.dec.slots.write(0, &rows.slots)?;
        self.dec.tables.write(0, &rows.tables)?;
        Ok(rows.positions)
    }

    /// Milliseconds per step of `batch` rows on the GEMVs and on cuBLAS: each path's graph (its
    /// kernels directly where graphs are off or the capture fails) replayed [`WARM`] times, then
    /// [`REPLAYS`] times between two events, in [`ROUNDS`] rounds alternated by
    /// [`time_alternated`]; and, where graphs are on and a capture failed, why. The step runs on
    /// the rows [`Self::stage_timed_rows`] staged (no sequence is admitted yet), each round
    /// from their staged `positions`.
    fn time_paths(&self, batch: usize, positions: &[i32]) -> Result<[(f64, Option<String>); 2]> {
        let paths = [StepPath::Gemv, StepPath::Blas];
        let captured = paths.map(
            |path| match self.use_graphs.then(|| self.capture(batch, path)) {
                Some(Ok(g)) => (Some(g), None),
                Some(Err(e)) => (None, Some(e.to_string())),
                None => (None, None),
            },
        );
        let [g_ms, b_ms] = time_alternated(ROUNDS, |i| {
            self.dec.positions.write(0, positions)?;
            self.time_runs(WARM, REPLAYS, || match &captured[i].0 {
                Some(g) => g.launch().map_err(driver_err("graph launch")),
                None => self.step_kernels(batch, paths[i]),
            })
        })?;
        let [(_, gemv_uncaptured), (_, blas_uncaptured)] = captured;
        Ok([(g_ms, gemv_uncaptured), (b_ms, blas_uncaptured)])
    }

    /// Chooses the path of batches 2-8 (or reads it from the cache); the graphs captured after
    /// this use it.
    pub(super) fn choose_paths(&mut self, file: Option<&tune::PinnedFile>) -> Result<()> {
        let started = Instant::now();
        let batch = self.max_batch.min(plan::MAX_GEMV_BATCH);
        if batch < 2 {
            self.paths = StepPaths::default();
            return Ok(());
        }
        let path = tune::cache_file(
            "step-paths",
            &self.kernels.cache_key,
            &self.device_name,
            self.sms,
        );
        let pinned = match file {
            Some(f) => pinned_path(f, batch)?,
            None => None,
        };
        let mut cached: Vec<PathTiming> = path.as_ref().map(tune::read_cache).unwrap_or_default();
        let key = self.path_key(batch);
        let hit = match &pinned {
            Some(t) => Some(t.clone()),
            None => cached
                .iter()
                .find(|t| t.key == key && t.batch == batch)
                .cloned(),
        };
        let from_cache = hit.is_some() && pinned.is_none();
        let timing = match hit {
            Some(t) => t,
            None => {
                // The profiler's per-kernel marks are for the steps of requests, not these.
                let profiler = self.profiler.take();
                let timed = self
                    .stage_timed_rows(batch, false)
                    .and_then(|positions| self.time_paths(batch, &positions));
                self.profiler = profiler;
                // The timing's own error first: a fault in it fails the reset's copy too.
                let reset = self.stage_timed_rows(batch, true);
                let [(gemv_ms, gemv_uncaptured), (blas_ms, blas_uncaptured)] = timed?;
                reset?;
                let t = PathTiming {
                    key,
                    batch,
                    gemv_ms,
                    blas_ms,
                    gemv_uncaptured,
                    blas_uncaptured,
                };
                if let Some(p) = &path {
                    cached.retain(|c| !(c.key == t.key && c.batch == t.batch));
                    cached.push(t.clone());
                    tune::write_cache(p, &cached);
                }
                t
            }
        };
        match (&pinned, file) {
            (Some(t), Some(f)) => self.degraded.push(format!(
                "step_paths: batches 2-{} on {} from {} ({} is set), not timed here",
                plan::MAX_GEMV_BATCH,
                match t.chosen() {
                    StepPath::Gemv => "the GEMVs",
                    StepPath::Blas => "cuBLAS",
                },
                f.path,
                tune::PINNED_VAR
            )),
            (None, Some(f)) => self.degraded.push(format!(
                "step_paths: {} holds no step path at batch {batch}, so the path of batches 2-{} was timed here",
                f.path,
                plan::MAX_GEMV_BATCH
            )),
            (_, None) => {}
        }
        self.paths = StepPaths {
            batched: timing.chosen(),
            timing: Some(timing),
            from_cache,
            choose_s: started.elapsed().as_secs_f64(),
            pinned: pinned.and(file).map(|f| f.path.clone()),
            ..StepPaths::default()
        };
        Ok(())
    }
}

/// Each of two things' median over `rounds` timings by `time(i)`, taken in the order 0 1, 1 0,
/// 0 1, ...: over an even number of rounds a drift that grows steadily from one timing to the
/// next adds as much to one as to the other, and the median passes over a round that a passing
/// stall spoiled.
fn time_alternated(rounds: usize, mut time: impl FnMut(usize) -> Result<f64>) -> Result<[f64; 2]> {
    let mut ms = [Vec::with_capacity(rounds), Vec::with_capacity(rounds)];
    for r in 0..rounds {
        for i in if r % 2 == 0 { [0, 1] } else { [1, 0] } {
            ms[i].push(time(i)?);
        }
    }
    Ok(ms.map(|v| stats::median(&v).unwrap_or(f64::NAN)))
}

/// The step path's timing in a file of pinned choices (tune.rs [`tune::pinned`]), as `engine
/// bench` writes it (`features.step_paths.timing`) or a `ready` line's features
/// (`step_paths.timing`). None where the file holds none (a gemv-tune cache file, or a run at
/// `--max-batch 1`): the path is then timed here. A timing of another batch than this load's is
/// an error: its choice is not this load's to take.
pub fn pinned_path(file: &tune::PinnedFile, batch: usize) -> Result<Option<PathTiming>> {
    let bad = |why: String| Error::Config {
        message: format!(
            "{}={}: {why}; unset it to tune",
            tune::PINNED_VAR,
            file.path
        ),
    };
    let v = &file.json;
    let Some(t) = [
        &v["features"]["step_paths"]["timing"],
        &v["step_paths"]["timing"],
    ]
    .into_iter()
    .find(|t| t.is_object()) else {
        return Ok(None);
    };
    let t: PathTiming = serde_json::from_value(t.clone())
        .map_err(|e| bad(format!("its step path timing does not parse ({e})")))?;
    if t.batch != batch {
        return Err(bad(format!(
            "its step path was timed at batch {} and this load times batch {batch} (the smaller of {} and --max-batch): give both runs one --max-batch",
            t.batch,
            plan::MAX_GEMV_BATCH
        )));
    }
    Ok(Some(t))
}

/// [`CudaBackend::path_key`] from its parts: the cuBLASLt version, each GEMV shape (role, rows, K,
/// matrices, the kernel chosen at the batch timed) and the decode attention kernel's name.
fn path_key(
    lt_version: usize,
    shapes: &[(&str, usize, usize, usize, Option<plan::GemvKernel>)],
    attention: &str,
) -> String {
    let shapes: Vec<String> = shapes
        .iter()
        .map(|(role, r, c, n, kernel)| match kernel {
            Some(k) => format!("{role}:{r}x{c}x{n}:{k:?}"),
            None => format!("{role}:{r}x{c}x{n}"),
        })
        .collect();
    format!(
        "cublasLt{lt_version};{};{attention};ctx{TIMED_CONTEXT};rounds{ROUNDS}x{TIMED_STEPS}",
        shapes.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    fn timing(gemv_ms: f64, blas_ms: f64) -> PathTiming {
        PathTiming {
            key: "k".into(),
            batch: 8,
            gemv_ms,
            blas_ms,
            gemv_uncaptured: None,
            blas_uncaptured: None,
        }
    }

    /// A cache or pinned file written before the capture was reported reads as captured, and a
    /// failed capture's reason is kept through the cache, where a captured path writes nothing.
    #[test]
    fn a_path_timed_without_its_graph_says_why_and_older_timings_read_as_captured() {
        let old = r#"{"key":"k","batch":8,"gemv_ms":6.2,"blas_ms":6.0}"#;
        assert_eq!(
            serde_json::from_str::<PathTiming>(old).unwrap(),
            timing(6.2, 6.0)
        );
        let j = serde_json::to_value(timing(6.2, 6.0)).unwrap();
        assert!(j.get("gemv_uncaptured").is_none() && j.get("blas_uncaptured").is_none());
        let t = PathTiming {
            gemv_uncaptured: Some(
                "graph capture end: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED".into(),
            ),
            ..timing(8.8, 6.0)
        };
        let back: PathTiming = serde_json::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }

    /// A timer for [`time_alternated`] whose every timing reads `drift` more than the one
    /// before it, over each thing's own time (`ms[i]`), and which logs the order asked.
    fn drifting(
        ms: [f64; 2],
        drift: f64,
    ) -> (impl FnMut(usize) -> Result<f64>, Rc<RefCell<Vec<usize>>>) {
        let asked = Rc::new(RefCell::new(Vec::new()));
        let log = asked.clone();
        let timer = move |i: usize| {
            let n = log.borrow().len();
            log.borrow_mut().push(i);
            Ok(ms[i] + drift * n as f64)
        };
        (timer, asked)
    }

    /// Two paths alike under a clock that drifts through the timing come out alike, where
    /// timing one after the other would charge all the drift to the second; a path 1.5% faster
    /// stays faster under a drift of 1% a round, which timed one after the other ranks it
    /// slower.
    #[test]
    fn alternated_rounds_charge_a_steady_drift_to_neither_path() {
        let (timer, asked) = drifting([6.0, 6.0], 0.06);
        let [g, b] = time_alternated(ROUNDS, timer).unwrap();
        assert_eq!(*asked.borrow(), [0, 1, 1, 0, 0, 1, 1, 0]);
        assert!((g - b).abs() < 1e-9, "{g} {b}");
        assert_eq!(timing(g, b).chosen(), StepPath::Gemv);

        let (gemv, blas) = (6.0, 6.0 * 0.985);
        let (timer, _) = drifting([gemv, blas], 0.06);
        let [g, b] = time_alternated(ROUNDS, timer).unwrap();
        assert!(
            (g - gemv - b + blas).abs() < 1e-9,
            "{g} {b}: the drift fell unevenly"
        );
        let (mut one_then_other, _) = drifting([gemv, blas], 0.06);
        let firsts: Vec<f64> = (0..ROUNDS).map(|_| one_then_other(0).unwrap()).collect();
        let seconds: Vec<f64> = (0..ROUNDS).map(|_| one_then_other(1).unwrap()).collect();
        assert!(stats::median(&seconds) > stats::median(&firsts));
    }

    /// A round that a passing stall spoiled does not move a path's time, and a failed timing
    /// is the timing's error.
    #[test]
    fn alternated_rounds_take_each_paths_median_and_stop_at_an_error() {
        let mut n = 0;
        let [g, b] = time_alternated(ROUNDS, |i| {
            n += 1;
            Ok(if n == 3 { 60.0 } else { [6.0, 5.0][i] })
        })
        .unwrap();
        assert_eq!([g, b], [6.0, 5.0]);
        let mut calls = 0;
        let err = time_alternated(ROUNDS, |_| {
            calls += 1;
            if calls == 2 {
                Err(Error::Internal {
                    message: "graph launch failed".into(),
                })
            } else {
                Ok(1.0)
            }
        })
        .unwrap_err();
        assert!(err.to_string().contains("graph launch failed"), "{err}");
        assert_eq!(calls, 2);
    }

    /// The timed rows stand at distinct contexts spread over [`TIMED_CONTEXT`] (their mean its
    /// middle), and a round's steps from there never pass the model's context.
    #[test]
    fn timed_rows_spread_over_the_timed_context_within_the_model() {
        let at: Vec<usize> = (0..8).map(|r| timed_position(r, 8, 131_072)).collect();
        assert_eq!(at, [64, 192, 320, 448, 576, 704, 832, 960]);
        assert_eq!(timed_position(0, 2, 131_072), 256);
        assert_eq!(timed_position(1, 2, 131_072), 768);
        assert_eq!(timed_position(7, 8, 512), 512 - TIMED_STEPS);
        assert_eq!(timed_position(0, 8, 32), 32 - TIMED_STEPS);
    }

    /// Every position a round's steps reach, from each row's staged one, is within the model
    /// and within the row's table, at a block of the pool that no other row's table holds
    /// while the pool has enough; each row has a state slot of its own.
    #[test]
    fn a_rounds_steps_stay_within_each_rows_own_blocks() {
        let cases: [(usize, usize, usize); 4] =
            [(4, 512, 16), (8, 512, 16), (8, 131_072, 16), (2, 64, 1)];
        for (batch, max_position, bs) in cases {
            let mb = max_position.div_ceil(bs);
            let num_blocks = batch * mb;
            let rows = TimedRows::new(batch, max_position, bs, mb, num_blocks, batch);
            let mut owner = vec![None; num_blocks];
            for (r, &at) in rows.positions.iter().enumerate() {
                for p in at as usize..at as usize + TIMED_STEPS {
                    let case = format!("batch {batch}, {max_position} positions, row {r} at {p}");
                    assert!(p < max_position && p / bs < mb, "{case}");
                    let block = rows.tables[r * mb + p / bs] as usize;
                    assert!(block < num_blocks, "{case}");
                    assert_eq!(*owner[block].get_or_insert(r), r, "{case}: block {block}");
                }
                assert_eq!(rows.slots[r], r as i32, "batch {batch}: row {r}'s slot");
            }
        }
        // A pool smaller than the rows' blocks: its blocks again from 0, each still in it.
        let rows = TimedRows::new(8, 512, 16, 32, 10, 0);
        assert!(rows.tables.iter().all(|&b| (0..10).contains(&b)));
        // A model without state slots: every row's slot 0, unused.
        assert!(rows.slots.iter().all(|&s| s == 0));
    }

    #[test]
    fn cublas_must_win_by_the_margin() {
        assert_eq!(timing(6.0, 5.0).chosen(), StepPath::Blas);
        assert_eq!(timing(6.0, 5.9).chosen(), StepPath::Gemv);
        assert_eq!(timing(6.0, 6.5).chosen(), StepPath::Gemv);
        // 2% faster is not enough; just past it is.
        assert_eq!(timing(1.0, 0.98).chosen(), StepPath::Gemv);
        assert_eq!(timing(1.0, 0.979).chosen(), StepPath::Blas);
    }

    #[test]
    fn batch_1_runs_the_gemvs_and_batches_past_8_cublas_whatever_was_chosen() {
        for batched in [StepPath::Gemv, StepPath::Blas] {
            assert_eq!(StepPath::of(1, batched), StepPath::Gemv);
            for b in 2..=plan::MAX_GEMV_BATCH {
                assert_eq!(StepPath::of(b, batched), batched);
            }
            for b in plan::MAX_GEMV_BATCH + 1..=plan::MAX_BATCH {
                assert_eq!(StepPath::of(b, batched), StepPath::Blas);
            }
        }
        let d = StepPaths::default();
        assert_eq!(
            (d.batch_1, d.batched, d.beyond),
            (StepPath::Gemv, StepPath::Gemv, StepPath::Blas)
        );
        let j = serde_json::to_value(&d).unwrap();
        assert_eq!(
            (&j["batched"], &j["beyond"]),
            (&"gemv".into(), &"cublas".into())
        );
    }

    #[test]
    fn a_timing_is_reused_only_for_the_kernels_it_timed() {
        use plan::GemvKernel::{CudaCores, TensorCores};
        let shapes = |down| {
            vec![
                ("norm", 6144, 4096, 32, Some(TensorCores(4))),
                ("residual", 4096, 14336, 32, Some(down)),
            ]
        };
        let key = path_key(130000, &shapes(TensorCores(8)), "attention_batch_d128");
        assert_eq!(
            key,
            path_key(130000, &shapes(TensorCores(8)), "attention_batch_d128")
        );
        // Another kernel for one shape, another attention kernel, another cuBLASLt: timed again.
        for other in [
            path_key(130000, &shapes(CudaCores(2)), "attention_batch_d128"),
            path_key(130000, &shapes(TensorCores(8)), "attention_g4"),
            path_key(130100, &shapes(TensorCores(8)), "attention_batch_d128"),
        ] {
            assert_ne!(key, other);
        }
    }

    #[test]
    fn a_pinned_file_gives_its_step_path_at_this_batch_or_none() {
        let t = serde_json::to_value(timing(6.4, 6.3)).unwrap();
        let bench =
            serde_json::json!({"features": {"step_paths": {"batched": "gemv", "timing": t}}});
        let ready = serde_json::json!({"step_paths": {"timing": t}});
        for text in [bench.to_string(), ready.to_string()] {
            let f = tune::PinnedFile::parse("f.json", &text).unwrap();
            let got = pinned_path(&f, 8).unwrap();
            assert_eq!(got, Some(timing(6.4, 6.3)));
        }
        // A gemv-tune cache file, or a run at --max-batch 1, holds no step path.
        let none =
            serde_json::json!({"features": {"step_paths": {"batched": "gemv", "timing": null}}});
        for text in ["[]".to_string(), none.to_string()] {
            let f = tune::PinnedFile::parse("f.json", &text).unwrap();
            assert_eq!(pinned_path(&f, 8).unwrap(), None);
        }
        // Another batch's choice is not this load's.
        let f = tune::PinnedFile::parse("f.json", &bench.to_string()).unwrap();
        let e = pinned_path(&f, 4).unwrap_err().to_string();
        assert!(
            e.contains("ENGINE_GEMV_TUNING=f.json: its step path was timed at batch 8 and this load times batch 4")
                && e.contains("one --max-batch"),
            "{e}"
        );
        let broken = serde_json::json!({"step_paths": {"timing": {"batch": 8}}}).to_string();
        let f = tune::PinnedFile::parse("b.json", &broken).unwrap();
        let e = pinned_path(&f, 8).unwrap_err().to_string();
        assert!(
            e.contains("b.json: its step path timing does not parse"),
            "{e}"
        );
    }

    #[test]
    fn the_timings_survive_the_cache() {
        let dir = std::env::temp_dir().join(format!("step-paths-test-{}", std::process::id()));
        let path = dir.join("p.json");
        let t = vec![timing(6.1, 5.2), timing(1.0, 1.3)];
        tune::write_cache(&path, &t);
        assert_eq!(tune::read_cache::<PathTiming>(&path), t);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
