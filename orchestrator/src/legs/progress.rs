//! Progress on stderr: one line per phase with its elapsed time, and a counter where the phase
//! has a known length. On a terminal the counter redraws in place; in a log it is one line per
//! quarter, so a 10-minute run shows where it is without flooding the file.

use crate::util::term::{say, sayln};
use std::io::{IsTerminal, Write};
use std::time::Instant;

pub struct Progress {
    label: String,
    start: Instant,
    total: usize,
    done: usize,
    tty: bool,
    last_quarter: usize,
    quiet: bool,
}

impl Progress {
    pub fn start(leg: &str, phase: &str, total: usize, quiet: bool) -> Progress {
        let label = format!("[{leg}] {phase}");
        let tty = std::io::stderr().is_terminal();
        if !quiet {
            if total > 0 {
                sayln!("{label}: started, {total} prompt(s) to run");
            } else {
                sayln!("{label}: started");
            }
        }
        Progress {
            label,
            start: Instant::now(),
            total,
            done: 0,
            tty,
            last_quarter: 0,
            quiet,
        }
    }

    pub fn tick(&mut self, n: usize) {
        self.done += n;
        if self.quiet || self.total == 0 {
            return;
        }
        let el = self.start.elapsed().as_secs_f64();
        if self.tty {
            let width = 30;
            let filled = (self.done * width / self.total).min(width);
            say!(
                "\r{}: [{}{}] {}/{} prompts, {:.1} s ",
                self.label,
                "#".repeat(filled),
                " ".repeat(width - filled),
                self.done,
                self.total,
                el
            );
            let _ = std::io::stderr().flush();
        } else {
            let q = self.done * 4 / self.total;
            if q > self.last_quarter && self.done < self.total {
                self.last_quarter = q;
                sayln!(
                    "{}: {}/{} prompts, {:.1} s",
                    self.label,
                    self.done,
                    self.total,
                    el
                );
            }
        }
    }

    pub fn finish(self, outcome: &str) -> f64 {
        let el = self.start.elapsed().as_secs_f64();
        if !self.quiet {
            if self.tty && self.total > 0 {
                sayln!();
            }
            if self.total > 0 {
                sayln!(
                    "{}: {outcome} in {el:.1} s ({}/{} prompts)",
                    self.label,
                    self.done,
                    self.total
                );
            } else {
                sayln!("{}: {outcome} in {el:.1} s", self.label);
            }
        }
        el
    }
}
