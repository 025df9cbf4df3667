//! A run's stem, claimed before any file of it is written and held until its record is on disk
//! (or the run ends without one). The claim is `.<stem>.claim` beside the records, locked with
//! flock by the run that owns it: it appears already locked (created under a temporary name,
//! locked, then hard-linked into place, which fails if another run linked it first), so two runs
//! in the same second, on different leases or different machines sharing the directory, can
//! never take one stem, and no run writes over another's logs or record.
//!
//! What a run leaves without a record (interrupted with nothing measured, killed, a record that
//! could not be written) is moved into `.unrecorded/` beside the records: `report` and git
//! ignore it, and its logs are kept for whoever wants to know what happened. A run that died
//! without cleaning up is swept by the next claim in the directory: its claim is no longer
//! locked, so its files go to `.unrecorded/` and its claim is removed; the temporaries of a
//! process no longer alive (`.<name>.<pid>.tmp`) are deleted.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::util::term::sayln;

/// Where files of runs without a record go, under the unit's records directory.
pub const UNRECORDED: &str = ".unrecorded";

/// A held claim on `<dir>/<stem>`; dropping it removes the claim file.
#[derive(Debug)]
pub struct Claim {
    dir: PathBuf,
    stem: String,
    path: PathBuf,
    _file: File,
}

