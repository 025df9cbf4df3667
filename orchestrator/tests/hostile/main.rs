//! The hostile suite (issue 16): a careless or unlucky user, played with a fixed seed. It
//! mutates unit files and their data files and runs `check` (and `run`, over the fake legs of
//! tests/fake_leg.py) on them; sends SIGINT, SIGTERM, SIGHUP and SIGKILL to runs at random
//! moments; runs several runs of one unit at once; fuzzes the leg protocol (requests to the real
//! `engine serve` and to the oracle's parser, events from a fake leg to the orchestrator) and
//! the engine's loader (mutated config.json and safetensors). It prints its counts: attempts,
//! named errors, panics, hangs, torn or lost records, orphaned processes. The last four (and
//! errors that name no cause) must be 0.
//!
//! One command: `scripts/hostile` (= `cargo test -p orchestrator --test hostile -- --nocapture`);
//! `LLM_BENCH_HOSTILE_SEED` picks another seed. The engine parts need `target/release/engine`
//! (`cargo build --release -p engine`; under CI=true its absence is a failure).

#[path = "../common/mod.rs"]
mod common;
mod loader;
mod protocol;
mod signals;
mod tally;
mod units;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tally::{End, Ran, Tally};

pub const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

/// splitmix64: the suite's only source of chance, so a seed replays every attempt.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

pub fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `target/release/engine`, or None (with the reason said once), or a failure under CI=true.
pub fn engine_binary() -> Option<PathBuf> {
    let p = root().join("target/release/engine");
    if p.exists() {
        return Some(p);
    }
    let why = format!(
        "{} is missing; `cargo build --release -p engine`",
        p.display()
    );
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true"),
        "the hostile suite's engine parts cannot run under CI=true: {why}"
    );
    eprintln!("hostile suite: SKIPPING the engine's protocol and loader fuzzing: {why}");
    None
}

/// How an `orchestrator check` or `run` ended: exit 0 or 1 is accepted (a run must then have
/// written its record), exit 2 must say why.
pub fn judge_orchestrator(r: &Ran) -> End {
    if let Some(c) = r.crashed() {
        return End::Panic(c);
    }
    let Some(st) = r.status else {
        return End::Hang(clip(&r.text(), 300));
    };
    match st.code() {
        Some(0) | Some(1) => End::Accepted,
        Some(2) => {
            // A record of legs that failed names each failure; else a FAIL line or a message.
            let said = r.stdout.contains("\nrecord: ")
                || r.text().lines().any(|l| {
                    (l.starts_with("FAIL ")
                        || l.starts_with("orchestrator: ")
                        || l.starts_with("  "))
                        && l.len() > 20
                });
            if said {
                End::Named
            } else {
                End::Unnamed(clip(&r.text(), 300))
            }
        }
        _ => End::Unnamed(format!("exit {st}: {}", clip(&r.text(), 300))),
    }
}

/// A run that exited 0 or 1, or said its record keeps what was measured, wrote that record.
pub fn check_recorded(t: &mut Tally, area: &str, r: &Ran, before: usize, after: &[PathBuf]) {
    let kept = r.stderr.contains("keeps what was measured");
    if matches!(r.code(), Some(0) | Some(1)) || kept {
        if after.len() != before + 1 {
            t.torn(
                area,
                format!(
                    "exit {:?} but {} record(s) written: {}",
                    r.code(),
                    after.len() - before.min(after.len()),
                    clip(&r.text(), 200)
                ),
            );
        }
        if let Some(p) = r.stdout.lines().find_map(|l| l.strip_prefix("record: ")) {
            if !Path::new(p.trim()).exists() {
                t.torn(area, format!("{p} was announced but is not there"));
            }
        }
    }
}

/// A command of the orchestrator with the suite's marker in its environment.
pub fn orchestrator(marker: &str) -> Command {
    let mut c = Command::new(BIN);
    c.env("LLM_BENCH_TEST_MARK", marker)
        .stdin(std::process::Stdio::null());
    c
}

#[test]
fn hostile_suite() {
    let seed = std::env::var("LLM_BENCH_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let start = Instant::now();
    let mut rng = Rng::new(seed);
    let mut t = Tally::default();
    units::run(&mut rng, &mut t);
    signals::run(&mut rng, &mut t);
    signals::concurrent(&mut rng, &mut t);
    protocol::run(&mut rng, &mut t);
    loader::run(&mut rng, &mut t);
    let report = t.report(seed, start.elapsed().as_secs_f64());
    println!("{report}");
    let out = root().join("target/hostile-report.txt");
    let _ = std::fs::write(&out, &report);
    assert!(t.attempts > 500, "too few attempts: {report}");
    assert_eq!(
        (t.unnamed, t.panics, t.hangs, t.torn_or_lost, t.orphans),
        (0, 0, 0, 0, 0),
        "{report}"
    );
}
