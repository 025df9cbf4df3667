//! The run record: one JSON file per run, with a schema version, written atomically and never
//! rewritten. docs/RECORD.md documents every field.

pub mod archive;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::gates::GateResult;
use crate::legs::LegRecord;
use crate::numbers::axes::Axis;
use crate::numbers::timing::Timings;
use crate::unit::UnitFile;
use crate::util::git::git;

pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub schema: u32,
    pub created_utc: String,
    pub orchestrator_version: String,
    /// The orchestrator's own argv.
    pub command: Vec<String>,
    pub unit: UnitInfo,
    pub project: ProjectInfo,
    pub engine_binary: BinaryInfo,
    pub host: HostInfo,
    /// The lease held during the run, and what the idle check said before each leg.
    pub lease: LeaseInfo,
    pub legs: Legs,
    pub timings: LegTimings,
    pub gates: Vec<GateResult>,
    /// The kv gate's resize, in words, when one was done.
    pub kv_resize: Option<String>,
    pub axes: Vec<Axis>,
    /// Each refusal's sentence, as printed under the table.
    pub refusals: Vec<String>,
    /// How much of the per-token ratio a median SM clock offset could explain (both legs
    /// sampled on a GPU), else null.
    #[serde(default)]
    pub clock_explain: Option<crate::gates::clock::ClockExplain>,
    /// The timeline picture (SVG) beside the record.
    #[serde(default)]
    pub timeline: Option<PathBuf>,
    /// The exit status the run ends with (0 all gates passed, 1 refusals, 2 nothing measured).
    pub exit_status: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnitInfo {
    pub name: String,
    pub path: PathBuf,
    pub config: UnitFile,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProjectInfo {
    pub root: PathBuf,
    /// The git tree of the project's files as they were when the run started (tracked files
    /// and untracked ones git does not ignore, less `reports/`, which holds results): what was
    /// built, independent of commit metadata. `HEAD^{tree}` when nothing is uncommitted.
    pub tree: String,
    pub commit: String,
    /// The files differ from `commit`: `tree` is theirs, not the commit's (records written
    /// before this field's meaning was widened, orchestrator 0.2.0, have `HEAD^{tree}` there and
    /// `dirty` for modified tracked files only: their tree then does not describe the binary).
    pub dirty: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BinaryInfo {
    pub path: PathBuf,
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostInfo {
    pub hostname: String,
    pub os: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cores: usize,
    pub memory_bytes: u64,
    pub boot_id: Option<String>,
    /// The leased GPU (index, name, uuid, driver, CUDA, memory) as NVML reports it; null
    /// without one.
    pub gpu: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub target: String,
    pub path: PathBuf,
    pub idle_checks: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Legs {
    pub engine: LegRecord,
    pub oracle: LegRecord,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LegTimings {
    pub engine: Timings,
    pub oracle: Timings,
}

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
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .map(|s| s.trim().to_string())
        };
        let cpu_model = read("/proc/cpuinfo")
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
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

/// `<dir>/<stamp>-<tree8>` with a numeric suffix if a record or log of that stem exists, so two
/// runs in one second never share files.
pub fn choose_stem(dir: &Path, stamp: &str, tree: &str) -> PathBuf {
    let tree8: String = tree.chars().take(8).collect();
    let base = format!("{stamp}-{tree8}");
    for i in 0.. {
        let stem = if i == 0 {
            base.clone()
        } else {
            format!("{base}-{i}")
        };
        let taken = std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten().any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{stem}."))
                })
            })
            .unwrap_or(false);
        if !taken {
            return dir.join(stem);
        }
    }
    unreachable!("the loop returns")
}

/// Writes `bytes` to `path` atomically and never over an existing file: a temporary file in the
/// same directory, fsync, then a hard link to the final name (link fails if the name exists,
/// where rename would silently replace it), unlink the temporary, fsync the directory.
pub fn write_new_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    linked.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            std::io::Error::new(
                e.kind(),
                format!(
                    "{} already exists; records are never rewritten",
                    path.display()
                ),
            )
        } else {
            e
        }
    })?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

impl Record {
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        write_new_atomic(path, &bytes)
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

    #[test]
    fn write_is_new_only_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        write_new_atomic(&p, b"first").unwrap();
        let e = write_new_atomic(&p, b"second").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert!(e.to_string().contains("never rewritten"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"first");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("r.json")]);
    }

    #[test]
    fn stems() {
        let dir = tempfile::tempdir().unwrap();
        let a = choose_stem(dir.path(), "S", "0123456789ab");
        assert_eq!(a.file_name().unwrap(), "S-01234567");
        std::fs::write(a.with_extension("json"), "x").unwrap();
        std::fs::write(dir.path().join("S-01234567.engine.log"), "x").unwrap();
        let b = choose_stem(dir.path(), "S", "0123456789ab");
        assert_eq!(b.file_name().unwrap(), "S-01234567-1");
    }
}
