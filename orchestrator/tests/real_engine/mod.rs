//! What the tests that run the real engine share: where its release binary is, and what a test
//! does when something it needs is missing.

use std::path::{Path, PathBuf};

/// Says why `what` cannot run and lets the caller return, unless CI=true, where that is a
/// failure.
pub fn skip_or_fail(what: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what} cannot run under CI=true: {why}");
    }
    eprintln!("SKIPPING {what}: {why}");
}

/// The repository's root and its `target/release/engine`, or None where that binary is missing
/// ([`skip_or_fail`] has then said so).
pub fn release_engine(what: &str) -> Option<(PathBuf, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let engine = root.join("target/release/engine");
    if engine.exists() {
        return Some((root.to_path_buf(), engine));
    }
    skip_or_fail(
        what,
        &format!(
            "{} is missing; build it with `cargo build --release -p engine`",
            engine.display()
        ),
    );
    None
}
