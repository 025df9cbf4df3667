//! Host memory (RSS) of a leg's whole process tree, polled with sysinfo, and the CPU time a
//! sampler thread costs (so the record can say what watching the leg took from it).

use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// Peak host memory of a leg, as the record's `host_mem` keeps it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct HostMemSummary {
    /// Largest sum of RSS over the leg's process tree seen in one poll, in bytes.
    pub peak_rss_bytes: u64,
    pub samples: u64,
    pub period_ms: u64,
}

/// CPU seconds the calling thread has used (CLOCK_THREAD_CPUTIME_ID): the sampler's own cost.
pub fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec for the duration of the call.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Sum of RSS of `root` and all its descendant processes. sysinfo lists a process's threads as
/// tasks with the process's own memory: they are skipped, or a leg with a hundred threads (vLLM)
/// would read as a hundred times its memory.
pub fn tree_rss(sys: &mut System, root: u32) -> u64 {
    sys.refresh_processes_specifics(
        ProcessesToUpdate::All,
        true,
        ProcessRefreshKind::nothing().with_memory(),
    );
    let procs = sys.processes();
    let root = Pid::from_u32(root);
    let mut total = 0;
    for (pid, p) in procs.iter().filter(|(_, p)| p.thread_kind().is_none()) {
        // Walk up the parent chain; trees are shallow, and the depth bound guards against cycles.
        let mut cur = Some(*pid);
        for _ in 0..64 {
            match cur {
                Some(c) if c == root => {
                    total += p.memory();
                    break;
                }
                Some(c) => cur = procs.get(&c).and_then(|q| q.parent()),
                None => break,
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_cpu_time_grows_with_work() {
        let a = thread_cpu_s();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_s() > a, "no CPU time measured");
    }

    #[test]
    fn sees_its_own_process() {
        let mut sys = System::new();
        assert!(tree_rss(&mut sys, std::process::id()) > 1 << 20);
    }

    #[test]
    fn threads_do_not_multiply_the_process_memory() {
        let mut sys = System::new();
        let alone = tree_rss(&mut sys, std::process::id());
        let stop = std::sync::Arc::new(std::sync::Barrier::new(9));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    stop.wait();
                })
            })
            .collect();
        let with_threads = tree_rss(&mut sys, std::process::id());
        stop.wait();
        threads.into_iter().for_each(|t| t.join().unwrap());
        // Eight more threads add stacks, not eight more copies of the process.
        assert!(
            with_threads < alone * 2,
            "{alone} bytes alone, {with_threads} with 8 threads"
        );
    }
}
