//! SIGINT, SIGTERM and SIGHUP while `run` or `lease` is working. The handler only records the
//! signal; each phase looks at [`pending`] where it can stop cleanly (between preflight checks,
//! while waiting for the lease or a child, between legs) and ends the run with a message, its
//! children killed, exit status 2, and a record if something was measured. A second signal
//! while the first is being handled ends the process at once (exit 2): the children die with it
//! (util/child.rs), and a record being written is atomic, so nothing is torn. Once a run's
//! record is written and its summary printed ([`finishing`]), a signal ends the process at once.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

static PENDING: AtomicI32 = AtomicI32::new(0);
static FINISHING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    if FINISHING.load(Ordering::SeqCst) {
        let said: &[u8] = match sig {
            libc::SIGINT => {
                b"orchestrator: interrupted by SIGINT after the record was written; exit status 2\n"
            }
            libc::SIGTERM => {
                b"orchestrator: interrupted by SIGTERM after the record was written; exit status 2\n"
            }
            _ => b"orchestrator: interrupted by SIGHUP after the record was written; exit status 2\n",
        };
        // SAFETY: write and _exit are async-signal-safe; the buffers are static.
        unsafe {
            libc::write(2, said.as_ptr().cast(), said.len());
            libc::_exit(2);
        }
    }
    if PENDING.swap(sig, Ordering::SeqCst) != 0 {
        const SAID: &[u8] = b"orchestrator: interrupted again; exiting at once (exit 2)\n";
        // SAFETY: write and _exit are async-signal-safe; the buffer is static.
        unsafe {
            libc::write(2, SAID.as_ptr().cast(), SAID.len());
            libc::_exit(2);
        }
    }
}

/// The signals handled.
pub const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Installs the handler for [`SIGNALS`], without SA_RESTART so that a blocking wait (the
/// lease's flock) returns EINTR and sees the signal.
pub fn install() {
    for sig in SIGNALS {
        // SAFETY: a zeroed sigaction with a plain handler and an empty mask is valid; the
        // handler only touches an atomic and calls _exit.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// From here on a signal ends the process at once, exit 2, with a line saying the record was
/// already written. Called once a run's outcome is settled and before its last look at
/// [`pending`], so that no signal falls between that look and the exit unheeded.
pub fn finishing() {
    FINISHING.store(true, Ordering::SeqCst);
}

/// The name of the signal received, if one was.
pub fn pending() -> Option<&'static str> {
    pending_number().map(name)
}

/// The number of the signal received, if one was (to pass it on to a child).
pub fn pending_number() -> Option<libc::c_int> {
    match PENDING.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

pub fn name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// Resolves with the signal's name once one is pending.
pub async fn wait() -> &'static str {
    loop {
        if let Some(s) = pending() {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
