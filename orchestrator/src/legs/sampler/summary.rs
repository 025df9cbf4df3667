//! A leg's series reduced to the figures the clock gate judges and the record keeps.
//!
//! Definitions (docs/RECORD.md repeats them):
//! - the *window* is the battery: from the `battery` phase mark to the next mark (or the last
//!   row); a series with no battery mark (`clock sample`) is judged whole;
//! - *busy fraction*: the share of the window's utilization samples above 0 %;
//! - SM clock *p5 / median / p95*: linear-interpolated percentiles of the window's polls;
//!   *spread* = (p95 - p5) / median x 100 %;
//! - a throttle reason's *share*: the share of the window's polls that had its bit set;
//! - *persistence* is on only if every poll in the window said so;
//! - *peak GPU memory*: the largest sum over the leg's processes in one poll, over the whole leg
//!   (the load is where memory peaks). Where the driver names none of the leg's processes (in a
//!   container NVML reports the host's pids, which are not ours), it is the device's memory in
//!   use above the first poll's instead, and `peak_gpu_mem_source` says so.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

use super::gpu::throttle_names;
use super::Row;
use crate::util::fmt::fmt_num;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockStats {
    pub p5: f64,
    pub median: f64,
    pub p95: f64,
    /// (p95 - p5) / median x 100.
    pub spread_pct: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThrottleShare {
    pub name: String,
    pub samples: u64,
    pub share: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSummary {
    /// "battery" or "whole series".
    pub window: String,
    pub window_s: f64,
    pub polls: u64,
    pub util_samples: u64,
    pub busy_samples: u64,
    /// "buffer" (the driver's sample buffer), "poll", or "none".
    pub util_source: String,
    pub busy_fraction: Option<f64>,
    pub sm_mhz: Option<ClockStats>,
    pub mem_mhz_median: Option<f64>,
    pub power_w_median: Option<f64>,
    pub power_w_max: Option<f64>,
    pub temp_c_max: Option<u32>,
    /// Every reason seen in the window, most frequent first.
    pub throttle: Vec<ThrottleShare>,
    pub persistence: Option<bool>,
    pub persistence_off_polls: u64,
    pub peak_gpu_mem_bytes: Option<u64>,
    /// "processes" (the leg's own, summed) or "device above its first poll" (see above).
    #[serde(default)]
    pub peak_gpu_mem_source: String,
    pub peak_device_used_bytes: Option<u64>,
}

/// Linear-interpolated percentile `q` (0..=1) of sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64))
}

/// The series' phase marks, (time in µs, phase), in order.
pub fn phase_marks(rows: &[Row]) -> Vec<(u64, &str)> {
    rows.iter()
        .filter_map(|r| match r {
            Row::Phase { t_us, phase } => Some((*t_us, phase.as_str())),
            _ => None,
        })
        .collect()
}

/// The battery window (start, end) in µs, if the series marks one.
pub fn battery_window(rows: &[Row]) -> Option<(u64, u64)> {
    let marks = phase_marks(rows);
    let i = marks.iter().position(|(_, p)| *p == "battery")?;
    let start = marks[i].0;
    let end = match marks.get(i + 1) {
        Some((t, _)) => *t,
        None => rows.iter().filter_map(Row::t_us).max().unwrap_or(start),
    };
    Some((start, end))
}

/// What the window's rows add up to, as they are read.
#[derive(Default)]
struct Tally<'a> {
    sm: Vec<f64>,
    mem: Vec<f64>,
    power: Vec<f64>,
    temp_max: Option<u32>,
    throttle: BTreeMap<String, u64>,
    polls: u64,
    persist_on: u64,
    persist_off: u64,
    util_n: u64,
    busy_n: u64,
    sources: Vec<&'a str>,
    t_span: Option<(u64, u64)>,
    /// Over the whole leg, not only the window: the load is where memory peaks.
    peak_leg: Option<u64>,
    peak_dev: Option<u64>,
    baseline: Option<u64>,
}

