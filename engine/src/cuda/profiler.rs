//! The profiler (ENGINE_PROFILE, docs/ENGINE.md): CUDA events around each decode step, or after
//! each kernel of the decode steps or of the prefill passes, folded into per-kernel totals and
//! printed when the backend is dropped.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaStream};

use super::device::driver_err;
use crate::error::Result;

/// ENGINE_PROFILE=1: an event after every decode kernel (graphs off), the time between
/// consecutive events summed per kernel role, and achieved bandwidth for the GEMVs.
/// ENGINE_PROFILE=step: graphs and PDL as configured, events around each decode step only: the
/// step's time on the GPU against its wall time in `decode` (the host's share of a token).
/// ENGINE_PROFILE=prefill: an event after every kernel of each prefill pass, the decode steps
/// untouched (graphs and PDL as configured; prefill runs no graph).
pub(super) struct Profiler {
    pub per_kernel: bool,
    /// Profiling the prefill passes, not the decode steps.
    pub prefill: bool,
    /// In prefill mode, marks are recorded only inside a pass (a decode step's would land in a
    /// graph capture).
    active: std::cell::Cell<bool>,
    rows: std::cell::Cell<usize>,
    wall_s: std::cell::Cell<f64>,
    events: Vec<cudarc::driver::CudaEvent>,
    marks: std::cell::RefCell<Vec<(&'static str, usize)>>,
    totals: std::cell::RefCell<std::collections::BTreeMap<&'static str, (usize, f64, usize)>>,
    steps: std::cell::Cell<usize>,
}

impl Profiler {
    const EVENTS: usize = 1024;

    pub fn new(ctx: &Arc<CudaContext>, per_kernel: bool, prefill: bool) -> Result<Self> {
        let events = (0..Self::EVENTS)
            .map(|_| ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(driver_err("event create"))?;
        Ok(Self {
            per_kernel,
            prefill,
            active: std::cell::Cell::new(!prefill),
            rows: Default::default(),
            wall_s: Default::default(),
            events,
            marks: Default::default(),
            totals: Default::default(),
            steps: Default::default(),
        })
    }

    pub fn mark(&self, name: &'static str, bytes: usize, stream: &CudaStream) -> Result<()> {
        if !self.active.get() {
            return Ok(());
        }
        let mut marks = self.marks.borrow_mut();
        if name == "start" {
            marks.clear();
        }
        if marks.len() < Self::EVENTS {
            self.events[marks.len()]
                .record(stream)
                .map_err(driver_err("event record"))?;
            marks.push((name, bytes));
        }
        Ok(())
    }

    /// Prefill mode: a pass of `rows` rows begins (its marks are recorded until [`Self::end_pass`]).
    pub fn begin_pass(&self, rows: usize, stream: &CudaStream) -> Result<()> {
        if self.prefill {
            self.active.set(true);
            self.rows.set(self.rows.get() + rows);
            self.mark("start", 0, stream)?;
        }
        Ok(())
    }

    /// Prefill mode: the pass's kernels have finished (the caller synchronised); fold them.
    pub fn end_pass(&self) -> Result<()> {
        if self.prefill && self.active.get() {
            self.active.set(false);
            self.end_step(0.0)?;
        }
        Ok(())
    }

    /// After the step's synchronising read: fold its intervals into the totals.
    pub fn end_step(&self, wall_s: f64) -> Result<()> {
        self.wall_s.set(self.wall_s.get() + wall_s);
        let marks = self.marks.borrow();
        let mut totals = self.totals.borrow_mut();
        for i in 1..marks.len() {
            let ms = self.events[i - 1]
                .elapsed_ms(&self.events[i])
                .map_err(driver_err("event time"))? as f64;
            let e = totals.entry(marks[i].0).or_default();
            e.0 += 1;
            e.1 += ms;
            e.2 += marks[i].1;
        }
        self.steps.set(self.steps.get() + 1);
        Ok(())
    }

    pub fn report(&self) -> String {
        let steps = self.steps.get().max(1);
        let totals = self.totals.borrow();
        let all: f64 = totals.values().map(|t| t.1).sum();
        let wall_ms = self.wall_s.get() * 1e3 / steps as f64;
        if !self.per_kernel {
            return format!(
                "step profile over {steps} decode steps: {:.3} ms on the GPU, {wall_ms:.3} ms of \
                 wall time in decode (graph launch to tokens read), {:.1}% of it on the host",
                all / steps as f64,
                100.0 * (1.0 - all / steps as f64 / wall_ms)
            );
        }
        let what = if self.prefill {
            format!(
                "kernel profile over {steps} prefill passes ({} rows, {:.0} rows/s): {:.3} ms per pass",
                self.rows.get(),
                self.rows.get() as f64 / (all / 1e3),
                all / steps as f64
            )
        } else {
            format!(
                "kernel profile over {steps} decode steps: {:.3} ms per step",
                all / steps as f64
            )
        };
        let mut out = format!(
            "{what}\n{:<16} {:>8} {:>12} {:>10} {:>7} {:>9}\n",
            "kernel", "calls", "ms/step", "us/call", "share", "GB/s"
        );
        for (name, (calls, ms, bytes)) in totals.iter() {
            let gbs = if *bytes > 0 {
                *bytes as f64 / (ms / 1e3) / 1e9
            } else {
                0.0
            };
            out += &format!(
                "{name:<16} {:>8} {:>12.4} {:>10.2} {:>6.1}% {:>9.0}\n",
                calls / steps,
                ms / steps as f64,
                ms * 1e3 / *calls as f64,
                100.0 * ms / all,
                gbs
            );
        }
        out
    }
}
