//! What the hostile suite counts, how one attempt's ending is classified, and how a process is
//! run, timed out, and checked for what it left behind.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// It worked (a run with a record, a request answered, a checkpoint loaded), or it was
    /// ended from outside (SIGKILL).
    Accepted,
    /// Refused with an error that names the cause.
    Named,
    /// Refused without saying why (exit 2 and nothing said, a leg that died silently).
    Unnamed(String),
    /// A panic, an abort or a crash by signal.
    Panic(String),
    /// No answer within the attempt's bound.
    Hang(String),
}

#[derive(Default)]
pub struct Tally {
    pub attempts: usize,
    pub accepted: usize,
    pub named: usize,
    pub unnamed: usize,
    pub panics: usize,
    pub hangs: usize,
    pub torn_or_lost: usize,
    pub orphans: usize,
    pub per_area: BTreeMap<&'static str, usize>,
    /// The first few of every bad kind, to say what to fix.
    pub examples: Vec<String>,
}

impl Tally {
    pub fn add(&mut self, area: &'static str, what: &str, end: End) {
        self.attempts += 1;
        *self.per_area.entry(area).or_default() += 1;
        let bad = |kind: &str, why: &str| format!("{kind} in {area} ({what}): {why}");
        match end {
            End::Accepted => self.accepted += 1,
            End::Named => self.named += 1,
            End::Unnamed(w) => {
                self.unnamed += 1;
                self.example(bad("unnamed error", &w));
            }
            End::Panic(w) => {
                self.panics += 1;
                self.example(bad("panic", &w));
            }
            End::Hang(w) => {
                self.hangs += 1;
                self.example(bad("hang", &w));
            }
        }
    }

    pub fn torn(&mut self, area: &str, why: String) {
        self.torn_or_lost += 1;
        self.example(format!("torn or lost record in {area}: {why}"));
    }

    pub fn orphaned(&mut self, area: &str, pids: &[String]) {
        self.orphans += pids.len();
        self.example(format!("orphaned in {area}: {pids:?}"));
    }

    fn example(&mut self, s: String) {
        if self.examples.len() < 40 {
            self.examples.push(crate::clip(&s, 600));
        }
    }

    pub fn report(&self, seed: u64, secs: f64) -> String {
        let areas: Vec<String> = self
            .per_area
            .iter()
            .map(|(a, n)| format!("{a} {n}"))
            .collect();
        let mut s = format!(
            "hostile suite, seed {seed}, {secs:.0} s: attempts {} ({}); accepted {}, named errors {}, unnamed errors {}, panics {}, hangs {}, torn or lost records {}, orphaned processes {}\n",
            self.attempts,
            areas.join(", "),
            self.accepted,
            self.named,
            self.unnamed,
            self.panics,
            self.hangs,
            self.torn_or_lost,
            self.orphans
        );
        for e in &self.examples {
            s.push_str(&format!("  {e}\n"));
        }
        s
    }
}

/// A finished (or timed-out) process: status, both streams, how long it ran.
pub struct Ran {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    pub fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status.and_then(|s| s.signal())
    }

    /// A panic, an abort, a crash by signal (other than the KILL/TERM/INT/HUP a test sent).
    pub fn crashed(&self) -> Option<String> {
        if self.code() == Some(101) || self.stderr.contains("panicked at") {
            return Some(crate::clip(&self.stderr, 400));
        }
        match self.signal() {
            Some(s) if ![libc::SIGKILL, libc::SIGTERM, libc::SIGINT, libc::SIGHUP].contains(&s) => {
                Some(format!(
                    "killed by signal {s}: {}",
                    crate::clip(&self.stderr, 300)
                ))
            }
            _ => None,
        }
    }
}

/// Runs `cmd` to its end or `limit` (then SIGKILL; `status` None), with `on_start` called
/// once it is started (to signal it later, say).
pub fn run(mut cmd: Command, limit: Duration, on_start: impl FnOnce(u32)) -> Ran {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let to = std::thread::spawn(move || {
        let mut b = vec![];
        let _ = so.read_to_end(&mut b);
        b
    });
    let te = std::thread::spawn(move || {
        let mut b = vec![];
        let _ = se.read_to_end(&mut b);
        b
    });
    on_start(child.id());
    let t = Instant::now();
    let status = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break Some(s);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // A grandchild holding the pipes open must not hang the suite itself.
    let join = |h: std::thread::JoinHandle<Vec<u8>>| {
        let t = Instant::now();
        while !h.is_finished() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if h.is_finished() {
            String::from_utf8_lossy(&h.join().unwrap_or_default()).into_owned()
        } else {
            "(the stream stayed open: a process kept it)".into()
        }
    };
    Ran {
        status,
        stdout: join(to),
        stderr: join(te),
    }
}

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 2..].chars().next())
            .is_some_and(|c| c != 'Z' && c != 'X'),
        Err(_) => false,
    }
}

/// Live processes whose environment holds `LLM_BENCH_TEST_MARK=marker`.
pub fn marked(marker: &str) -> Vec<i32> {
    let needle = format!("LLM_BENCH_TEST_MARK={marker}");
    let mut v = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            if env.split(|&b| b == 0).any(|kv| kv == needle.as_bytes()) && alive(pid) {
                v.push(pid);
            }
        }
    }
    v
}

/// Waits up to 5 s for every process of `marker` to be gone; counts (and kills) the rest.
pub fn check_orphans(t: &mut Tally, area: &str, marker: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) && !marked(marker).is_empty() {
        std::thread::sleep(Duration::from_millis(25));
    }
    let left = marked(marker);
    if !left.is_empty() {
        let names: Vec<String> = left
            .iter()
            .map(|p| {
                let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                format!("{p} {}", String::from_utf8_lossy(&cmd).replace('\0', " "))
            })
            .collect();
        t.orphaned(area, &names);
        for p in left {
            // SAFETY: killing a process this suite started (it carries the suite's marker).
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

/// Every record in `dir` (a unit's records directory) parses and holds what a record holds;
/// returns their paths. A torn one is counted.
pub fn records(t: &mut Tally, area: &str, dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(".json") {
            continue;
        }
        let v: Option<serde_json::Value> = std::fs::read_to_string(&p)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok());
        match v {
            Some(v)
                if v["schema"] == 1
                    && v["legs"]["engine"].is_object()
                    && v["exit_status"].is_i64() =>
            {
                out.push(p)
            }
            _ => t.torn(area, format!("{} does not parse as a record", p.display())),
        }
    }
    out
}
