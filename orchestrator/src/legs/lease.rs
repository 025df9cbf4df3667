//! The lease: an exclusive `flock` per GPU (or one "cpu" lease on a machine without one) in a
//! lock directory. flock belongs to the open file, so the kernel drops it when the holder dies,
//! however it dies; no stale lock file can block the next run. The holder writes who it is into
//! the file so a waiter can say whom it waits for.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use crate::util::term::sayln;
use crate::util::{child, interrupt};

/// What is leased: a GPU index, or the CPU on a machine without a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseTarget {
    Gpu(u32),
    Cpu,
}

impl LeaseTarget {
    pub fn name(&self) -> String {
        match self {
            LeaseTarget::Gpu(n) => format!("gpu{n}"),
            LeaseTarget::Cpu => "cpu".into(),
        }
    }

    /// The explicit GPU if given; else the machine's first GPU if it has one; else the CPU.
    pub fn choose(gpu: Option<u32>) -> LeaseTarget {
        match gpu {
            Some(n) => LeaseTarget::Gpu(n),
            None if Path::new("/dev/nvidia0").exists() => LeaseTarget::Gpu(0),
            None => LeaseTarget::Cpu,
        }
    }
}

#[derive(Debug)]
pub enum LeaseError {
    /// --no-wait and someone holds it.
    Busy {
        target: String,
        path: PathBuf,
        holder: String,
    },
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// SIGINT, SIGTERM or SIGHUP while waiting for it.
    Interrupted {
        target: String,
        signal: &'static str,
    },
}

impl std::fmt::Display for LeaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseError::Busy { target, path, holder } => write!(
                f,
                "the {target} lease ({}) is held by {holder}; not waiting because of --no-wait. Retry when it finishes, or drop --no-wait to queue behind it",
                path.display()
            ),
            LeaseError::Interrupted { target, signal } => write!(
                f,
                "interrupted by {signal} while waiting for the {target} lease; nothing was run"
            ),
            LeaseError::Io { path, error } => write!(
                f,
                "cannot open or lock {} ({error}); pass --lock-dir (or [lease] lock_dir) a writable directory",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LeaseError {}

/// A held lease; dropping it (or dying) releases it.
#[derive(Debug)]
pub struct Lease {
    pub target: LeaseTarget,
    pub path: PathBuf,
    _file: File,
}

/// flock, retried when a signal interrupts it, unless that signal is one the run stops on
/// (util/interrupt.rs): then Err(Interrupted).
fn flock(file: &File, op: libc::c_int) -> std::io::Result<()> {
    loop {
        // SAFETY: the fd is owned by `file` and open for the duration of the call.
        let r = unsafe { libc::flock(file.as_raw_fd(), op) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted || interrupt::pending().is_some() {
            return Err(e);
        }
    }
}

fn describe_holder(file: &mut File) -> String {
    let mut s = String::new();
    let _ = file.seek(SeekFrom::Start(0));
    let _ = file.read_to_string(&mut s);
    let s = s.trim();
    if s.is_empty() {
        "another process (it has not written its name yet)".into()
    } else {
        s.lines().collect::<Vec<_>>().join(", ")
    }
}

impl Lease {
    /// Takes the lease. With `wait`, blocks until it is free, saying once on stderr whom it waits
    /// for; without, fails at once naming the holder. `what` (a unit name or a command) is
    /// written into the lock file for the next waiter to read.
    pub fn acquire(
        target: LeaseTarget,
        lock_dir: &Path,
        wait: bool,
        what: &str,
        quiet: bool,
    ) -> Result<Lease, LeaseError> {
        let path = lock_dir.join(format!("{}.lock", target.name()));
        let io = |error| LeaseError::Io {
            path: path.clone(),
            error,
        };
        std::fs::create_dir_all(lock_dir).map_err(io)?;
        // Never truncate on open: the holder's description must survive a waiter opening the file.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                let holder = describe_holder(&mut file);
                if !wait {
                    return Err(LeaseError::Busy {
                        target: target.name(),
                        path,
                        holder,
                    });
                }
                if !quiet {
                    sayln!(
                        "[lease] waiting for the {} lease ({}), held by {holder}",
                        target.name(),
                        path.display()
                    );
                }
                let t = std::time::Instant::now();
                flock(&file, libc::LOCK_EX).map_err(|e| match interrupt::pending() {
                    Some(signal) => LeaseError::Interrupted {
                        target: target.name(),
                        signal,
                    },
                    None => io(e),
                })?;
                if !quiet {
                    sayln!(
                        "[lease] got the {} lease after {:.1} s",
                        target.name(),
                        t.elapsed().as_secs_f64()
                    );
                }
            }
            Err(e) => return Err(io(e)),
        }
        let info = format!(
            "pid {}\nfor {what}\nsince {}\n",
            std::process::id(),
            crate::util::time::utc_now_iso()
        );
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(info.as_bytes()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(Lease {
            target,
            path,
            _file: file,
        })
    }

    /// The lock file's descriptor, for a child that must hold the lease as long as it lives
    /// (util/child.rs `tie`).
    pub fn fd(&self) -> std::os::fd::RawFd {
        self._file.as_raw_fd()
    }
}

/// What runs under the lease before each leg (and before a `lease` job). The idle gate
/// (gates/idle.rs) implements it with NVML: no compute process on the GPU, memory used under
/// `[lease] idle_max_used_mib`; its Err is the whole refusal sentence naming the processes.
pub trait IdleCheck {
    fn check(&self, lease: &Lease) -> Result<String, String>;
}

/// `orchestrator lease -- CMD ARGS...`: runs any job under the lease and the idle check; the
/// job's exit status is passed through (128 + signal when it was killed), 2 when it never ran.
///
/// The job runs in a process group of its own, tied to the orchestrator (util/child.rs): if
/// the orchestrator dies, the job's whole group is killed, and the job holds the lock file open,
/// so the lease stays held until the job is gone too. SIGINT, SIGTERM and SIGHUP are passed on
/// to the job's group; whatever of the group outlives the job's own process is named and killed.
pub fn run_job(
    target: LeaseTarget,
    lock_dir: &Path,
    wait: bool,
    argv: &[String],
    idle: &dyn IdleCheck,
) -> i32 {
    let Some(program) = argv.first() else {
        sayln!("orchestrator lease: no command given; usage: orchestrator lease [--gpu N] -- CMD ARGS...");
        return 2;
    };
    interrupt::install();
    let lease = match Lease::acquire(
        target,
        lock_dir,
        wait,
        &format!("orchestrator lease -- {}", argv.join(" ")),
        false,
    ) {
        Ok(l) => l,
        Err(e) => {
            sayln!("orchestrator lease: {e}");
            return 2;
        }
    };
    match idle.check(&lease) {
        Ok(s) => sayln!("[lease] idle check: {s}"),
        Err(s) => {
            sayln!("orchestrator lease: the idle check refused to start the job: {s}");
            return 2;
        }
    }
    if let Some(sig) = interrupt::pending() {
        sayln!("orchestrator lease: interrupted by {sig} before the job started; nothing was run");
        return 2;
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(&argv[1..]).process_group(0);
    child::tie(&mut cmd, Some(lease.fd()));
    let job = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            sayln!("orchestrator lease: cannot run {program:?} ({e})");
            return 2;
        }
    };
    wait_job(job)
}

