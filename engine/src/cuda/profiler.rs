//! The decode step's profiler (ENGINE_PROFILE, docs/ENGINE.md): CUDA events around each step or
//! after each kernel, folded into per-kernel totals and printed when the backend is dropped.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaStream};

use super::device::driver_err;
use crate::error::Result;

/// ENGINE_PROFILE=1: an event after every decode kernel (graphs off), the time between
/// consecutive events summed per kernel role, and achieved bandwidth for the GEMVs.
/// ENGINE_PROFILE=step: graphs and PDL as configured, events around each decode step only: the
/// step's time on the GPU against its wall time in `decode` (the host's share of a token).
pub(super) struct Profiler {
    pub per_kernel: bool,
    wall_s: std::cell::Cell<f64>,
    events: Vec<cudarc::driver::CudaEvent>,
    marks: std::cell::RefCell<Vec<(&'static str, usize)>>,
    totals: std::cell::RefCell<std::collections::BTreeMap<&'static str, (usize, f64, usize)>>,
    steps: std::cell::Cell<usize>,
}

impl Profiler {
    const EVENTS: usize = 1024;

    pub fn new(ctx: &Arc<CudaContext>, per_kernel: bool) -> Result<Self> {
        let events = (0..Self::EVENTS)
            .map(|_| ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(driver_err("event create"))?;
        Ok(Self {
            per_kernel,
            wall_s: Default::default(),
            events,
            marks: Default::default(),
            totals: Default::default(),
            steps: Default::default(),
        })
    }

    pub fn mark(&self, name: &'static str, bytes: usize, stream: &CudaStream) -> Result<()> {
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
        let mut out = format!(
            "kernel profile over {steps} decode steps: {:.3} ms per step\n{:<16} {:>8} {:>12} {:>10} {:>7} {:>9}\n",
            all / steps as f64,
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
