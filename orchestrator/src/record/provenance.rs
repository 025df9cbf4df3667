//! Where a run ran: the project's tree and commit as git sees the files, the engine binary's
//! checksum, and the host (CPU, memory, kernel, boot).

use sha2::{Digest, Sha256};
use std::path::Path;

use super::{HostInfo, ProjectInfo};
use crate::util::git::git;

impl ProjectInfo {
    pub fn read(root: &Path) -> ProjectInfo {
        let head = git(root, &["rev-parse", "HEAD^{tree}"]);
        let tree = working_tree(root).or_else(|| head.clone());
        ProjectInfo {
            root: root.to_path_buf(),
            dirty: head.is_none() || tree != head,
            tree: tree.unwrap_or_else(|| "unknown".into()),
            commit: git(root, &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into()),
        }
    }
}

/// The tree id of the files under `root` as they are (tracked, and untracked but not ignored,
/// less `reports/`), written through a temporary index so that the checkout's own index, HEAD
/// and branches are untouched (the tree objects land in its object store, as `git stash` would
/// put them). A checkout's HEAD alone can name another tree than the one that was built: a copy
/// shipped to a GPU box with a stale `.git`, or uncommitted edits.
fn working_tree(root: &Path) -> Option<String> {
    let index = std::env::temp_dir().join(format!(
        "llm-bench-index-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .env("GIT_INDEX_FILE", &index)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let tree = run(&["read-tree", "HEAD"])
        .and_then(|_| run(&["add", "-A", "--", ".", ":(exclude)reports"]))
        .and_then(|_| run(&["write-tree"]));
    let _ = std::fs::remove_file(&index);
    tree
}

pub fn sha256_file(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).ok()?;
    Some(format!("{:x}", h.finalize()))
}

impl HostInfo {
    pub fn read() -> HostInfo {
        let read = crate::util::procfs::read_trim;
        let cpu_model = crate::util::procfs::cpu_model();
        let mut sys = sysinfo::System::new();
        sys.refresh_memory();
        HostInfo {
            hostname: sysinfo::System::host_name()
                .or_else(|| read("/proc/sys/kernel/hostname"))
                .unwrap_or_else(|| "unknown".into()),
            os: sysinfo::System::long_os_version().unwrap_or_else(|| "unknown".into()),
            kernel: sysinfo::System::kernel_version().unwrap_or_else(|| "unknown".into()),
            cpu_model,
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            memory_bytes: sys.total_memory(),
            boot_id: crate::util::procfs::boot_id(),
            gpu: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_tree_is_of_the_files_as_they_are_not_of_head() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let sh = |args: &[&str]| {
            let ok = std::process::Command::new("git")
                .arg("-C")
                .arg(root)
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "commit.gpgsign=false",
                ])
                .args(args)
                .status()
                .unwrap()
                .success();
            assert!(ok, "git {args:?}");
        };
        sh(&["init", "-q", "."]);
        std::fs::write(root.join("a.rs"), "fn a() {}").unwrap();
        std::fs::write(root.join(".gitignore"), "/target/\n").unwrap();
        sh(&["add", "-A"]);
        sh(&["commit", "-q", "-m", "one"]);
        let clean = ProjectInfo::read(root);
        assert!(!clean.dirty);
        assert_eq!(
            clean.tree,
            git(root, &["rev-parse", "HEAD^{tree}"]).unwrap()
        );
        // Results under reports/ and ignored build outputs are not the code that ran.
        std::fs::create_dir_all(root.join("reports/records")).unwrap();
        std::fs::write(root.join("reports/records/r.json"), "{}").unwrap();
        std::fs::create_dir_all(root.join("target")).unwrap();
        std::fs::write(root.join("target/bin"), "x").unwrap();
        assert_eq!(ProjectInfo::read(root).tree, clean.tree);
        // An edit and a new source file: the tree is the one a commit of them would have, and
        // the checkout's index and HEAD are left as they were.
        std::fs::write(root.join("a.rs"), "fn a() { 1; }").unwrap();
        std::fs::write(root.join("b.rs"), "fn b() {}").unwrap();
        let edited = ProjectInfo::read(root);
        assert!(edited.dirty);
        assert_ne!(edited.tree, clean.tree);
        assert_eq!(edited.commit, git(root, &["rev-parse", "HEAD"]).unwrap());
        assert_eq!(git(root, &["diff", "--cached", "--name-only"]).unwrap(), "");
        assert_eq!(
            git(root, &["status", "--porcelain"]).unwrap(),
            "M a.rs\n?? b.rs\n?? reports/"
        );
        sh(&["add", "a.rs", "b.rs"]);
        sh(&["commit", "-q", "-m", "two"]);
        assert_eq!(
            edited.tree,
            git(root, &["rev-parse", "HEAD^{tree}"]).unwrap()
        );
        assert!(!ProjectInfo::read(root).dirty);
    }
}