/// Waits for the job, passing signals on to its group; then kills what is left of the group.
fn wait_job(mut job: std::process::Child) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    let pgid = job.id() as i32;
    let guard = child::GroupGuard::start(pgid).ok();
    let mut forwarded = false;
    let status = loop {
        match job.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) => {}
            Err(_) => break None,
        }
        if let (false, Some(sig)) = (forwarded, interrupt::pending_number()) {
            sayln!(
                "[lease] {}: passed on to the job's process group {pgid}",
                interrupt::name(sig)
            );
            crate::legs::watchdog::signal_group(pgid, sig);
            forwarded = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let left = crate::util::procfs::group_members(pgid);
    if !left.is_empty() {
        for p in &left {
            sayln!(
                "[lease] pid {p} ({}) outlived the job; killed",
                crate::util::procfs::command_line(*p)
            );
        }
        crate::legs::watchdog::signal_group(pgid, libc::SIGKILL);
    }
    if let Some(g) = guard {
        g.release();
    }
    match status {
        Some(st) => st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)),
        None => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_taker_fails_naming_the_holder_then_gets_it_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let a = Lease::acquire(LeaseTarget::Gpu(3), dir.path(), false, "unit A", true).unwrap();
        let e = Lease::acquire(LeaseTarget::Gpu(3), dir.path(), false, "unit B", true).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("gpu3"), "{msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("unit A"), "{msg}");
        assert!(msg.contains("--no-wait"), "{msg}");
        // Another GPU is another lease.
        let _c = Lease::acquire(LeaseTarget::Gpu(4), dir.path(), false, "unit C", true).unwrap();
        drop(a);
        let b = Lease::acquire(LeaseTarget::Gpu(3), dir.path(), false, "unit B", true).unwrap();
        let text = std::fs::read_to_string(&b.path).unwrap();
        assert!(text.contains("for unit B"), "{text}");
    }
}