impl<'a> Tally<'a> {
    fn memory(&mut self, procs: &Option<Vec<super::ProcMem>>, used_bytes: Option<u64>) {
        if let Some(p) = procs.as_ref().filter(|p| !p.is_empty()) {
            let sum: u64 = p.iter().map(|m| m.bytes).sum();
            self.peak_leg = Some(self.peak_leg.unwrap_or(0).max(sum));
        }
        if let Some(u) = used_bytes {
            self.peak_dev = Some(self.peak_dev.unwrap_or(0).max(u));
            self.baseline.get_or_insert(u);
        }
    }

    /// One poll inside the window.
    fn poll(&mut self, r: &Row) {
        let Row::Gpu {
            t_us,
            sm_mhz,
            mem_mhz,
            power_mw,
            temp_c,
            throttle: bits,
            persistence,
            ..
        } = r
        else {
            return;
        };
        let (lo, hi) = self.t_span.unwrap_or((*t_us, *t_us));
        self.t_span = Some((lo.min(*t_us), hi.max(*t_us)));
        self.polls += 1;
        self.sm.extend(sm_mhz.map(f64::from));
        self.mem.extend(mem_mhz.map(f64::from));
        self.power.extend(power_mw.map(|p| p as f64 / 1000.0));
        if let Some(t) = temp_c {
            self.temp_max = Some(self.temp_max.unwrap_or(0).max(*t));
        }
        for name in throttle_names(bits.unwrap_or(0)) {
            *self.throttle.entry(name).or_default() += 1;
        }
        match persistence {
            Some(true) => self.persist_on += 1,
            Some(false) => self.persist_off += 1,
            None => {}
        }
    }

    /// One utilization sample inside the window.
    fn util(&mut self, pct: u32, source: &'a str) {
        self.util_n += 1;
        self.busy_n += u64::from(pct > 0);
        if !self.sources.contains(&source) {
            self.sources.push(source);
        }
    }
}

pub fn summarize(rows: &[Row]) -> GpuSummary {
    let (window, span) = match battery_window(rows) {
        Some(w) => ("battery", Some(w)),
        None => ("whole series", None),
    };
    let inside = |t: u64| span.is_none_or(|(a, b)| t >= a && t <= b);
    let mut t = Tally::default();
    for r in rows {
        match r {
            Row::Gpu {
                t_us,
                used_bytes,
                procs,
                ..
            } => {
                t.memory(procs, *used_bytes);
                if inside(*t_us) {
                    t.poll(r);
                }
            }
            Row::Util {
                t_us, pct, source, ..
            } if inside(*t_us) => t.util(*pct, source),
            _ => {}
        }
    }
    let window_s = match (span, t.t_span) {
        (Some((a, b)), _) => (b - a) as f64 / 1e6,
        (None, Some((lo, hi))) => (hi - lo) as f64 / 1e6,
        (None, None) => 0.0,
    };
    finish(t, window, window_s)
}

fn clock_stats(mut sm: Vec<f64>) -> Option<ClockStats> {
    sm.sort_by(f64::total_cmp);
    let (p5, median, p95) = (
        percentile(&sm, 0.05)?,
        percentile(&sm, 0.5)?,
        percentile(&sm, 0.95)?,
    );
    Some(ClockStats {
        p5,
        median,
        p95,
        spread_pct: if median > 0.0 {
            (p95 - p5) / median * 100.0
        } else {
            0.0
        },
    })
}

fn finish(t: Tally, window: &str, window_s: f64) -> GpuSummary {
    let mut throttle: Vec<ThrottleShare> = t
        .throttle
        .into_iter()
        .map(|(name, samples)| ThrottleShare {
            name,
            samples,
            share: samples as f64 / t.polls.max(1) as f64,
        })
        .collect();
    throttle.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.name.cmp(&b.name)));
    GpuSummary {
        window: window.into(),
        window_s,
        polls: t.polls,
        util_samples: t.util_n,
        busy_samples: t.busy_n,
        util_source: if t.sources.is_empty() {
            "none".into()
        } else {
            t.sources.join("+")
        },
        busy_fraction: (t.util_n > 0).then(|| t.busy_n as f64 / t.util_n as f64),
        sm_mhz: clock_stats(t.sm),
        mem_mhz_median: ::stats::median(&t.mem),
        power_w_median: ::stats::median(&t.power),
        power_w_max: t.power.iter().copied().reduce(f64::max),
        temp_c_max: t.temp_max,
        throttle,
        persistence: (t.persist_on + t.persist_off > 0).then_some(t.persist_off == 0),
        persistence_off_polls: t.persist_off,
        peak_gpu_mem_source: match (t.peak_leg, t.peak_dev) {
            (Some(_), _) => "processes".into(),
            (None, Some(_)) => "device above its first poll".into(),
            (None, None) => "none".into(),
        },
        peak_gpu_mem_bytes: t.peak_leg.or_else(|| Some(t.peak_dev? - t.baseline?)),
        peak_device_used_bytes: t.peak_dev,
    }
}

