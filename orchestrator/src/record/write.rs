//! Writing a record: files written atomically and never over an existing one (the stem is
//! claimed by record/claim.rs), and the paths of the files beside the record named relative to
//! it.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::Record;
use crate::legs::LegRecord;

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
    /// One line of JSON: indented, a GPU unit's record took three times the bytes (2.8 MB
    /// against 0.86 for tiny-trained's), and every committed record travels with the tree to the
    /// GPU box, whose transfer is bounded. `jq . FILE` reads it indented; `<stem>.md` is the
    /// human copy.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        write_new_atomic(path, &bytes)
    }
}

/// `p` relative to `base` when it lies under it, else unchanged.
pub fn relative(p: &Path, base: &Path) -> PathBuf {
    p.strip_prefix(base)
        .map(Path::to_path_buf)
        .unwrap_or_else(|_| p.to_path_buf())
}

/// The leg as the record keeps it: its log and series files named relative to the record's
/// directory (they lie beside it).
pub fn beside_record(l: &LegRecord, dir: &Path) -> LegRecord {
    let mut l = l.clone();
    l.log = relative(&l.log, dir);
    l.sampler.series = l.sampler.series.map(|p| relative(&p, dir));
    for p in &mut l.prior_starts {
        p.log = relative(&p.log, dir);
        p.sampler.series = p.sampler.series.take().map(|s| relative(&s, dir));
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
