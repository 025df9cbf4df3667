//! What /proc says about a process (state, group, parent, name, command line) and the machine
//! (its boot id). Linux only, as the lease and the watchdog are.

/// (state, pgid) from /proc/PID/stat; the command name may hold spaces and parentheses, so the
/// fields are read after the last ')'.
pub fn stat_state_pgid(pid: i32) -> Option<(char, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let _ppid = f.next()?;
    let pgid = f.next()?.parse().ok()?;
    Some((state, pgid))
}

/// The parent pid from /proc/PID/stat.
pub fn parent_of(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Alive and not a zombie.
pub fn is_alive(pid: i32) -> bool {
    matches!(stat_state_pgid(pid), Some((s, _)) if s != 'Z' && s != 'X')
}

/// Process ids whose process group is `pgid`, zombies excluded (they hold nothing).
pub fn group_members(pgid: i32) -> Vec<i32> {
    let mut out = vec![];
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Some((state, pg)) = stat_state_pgid(pid) {
            if pg == pgid && state != 'Z' && state != 'X' {
                out.push(pid);
            }
        }
    }
    out.sort_unstable();
    out
}

/// The whole command line, or `[comm]` for a process without one.
pub fn command_line(pid: i32) -> String {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(b) if !b.is_empty() => b
            .split(|&c| c == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
            .join(" "),
        _ => std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| format!("[{}]", s.trim()))
            .unwrap_or_else(|_| "?".into()),
    }
}

/// The process's short name (/proc/PID/comm); "?" for one this namespace cannot see.
pub fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A /proc (or any) file's text, trimmed; none where it cannot be read.
pub fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The kernel's boot id: two legs on different boots are not on a comparable GPU.
pub fn boot_id() -> Option<String> {
    read_trim("/proc/sys/kernel/random/boot_id")
}

/// The host CPU's model name (/proc/cpuinfo), or "unknown".
pub fn cpu_model() -> String {
    read_trim("/proc/cpuinfo")
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_reads_own_group() {
        let me = std::process::id() as i32;
        let (state, pg) = stat_state_pgid(me).unwrap();
        assert_ne!(state, 'Z');
        // SAFETY: getpgrp cannot fail.
        assert_eq!(pg, unsafe { libc::getpgrp() });
        assert!(group_members(pg).contains(&me));
        assert!(command_line(me).contains("orchestrator"));
    }
}