fn try_lock(f: &File) -> bool {
    // SAFETY: flock on a descriptor owned by `f`.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

fn names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether any file of `stem` (`<stem>.*`) or its claim exists.
fn taken(names: &[String], stem: &str) -> bool {
    let (files, claim) = (format!("{stem}."), format!(".{stem}.claim"));
    names.iter().any(|n| n.starts_with(&files) || *n == claim)
}

impl Claim {
    /// Claims `<stamp>-<tree8>`, or the first free `<stamp>-<tree8>-N`, after sweeping what
    /// dead runs left in `dir` (said on stderr unless `quiet`). Returns the claim and what the
    /// sweep did, in words.
    pub fn take(
        dir: &Path,
        stamp: &str,
        tree: &str,
        quiet: bool,
    ) -> std::io::Result<(Claim, Vec<String>)> {
        let swept = sweep(dir);
        if !quiet {
            swept.iter().for_each(|s| sayln!("[record] {s}"));
        }
        let tree8: String = tree.chars().take(8).collect();
        let base = format!("{stamp}-{tree8}");
        let tmp = dir.join(format!(".claim.{}.tmp", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        let locked = try_lock(&file);
        let result = (|| {
            if !locked {
                return Err(std::io::Error::other("cannot lock a new claim file"));
            }
            for i in 0u32.. {
                let stem = if i == 0 {
                    base.clone()
                } else {
                    format!("{base}-{i}")
                };
                if taken(&names(dir), &stem) {
                    continue;
                }
                let path = dir.join(format!(".{stem}.claim"));
                match std::fs::hard_link(&tmp, &path) {
                    Ok(()) => return Ok((stem, path)),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(e),
                }
            }
            unreachable!("the loop returns")
        })();
        let _ = std::fs::remove_file(&tmp);
        let (stem, path) = result?;
        Ok((
            Claim {
                dir: dir.to_path_buf(),
                stem,
                path,
                _file: file,
            },
            swept,
        ))
    }

    /// `<dir>/<stem>`: the files of the run are this plus `.json`, `.md`, `.<leg>.log`, ...
    pub fn stem(&self) -> PathBuf {
        self.dir.join(&self.stem)
    }

    /// The run ends without a record: its files go to `.unrecorded/`. Returns where, if any
    /// file was moved.
    pub fn discard(self) -> Option<PathBuf> {
        move_stem(&self.dir, &self.stem).then(|| self.dir.join(UNRECORDED))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Moves every `<stem>.*` file of `dir` into `dir/.unrecorded/`; true if one was moved.
fn move_stem(dir: &Path, stem: &str) -> bool {
    let prefix = format!("{stem}.");
    let to = dir.join(UNRECORDED);
    let mut moved = false;
    for n in names(dir).into_iter().filter(|n| n.starts_with(&prefix)) {
        if std::fs::create_dir_all(&to).is_ok()
            && std::fs::rename(dir.join(&n), to.join(&n)).is_ok()
        {
            moved = true;
        }
    }
    moved
}

/// What dead runs left in `dir`: stems whose claim is no longer held (or that have files and
/// no claim, as runs before claims left them) and no record go to `.unrecorded/`; their claims
/// and the temporaries of dead processes are removed. Returns one sentence per thing done.
pub fn sweep(dir: &Path) -> Vec<String> {
    let all = names(dir);
    let mut done = vec![];
    let mut stems: Vec<String> = vec![];
    for n in &all {
        if let Some(stem) = n.strip_prefix('.').and_then(|s| s.strip_suffix(".claim")) {
            let p = dir.join(n);
            let dead = File::open(&p).map(|f| try_lock(&f)).unwrap_or(false);
            if dead {
                let _ = std::fs::remove_file(&p);
                stems.push(stem.to_string());
            }
        } else if let Some(pid) = n
            .strip_prefix('.')
            .and_then(|s| s.strip_suffix(".tmp"))
            .and_then(|s| s.rsplit('.').next())
            .and_then(|p| p.parse::<i32>().ok())
        {
            if !crate::util::procfs::is_alive(pid) && std::fs::remove_file(dir.join(n)).is_ok() {
                done.push(format!(
                    "removed {n}, a temporary of process {pid}, which is gone"
                ));
            }
        } else if let Some(stem) = n.strip_suffix(".log").and_then(|s| s.split('.').next()) {
            // A leg's log of a stem with neither record nor claim: a run from before claims.
            let claimed = all.contains(&format!(".{stem}.claim"));
            if !claimed && !stems.iter().any(|s| s == stem) {
                stems.push(stem.to_string());
            }
        }
    }
    for stem in stems {
        if all.contains(&format!("{stem}.json")) {
            continue; // its record was written; only the claim was left
        }
        if move_stem(dir, &stem) {
            done.push(format!(
                "moved the files of {stem}, a run that ended without a record, to {}/",
                dir.join(UNRECORDED).display()
            ));
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_stem_is_never_given_twice_and_dead_runs_are_swept() {
        let d = tempfile::tempdir().unwrap();
        let (a, _) = Claim::take(d.path(), "S", "0123456789ab", true).unwrap();
        assert_eq!(a.stem().file_name().unwrap(), "S-01234567");
        // Held: the next run in the same second gets the next stem, and sweeps nothing.
        let (b, swept) = Claim::take(d.path(), "S", "0123456789ab", true).unwrap();
        assert_eq!(b.stem().file_name().unwrap(), "S-01234567-1");
        assert!(swept.is_empty(), "{swept:?}");
        std::fs::write(d.path().join("S-01234567.engine.log"), "x").unwrap();
        std::fs::write(d.path().join("S-01234567-1.engine.log"), "y").unwrap();
        std::fs::write(d.path().join("S-01234567-1.json"), "{}").unwrap();
        // A dead run: its claim file unlocked (the lock went with its process).
        std::mem::forget(b);
        let dead_claim = d.path().join(".S-01234567-1.claim");
        assert!(dead_claim.exists());
        drop(a);
        assert!(!d.path().join(".S-01234567.claim").exists());
        // S-01234567: logs, no record, no claim -> unrecorded; S-01234567-1: record, stale claim.
        std::fs::write(d.path().join(".x.json.999999999.tmp"), "").unwrap();
        let swept = sweep(d.path());
        assert_eq!(swept.len(), 2, "{swept:?}");
        assert!(d.path().join(".unrecorded/S-01234567.engine.log").exists());
        assert!(d.path().join("S-01234567-1.engine.log").exists());
        assert!(!d.path().join(".x.json.999999999.tmp").exists());
        // The leaked descriptor still holds the lock in this process; its claim stays.
        assert!(dead_claim.exists());
    }

    #[test]
    fn a_discarded_run_leaves_its_files_in_unrecorded() {
        let d = tempfile::tempdir().unwrap();
        let (c, _) = Claim::take(d.path(), "S", "ab", true).unwrap();
        std::fs::write(d.path().join("S-ab.oracle.log"), "log").unwrap();
        let to = c.discard().unwrap();
        assert_eq!(to, d.path().join(".unrecorded"));
        assert_eq!(
            std::fs::read_to_string(to.join("S-ab.oracle.log")).unwrap(),
            "log"
        );
        assert_eq!(names(d.path()), vec![".unrecorded".to_string()]);
    }
}
