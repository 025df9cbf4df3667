//! What the tests that run the real engine from a script share.

use std::path::{Path, PathBuf};

/// The repository's root and its `target/release/engine`, or None where that binary is missing:
/// the test then says why and returns, unless CI=true, where that is a failure (`what` names
/// the test in both messages).
pub fn release_engine(what: &str) -> Option<(PathBuf, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let engine = root.join("target/release/engine");
    if engine.exists() {
        return Some((root.to_path_buf(), engine));
    }
    let why = format!(
        "{} is missing; build it with `cargo build --release -p engine`",
        engine.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what} cannot run under CI=true: {why}");
    }
    eprintln!("SKIPPING {what}: {why}");
    None
}