impl fmt::Display for GpuSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |x: Option<f64>| x.map(|v| format!("{:.2}%", v * 100.0));
        write!(
            f,
            "window {} ({:.1} s, {} polls); busy {} ({} of {} utilization samples, {})",
            self.window,
            self.window_s,
            self.polls,
            pct(self.busy_fraction).unwrap_or_else(|| "unknown".into()),
            self.busy_samples,
            self.util_samples,
            self.util_source
        )?;
        match &self.sm_mhz {
            Some(c) => write!(
                f,
                "; SM clock median {} MHz (p5 {}, p95 {}), spread {:.2}%",
                fmt_num(c.median),
                fmt_num(c.p5),
                fmt_num(c.p95),
                c.spread_pct
            )?,
            None => write!(f, "; SM clock unknown")?,
        }
        if let Some(m) = self.mem_mhz_median {
            write!(f, "; memory clock median {} MHz", fmt_num(m))?;
        }
        if let (Some(p), Some(x)) = (self.power_w_median, self.power_w_max) {
            write!(f, "; power median {} W (max {})", fmt_num(p), fmt_num(x))?;
        }
        if let Some(t) = self.temp_c_max {
            write!(f, "; temperature max {t} C")?;
        }
        let th: Vec<String> = self
            .throttle
            .iter()
            .map(|t| format!("{} {:.1}%", t.name, t.share * 100.0))
            .collect();
        write!(
            f,
            "; throttle reasons: {}",
            if th.is_empty() {
                "none".into()
            } else {
                th.join(", ")
            }
        )?;
        write!(
            f,
            "; persistence {}",
            match self.persistence {
                Some(true) => "Enabled",
                Some(false) => "Disabled",
                None => "unknown",
            }
        )?;
        if let Some(b) = self.peak_gpu_mem_bytes {
            write!(
                f,
                "; peak GPU memory {} MiB ({})",
                b >> 20,
                self.peak_gpu_mem_source
            )?;
        }
        if let Some(b) = self.peak_device_used_bytes {
            write!(f, "; peak device memory used {} MiB", b >> 20)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&v, 0.5), Some(3.0));
        assert_eq!(percentile(&v, 0.05), Some(1.2));
        assert_eq!(percentile(&[], 0.5), None);
    }

    fn poll(t_us: u64, used_mib: u64, leg: Option<Vec<(u32, u64)>>) -> Row {
        let mut row = Row::poll(t_us, "load", Some(1980));
        if let Row::Gpu {
            used_bytes, procs, ..
        } = &mut row
        {
            *used_bytes = Some(used_mib << 20);
            *procs = leg.map(|v| {
                let mem = |(pid, mib): (u32, u64)| super::super::ProcMem {
                    pid,
                    bytes: mib << 20,
                };
                v.into_iter().map(mem).collect()
            });
        }
        row
    }

    #[test]
    fn peak_gpu_memory_is_the_legs_processes_else_the_device_above_its_start() {
        let s = summarize(&[
            poll(1, 500, Some(vec![])),
            poll(2, 9000, Some(vec![(10, 6000), (11, 2000)])),
            poll(3, 7000, Some(vec![(10, 6000)])),
        ]);
        assert_eq!(s.peak_gpu_mem_bytes, Some(8000 << 20));
        assert_eq!(s.peak_gpu_mem_source, "processes");
        // A container: the driver's pids are the host's, none matches the leg.
        let s = summarize(&[poll(1, 500, Some(vec![])), poll(2, 9000, Some(vec![]))]);
        assert_eq!(s.peak_gpu_mem_bytes, Some(8500 << 20));
        assert_eq!(s.peak_gpu_mem_source, "device above its first poll");
    }
}
