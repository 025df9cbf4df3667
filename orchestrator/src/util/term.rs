//! Messages on stdout and stderr that survive a closed or broken stream. `println!` and
//! `eprintln!` panic when the write fails (`orchestrator run UNIT 2>&1 >/dev/null | head -12`
//! made a run exit 101 with no record, once `head` had gone); a lost progress line must never
//! cost a measurement, so every line the orchestrator prints goes through these, which drop the
//! text when the stream is gone and carry on. Clippy's `print_stdout` / `print_stderr` lints,
//! denied at the crate roots, keep `println!` and `eprintln!` out.

use std::io::Write;

/// Writes to stderr, ignoring any error (EPIPE, EIO of a closed terminal, ...).
pub fn write_err(args: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(args);
    let _ = e.flush();
}

/// Writes to stdout, ignoring any error; flushed at once, so that the lines of both streams
/// keep their order in a terminal or a shared file.
pub fn write_out(args: std::fmt::Arguments<'_>) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_fmt(args);
    let _ = o.flush();
}

/// `eprintln!` that never panics.
#[macro_export]
macro_rules! sayln {
    () => { $crate::util::term::write_err(format_args!("\n")) };
    ($($t:tt)*) => { $crate::util::term::write_err(format_args!("{}\n", format_args!($($t)*))) };
}

/// `eprint!` that never panics.
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => { $crate::util::term::write_err(format_args!($($t)*)) };
}

/// `println!` that never panics.
#[macro_export]
macro_rules! outln {
    () => { $crate::util::term::write_out(format_args!("\n")) };
    ($($t:tt)*) => { $crate::util::term::write_out(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` that never panics.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::util::term::write_out(format_args!($($t)*)) };
}

pub use crate::{out, outln, say, sayln};
