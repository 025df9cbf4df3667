//! Children tied to the orchestrator's life (Linux). Every process the orchestrator starts (the
//! legs, the job of `lease -- CMD`, `python -m oracle check`) is started through [`tie`]:
//! - `PR_SET_PDEATHSIG` = SIGKILL, set in the child between fork and exec, so the kernel kills
//!   it when the orchestrator dies, however it dies (`kill -9` included). The signal fires when
//!   the *thread* that forked the child exits, so children are started from the main thread
//!   (the runtime of `run` is single-threaded). If the orchestrator died before the child set
//!   it, the child sees a new parent and kills itself before exec.
//! - optionally one file descriptor kept open across exec: the lease's lock file, so that the
//!   lock (flock belongs to the open file) is held until the child is gone too, not only the
//!   orchestrator.
//!
//! A child in a process group of its own gets a [`GroupGuard`] as well: a tiny `sh` that holds
//! the read end of a pipe from the orchestrator and kills the whole group with SIGKILL when the
//! pipe closes without a word, i.e. when the orchestrator died, so that grandchildren (a shell's
//! job, vLLM's workers) die with it too. On a normal end the orchestrator says "done" and the
//! guard exits without killing anything.

use std::io::Write;
use std::os::fd::RawFd;
use std::process::{Child, ChildStdin, Stdio};

/// The hook run in the child before exec: the parent-death signal, the check that the parent
/// is still the one that forked it, and `keep_fd` made inheritable. Only async-signal-safe calls.
fn hook(keep_fd: Option<RawFd>) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    move || {
        // SAFETY: prctl, getppid, fcntl and raise are async-signal-safe and touch only this
        // (forked, single-threaded) child.
        unsafe {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                // The orchestrator died before the signal was armed: do not start orphaned.
                libc::raise(libc::SIGKILL);
            }
            if let Some(fd) = keep_fd {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

/// Ties a child started by `cmd` to the orchestrator's life (module docs).
pub fn tie(cmd: &mut std::process::Command, keep_fd: Option<RawFd>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook only makes async-signal-safe calls (see `hook`).
    unsafe {
        cmd.pre_exec(hook(keep_fd));
    }
}

/// [`tie`] for a tokio command.
pub fn tie_async(cmd: &mut tokio::process::Command, keep_fd: Option<RawFd>) {
    // SAFETY: as for `tie`.
    unsafe {
        cmd.pre_exec(hook(keep_fd));
    }
}

/// The guard's script: wait for a line; anything but "done" (end of input: the orchestrator is
/// gone) kills the group. `kill -KILL -PGID` is POSIX sh (dash and bash alike).
const GUARD_SCRIPT: &str =
    r#"read -r word; [ "$word" = done ] || kill -KILL -"$1" 2>/dev/null; exit 0"#;

/// A watcher that kills process group `pgid` if the orchestrator dies before [`release`].
///
/// [`release`]: GroupGuard::release
pub struct GroupGuard {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
}

impl GroupGuard {
    /// Starts the guard of `pgid`. It runs in a group of its own, so that a Ctrl-C meant for the
    /// orchestrator does not take the guard with it.
    pub fn start(pgid: i32) -> std::io::Result<GroupGuard> {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", GUARD_SCRIPT, "llm-bench-guard", &pgid.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(GroupGuard {
            child: Some(child),
            stdin,
        })
    }

    /// The group ended normally: the guard exits without killing anything.
    pub fn release(mut self) {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.write_all(b"done\n");
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Kills the group now through the guard (its pipe closes without "done").
    pub fn fire(mut self) {
        drop(self.stdin.take());
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for GroupGuard {
    /// Dropped unreleased (a leg abandoned on an interrupt): the group is killed.
    fn drop(&mut self) {
        drop(self.stdin.take());
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::procfs::is_alive;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    fn gone_within(pid: i32, limit: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < limit {
            // A zombie is gone for every purpose here; reap it if it is ours.
            // SAFETY: waitpid with WNOHANG on a pid; no memory is passed but the status.
            unsafe {
                let mut st = 0;
                libc::waitpid(pid, &mut st, libc::WNOHANG);
            }
            if !is_alive(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn a_guard_kills_its_group_when_dropped_and_spares_it_when_released() {
        let spawn = || {
            std::process::Command::new("/bin/sh")
                .args(["-c", "sleep 30 & sleep 30; wait"])
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let mut c = spawn();
        let pgid = c.id() as i32;
        std::thread::sleep(Duration::from_millis(100));
        let members = crate::util::procfs::group_members(pgid);
        assert!(members.len() >= 2, "{members:?}");
        drop(GroupGuard::start(pgid).unwrap());
        let _ = c.wait();
        for p in members {
            assert!(
                gone_within(p, Duration::from_secs(5)),
                "pid {p} outlived its guard"
            );
        }

        let mut c = spawn();
        let pgid = c.id() as i32;
        GroupGuard::start(pgid).unwrap().release();
        std::thread::sleep(Duration::from_millis(100));
        assert!(is_alive(pgid), "a released guard killed the group");
        // SAFETY: killpg on a group this test started.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
        let _ = c.wait();
        assert!(gone_within(pgid, Duration::from_secs(5)));
    }
}
