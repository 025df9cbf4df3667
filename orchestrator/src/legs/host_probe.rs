//! The host probe: a fixed single-threaded CPU workload timed just before each leg starts, with
//! the CPU model, the kernel and the load average, so that `compare` can tell a leg that moved
//! with its host (a host-bound oracle on a slower or busier machine) from one that moved with
//! our code. The work is the same on every machine: a dependent pseudo-random walk over a 1 MiB
//! table (integer multiply, shifts, L2-resident loads and stores), whose checksum is recorded
//! so that two probes are known to have done the same work. It is timed `RUNS` times; the
//! fastest run is the figure (the others are kept: their spread is the probe's own noise).

use serde::{Deserialize, Serialize};
use std::time::Instant;

use crate::util::procfs::{self, read_trim};

/// Words in the table (8 bytes each: 1 MiB).
const TABLE: usize = 1 << 17;
/// Steps of the walk per run.
const STEPS: u64 = 6 << 20;
/// Timed runs (the first also warms the table into the cache).
const RUNS: usize = 3;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostProbe {
    /// What was timed, in words.
    pub work: String,
    /// The walk's result: equal on every machine for the same work.
    pub checksum: u64,
    /// Each run's wall time, milliseconds.
    pub ms: Vec<f64>,
    /// The fastest run, milliseconds: the probe's figure.
    pub best_ms: f64,
    pub cpu_model: String,
    pub kernel: String,
    /// /proc/loadavg's one-minute figure as the probe ran (other work on the host).
    pub loadavg_1m: Option<f64>,
}

/// One run of the walk; its checksum.
fn walk(table: &mut [u64]) -> u64 {
    let mask = (table.len() - 1) as u64;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut acc: u64 = 0;
    for _ in 0..STEPS {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        // The next index depends on the last load: a chain the CPU cannot run ahead of.
        let i = ((x >> 33) ^ acc) & mask;
        acc = acc.rotate_left(7) ^ table[i as usize];
        table[i as usize] = x ^ acc;
    }
    acc
}

/// Times the workload here and now, on the calling thread.
pub fn probe() -> HostProbe {
    let mut ms = Vec::with_capacity(RUNS);
    let mut checksum = 0;
    for _ in 0..RUNS {
        // A fresh table each run: every run does the same work from the same state.
        let mut table: Vec<u64> = (0..TABLE as u64).collect();
        let t = Instant::now();
        checksum = std::hint::black_box(walk(std::hint::black_box(&mut table)));
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let cpu_model = procfs::cpu_model();
    HostProbe {
        work: format!(
            "a dependent pseudo-random walk of {STEPS} steps over a {} KiB table, single thread, best of {RUNS}",
            TABLE * 8 / 1024
        ),
        checksum,
        best_ms: ms.iter().copied().fold(f64::INFINITY, f64::min),
        ms,
        cpu_model,
        kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
        loadavg_1m: read_trim("/proc/loadavg")
            .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok())),
    }
}

impl HostProbe {
    /// "host probe 61.2 ms (runs 63.0 / 61.2 / 61.9; load 0.52) on <cpu>, kernel <k>".
    pub fn sentence(&self) -> String {
        let runs: Vec<String> = self.ms.iter().map(|m| format!("{m:.1}")).collect();
        format!(
            "host probe {:.1} ms (runs {} ms{}) on {}, kernel {}",
            self.best_ms,
            runs.join(" / "),
            self.loadavg_1m
                .map(|l| format!("; load average {l:.2}"))
                .unwrap_or_default(),
            self.cpu_model,
            self.kernel
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_does_the_same_work_every_time_and_times_it() {
        let a = probe();
        let b = probe();
        assert_eq!(a.checksum, b.checksum, "the same work on every call");
        assert_eq!(a.ms.len(), RUNS);
        assert!(a.best_ms > 0.0 && a.ms.iter().all(|m| *m >= a.best_ms));
        assert!(a.sentence().starts_with("host probe "), "{}", a.sentence());
    }
}
