//! git, asked from argument vectors: the project root and plain queries.

use std::path::{Path, PathBuf};

/// `git -C root ARGS...`'s trimmed stdout, or None when git fails or is missing.
pub fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The git top-level holding `start`, if any.
pub fn project_root(start: &Path) -> Option<PathBuf> {
    git(start, &["rev-parse", "--show-toplevel"]).map(PathBuf::from)
}
