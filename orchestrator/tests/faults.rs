//! Each fault a leg can commit, played by tests/fake_leg.py, must end in a named failure or
//! refusal in the record, with the right exit status. Every test uses its own temporary records
//! and lock directories, so nothing is written into the repository.

mod common;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

const PROMPTS: [&[u32]; 3] = [&[1, 2, 3], &[4, 5], &[6, 7, 8, 9]];

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// A unit whose engine runs the fake with `engine_args` and whose oracle runs it with
    /// `oracle_args`; `extra` is appended to unit.toml.
    fn new(engine_args: &str, oracle_args: &str, extra: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let engine = common::write_fake_unit(d, &PROMPTS, engine_args, oracle_args);
        std::fs::write(d.join("unit.toml"), common::fake_unit_toml(&engine, extra)).unwrap();
        Fixture { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn run_cmd(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.arg("run")
            .arg(self.path("unit.toml"))
            .arg("--records-dir")
            .arg(self.path("records"))
            .arg("--lock-dir")
            .arg(self.path("locks"))
            .arg("--python")
            .arg(self.path("python.sh"))
            .args(extra);
        c
    }

    fn run(&self) -> (Output, Option<Value>) {
        let out = self.run_cmd(&[]).output().unwrap();
        (out, self.record())
    }

    fn record(&self) -> Option<Value> {
        let dir = self.path("records/fake");
        let rd = std::fs::read_dir(&dir).ok()?;
        let json: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        assert!(json.len() <= 1, "one run writes one record: {json:?}");
        let text = std::fs::read_to_string(json.first()?).unwrap();
        Some(serde_json::from_str(&text).unwrap())
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn refusals(rec: &Value) -> Vec<String> {
    rec["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

fn gate<'a>(rec: &'a Value, name: &str, leg: Option<&str>) -> &'a Value {
    rec["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gate"] == name && g["leg"].as_str() == leg)
        .unwrap_or_else(|| panic!("no gate {name} {leg:?} in {}", rec["gates"]))
}

#[test]
fn clean_fake_legs_pass_every_gate_and_write_record_and_table() {
    let f = Fixture::new("", "", "");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(rec["schema"], 1);
    assert_eq!(rec["exit_status"], 0);
    assert!(refusals(&rec).is_empty());
    // The fakes are not the golden's implementation ("fake"): both are teacher-forced at batch
    // sizes 1 and 2, after their batteries, and their free-running tokens are information.
    let tok = gate(&rec, "token", Some("engine"));
    assert_eq!(tok["verdict"], "pass");
    assert_eq!(
        tok["sentence"],
        "TOKEN MATCH (teacher-forced): 48/48 positions over 3 prompt(s) at batch(es) [1, 2] (path decode); 0 agree within tolerance; free-running, not gating: TOKEN MATCH: 96/96 over 3 prompt(s) (full rows=12, short rows=0), first divergences: none against golden.json"
    );
    let engine = &rec["legs"]["engine"];
    assert_eq!(engine["verify"].as_array().unwrap().len(), 2, "{engine}");
    let phases: Vec<&str> = engine["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["load", "warmup", "battery", "verify", "shutdown"]);
    assert!(
        engine["host_probe"]["best_ms"].as_f64().unwrap() > 0.0,
        "{engine}"
    );
    // Every sample is kept: 3 prompts x 2 repeats.
    assert_eq!(
        rec["timings"]["engine"]["per_token_s"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    assert_eq!(rec["project"]["tree"].as_str().unwrap().len(), 40);
    assert_eq!(rec["engine_binary"]["sha256"].as_str().unwrap().len(), 64);
    let json = f
        .path("records/fake")
        .read_dir()
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap();
    let md = std::fs::read_to_string(json.with_extension("md")).unwrap();
    assert!(
        md.contains("| per output token, warm (median, n=6) |"),
        "{md}"
    );
    // Without a GPU the clock gate is not applicable, which is not a pass.
    assert!(
        md.contains("No gate refused; 3 verdict(s) above are not applicable"),
        "{md}"
    );
    // Batch 2 is split into its prefill (max_tokens=1 at batch 2) and its decode step, one
    // figure per repeat; the fake's step is its 3 prompts x 0.5 ms.
    let kinds: Vec<(&str, u64, u64)> = engine["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["phase"] == "battery" && r["pass"] == 0)
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap();
            (r["kind"].as_str().unwrap(), n("batch"), n("max_tokens"))
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("first_token", 1, 1),
            ("decode", 1, 8),
            ("batch_first_token", 2, 1),
            ("batch", 2, 8)
        ]
    );
    let engine_t = &rec["timings"]["engine"];
    for key in ["batch_prefill_s", "batch_step_s"] {
        let v = engine_t[key]["2"].as_array().unwrap();
        assert_eq!(v.len(), 2, "{key}: {v:?}");
        assert!(v.iter().all(|x| x.as_f64().unwrap() > 0.0), "{key}: {v:?}");
    }
    // The step is the batch request less its prefill, over the 7 steps after the first token,
    // from the walls the record keeps (the fake's nominal 1.5 ms moves with `time.sleep`'s
    // overshoot on a loaded machine, so the figure is checked against its own inputs).
    let wall = |kind: &str| {
        engine["requests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["phase"] == "battery" && r["pass"] == 0 && r["kind"] == kind)
            .unwrap()["wall_s"]
            .as_f64()
            .unwrap()
    };
    let step = engine_t["batch_step_s"]["2"][0].as_f64().unwrap();
    let want = (wall("batch") - wall("batch_first_token")) / 7.0;
    assert!((step - want).abs() < 1e-12, "{step} against {want}");
    assert!(md.contains("| decode step, batch 2 |"), "{md}");
    assert!(md.contains("| prefill, batch 2 |"), "{md}");
    assert!(md.contains("decode step at batch 2 "), "{md}");
    // And the sums done for the reader: each leg's request as prefill + 7 steps, and the gap.
    assert!(md.contains("## Where each batch's time goes"), "{md}");
    assert!(md.contains("- batch 2: a request takes ours "), "{md}");
    assert!(md.contains(" + 7 steps x "), "{md}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("output throughput, batch 2"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("[engine] battery: done in"), "{stderr}");
    // The leg's stderr went to the log beside the record, named relative to its directory.
    let log = rec["legs"]["engine"]["log"].as_str().unwrap();
    assert!(!log.contains('/'), "{log}");
    assert!(std::fs::read_to_string(f.path("records/fake").join(log))
        .unwrap()
        .contains("fake leg pid "));
    // Two repeats: each leg has an A/A spread, and the table's per-token gap is judged by it.
    assert!(
        md.contains("## A/A noise (each leg's spread over its repeats)"),
        "{md}"
    );
    assert!(md.contains("- engine: per output token "), "{md}");
    assert!(
        md.contains("- so the per-token gap between the legs"),
        "{md}"
    );
    assert!(md.contains("- before the engine leg: "), "{md}");
}

#[test]
fn without_a_gpu_the_series_timeline_and_host_memory_are_kept_and_gpu_gates_say_so() {
    let f = Fixture::new("", "", "[sampler]\nhost_period_ms = 10\n");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let clock = gate(&rec, "clock", None);
    assert_eq!(clock["verdict"], "not_applicable");
    assert!(
        clock["reason"].as_str().unwrap().starts_with("no GPU: "),
        "{clock}"
    );
    assert_eq!(
        gate(&rec, "gpu_straggler", Some("oracle"))["verdict"],
        "not_applicable"
    );
    for leg in ["engine", "oracle"] {
        let s = &rec["legs"][leg]["sampler"];
        assert!(s["summary"].is_null(), "{s}");
        assert_eq!(s["host_period_ms"], 10);
        assert!(s["cpu_s"].as_f64().unwrap() > 0.0, "{s}");
        // Files beside the record are named relative to its directory.
        let name = s["series"].as_str().unwrap();
        assert!(!name.contains('/'), "{name}");
        // Compressed beside the record (docs/RECORD.md).
        assert!(name.ends_with(".samples.jsonl.gz"), "{name}");
        let mut series = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(
                std::fs::File::open(f.path("records/fake").join(name)).unwrap(),
            ),
            &mut series,
        )
        .unwrap();
        assert!(series.starts_with(r#"{"kind":"meta","leg":""#), "{series}");
        for p in ["load", "warmup", "battery", "shutdown"] {
            // Phase rows end with their phase; host rows go on to rss_bytes.
            assert!(
                series.contains(&format!(r#""phase":"{p}"}}"#)),
                "{p}: {series}"
            );
        }
        assert!(series.contains(r#"{"kind":"host""#), "{series}");
        assert!(
            series.contains(r#"{"kind":"cost","thread":"host""#),
            "{series}"
        );
    }
    let axis = |name: &str| {
        rec["axes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["axis"] == name)
            .unwrap_or_else(|| panic!("no axis {name}"))
            .clone()
    };
    assert!(axis("peak GPU memory")["ours"].is_null());
    assert_eq!(
        axis("peak GPU memory")["words"],
        "not measured on either leg"
    );
    let svg = f
        .path("records/fake")
        .join(rec["timeline"].as_str().unwrap());
    assert!(std::fs::read_to_string(&svg)
        .unwrap()
        .contains("no GPU data: "));
    let md = std::fs::read_to_string(svg.with_extension("").with_extension("md")).unwrap();
    assert!(md.contains(".timeline.svg)"), "{md}");
    assert!(md.contains("sampler cost"), "{md}");
    assert!(md.contains("## A/A noise"), "{md}");
    assert!(md.contains("## Idle checks (before each leg)"), "{md}");
}

fn busy_gpu(_: u32) -> Result<Box<dyn orchestrator::legs::sampler::Gpu>, String> {
    use orchestrator::legs::sampler::{FakeGpu, GpuProc, GpuState};
    Ok(Box::new(FakeGpu {
        states: vec![GpuState {
            used_bytes: Some(23_000 << 20),
            ..Default::default()
        }],
        procs: vec![GpuProc {
            pid: std::process::id(),
            used_bytes: Some(22_986 << 20),
            compute: true,
        }],
        ..Default::default()
    }))
}

#[test]
fn a_busy_gpu_stops_each_leg_from_starting_and_names_the_process() {
    // GPU 7 is leased: no machine this runs on has it, so the sampler says "no GPU" while the
    // idle check sees the fake's process table.
    let f = Fixture::new("", "", "[lease]\ngpu = 7\n");
    let (_, checked) = orchestrator::unit::preflight::preflight(
        &f.path("unit.toml"),
        Some(f.path("python.sh").to_str().unwrap()),
        false,
    );
    let opts = orchestrator::run::RunOptions {
        records_dir: Some(f.path("records")),
        lock_dir: Some(f.path("locks")),
        quiet: true,
        ..Default::default()
    };
    let idle = orchestrator::gates::idle::GpuIdleCheck {
        max_used_mib: 1024,
        open: busy_gpu,
        settle: Duration::ZERO,
    };
    let code = orchestrator::run::run_checked(&checked.unwrap(), &opts, &idle)
        .unwrap()
        .exit_status;
    assert_eq!(code, 2, "neither leg was measured");
    let rec = f.record().unwrap();
    for leg in ["engine", "oracle"] {
        let fail = &rec["legs"][leg]["failure"];
        assert_eq!(fail["kind"], "idle", "{fail}");
        let msg = fail["message"].as_str().unwrap();
        assert!(
            msg.starts_with("GPU 7 is not idle: 1 compute process(es) on it: pid ")
                && msg.contains(", 22986 MiB) (23000 MiB in use)"),
            "{msg}"
        );
        assert!(rec["legs"][leg]["ready"].is_null());
    }
    let checks = rec["lease"]["idle_checks"].to_string();
    assert!(
        checks.contains("before the oracle leg: refused: GPU 7 is not idle"),
        "{checks}"
    );
}

#[test]
fn crash_at_load_is_named_with_the_stderr_tail() {
    let f = Fixture::new("--fault=crash-load", "", "");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(
        out.status.code(),
        Some(1),
        "the oracle measured, so a record with refusals: {}",
        text(&out)
    );
    let fail = &rec["legs"]["engine"]["failure"];
    assert_eq!(fail["phase"], "load");
    assert_eq!(fail["kind"], "exited");
    assert!(
        fail["message"]
            .as_str()
            .unwrap()
            .contains("exited with status 3 during load"),
        "{fail}"
    );
    assert!(
        fail["stderr_tail"]
            .to_string()
            .contains("boom: fake crash at load"),
        "{fail}"
    );
    assert!(refusals(&rec)
        .iter()
        .any(|r| r.contains("The engine leg failed in phase load") && r.contains("boom")));
}

#[test]
fn nothing_measured_exits_2() {
    let f = Fixture::new("--fault=crash-load", "--fault=crash-load", "");
    let (out, rec) = f.run();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        rec.expect("the failures are still recorded")["exit_status"],
        2
    );
}

#[test]
fn hang_in_generate_is_killed_by_the_watchdog_with_term_then_kill() {
    let f = Fixture::new("--fault=hang-generate --ignore-term", "", "");
    // Tighter deadline on the warm-up, where the hang first shows.
    let unit = std::fs::read_to_string(f.path("unit.toml"))
        .unwrap()
        .replace("warmup_s = 20", "warmup_s = 2");
    std::fs::write(f.path("unit.toml"), unit).unwrap();
    let t = Instant::now();
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let wd = &rec["legs"]["engine"]["watchdog"];
    assert_eq!(wd["phase"], "warmup", "{wd}");
    let ran = wd["ran_s"].as_f64().unwrap();
    assert!(
        (2.0..10.0).contains(&ran),
        "ran {ran} s against a 2 s deadline"
    );
    assert_eq!(
        wd["signals"],
        serde_json::json!(["TERM", "KILL"]),
        "it ignores TERM"
    );
    let fail = &rec["legs"]["engine"]["failure"];
    assert_eq!(fail["kind"], "watchdog");
    assert!(
        fail["message"]
            .as_str()
            .unwrap()
            .contains("in phase warmup after"),
        "{fail}"
    );
    assert!(fail["stderr_tail"]
        .to_string()
        .contains("hanging on purpose"));
    // The hung process is gone: nothing of its group survived.
    assert!(rec["legs"]["engine"]["stragglers"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(t.elapsed() < Duration::from_secs(60));
}

#[test]
fn malformed_stdout_line_is_quoted() {
    let f = Fixture::new("--fault=malformed", "", "");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let fail = &rec["legs"]["engine"]["failure"];
    assert_eq!(fail["kind"], "malformed_line");
    assert!(
        fail["message"]
            .as_str()
            .unwrap()
            .contains("\"this is not a protocol line\""),
        "{fail}"
    );
}

#[test]
fn error_event_is_named_with_its_code_and_message() {
    let f = Fixture::new("", "--fault=error-event", "");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let fail = &rec["legs"]["oracle"]["failure"];
    assert_eq!(fail["kind"], "error_event");
    assert!(
        fail["message"]
            .as_str()
            .unwrap()
            .contains("\"internal\": fake failure in generate"),
        "{fail}"
    );
}

#[test]
fn wrong_tokens_are_refused_and_timings_still_shown() {
    let f = Fixture::new("--fault=wrong-tokens", "", "");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let g = gate(&rec, "token", Some("engine"));
    assert_eq!(g["verdict"], "refused");
    let s = g["sentence"].as_str().unwrap();
    // Fed the golden's tokens, the engine prefers another token at prompt 0's position 5 by a
    // gap of 1 where the golden's margin is 0.5: far beyond float32 rounding.
    assert!(
        s.contains("Engine: prompt p0 position 5 (batch 1, path decode): the leg's argmax 68, the golden's token 67; leg gap 1.000 + golden margin 0.5000 = 1.500 > tolerance"),
        "{s}"
    );
    // Free-running, prompt 0 differs at position 5 in all 4 rows (2 repeats x 2 batch sizes):
    // 4 x 3 positions lost; recorded, not gating.
    assert!(
        s.contains("Free-running, not gating: TOKEN MATCH: 84/96 over 3 prompt(s) (full rows=8, short rows=0), first divergences: p0 at 5"),
        "{s}"
    );
    assert_eq!(gate(&rec, "token", Some("oracle"))["verdict"], "pass");
    // The refusal's scope is stored beside it: the engine's figures, every axis.
    assert_eq!(
        g["scope"],
        serde_json::json!({"timings_of": ["engine"], "axes": "all"})
    );
    let axis = &rec["axes"][0];
    assert!(
        axis["ours"].as_f64().unwrap() > 0.0,
        "timings are still shown: {axis}"
    );
    assert_eq!(axis["ours_refused"], true);
    assert_eq!(axis["oracle_refused"], false);
    assert!(String::from_utf8_lossy(&out.stdout).contains("(refused)"));
}

#[test]
fn straggler_is_named_and_killed() {
    let f = Fixture::new("--fault=straggler", "", "");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let st = rec["legs"]["engine"]["stragglers"].as_array().unwrap();
    assert_eq!(st.len(), 1, "{st:?}");
    assert_eq!(st[0]["command"], "sleep 300");
    assert_eq!(st[0]["killed"], true);
    let pid = st[0]["pid"].as_i64().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        state.is_empty() || state.contains(") Z"),
        "the straggler must be dead (gone or a zombie): {state}"
    );
    let g = gate(&rec, "straggler", Some("engine"));
    assert!(
        g["sentence"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {pid} (sleep 300), killed")),
        "{g}"
    );
}

#[test]
fn kv_pools_that_cannot_be_matched_are_refused_with_figures() {
    // The oracle holds 32 x 16 = 512 tokens; the engine holds 64 x 16 and ignores --num-blocks.
    let f = Fixture::new("--kv=16,64", "--kv=16,32", "");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let s = gate(&rec, "kv", None)["sentence"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        s.contains(
            "engine 1024 tokens (64 blocks of 16), oracle 512 tokens (32 blocks of 16), 512 tokens apart"
        ),
        "{s}"
    );
    assert!(
        s.contains("even after restarting the engine with --num-blocks 32"),
        "{s}"
    );
    assert_eq!(
        rec["legs"]["engine"]["prior_starts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let argv = rec["legs"]["engine"]["argv"].to_string();
    assert!(argv.contains("\"--num-blocks\",\"32\""), "{argv}");
    // Its scope, stored beside it: no leg's figures, the memory axes, with the notes the table
    // wrote there.
    let scope = &gate(&rec, "kv", None)["scope"];
    assert_eq!(scope["timings_of"], serde_json::json!([]));
    assert_eq!(scope["axes"], "memory");
    let note = |name: &str| {
        rec["axes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["axis"] == name)
            .map(|a| a["note"].clone())
            .unwrap()
    };
    assert_eq!(note("KV pool"), "could NOT be matched");
    assert_eq!(
        note("peak host memory"),
        "KV pools not matched: raw, not like-for-like"
    );
}

#[test]
fn kv_pools_matched_by_restarting_the_engine_pass_and_say_so() {
    let f = Fixture::new("--kv=16,64 --resizable", "--kv=16,32", "");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let g = gate(&rec, "kv", None);
    assert_eq!(g["verdict"], "pass");
    assert!(
        g["sentence"]
            .as_str()
            .unwrap()
            .contains("after restarting the engine with --num-blocks 32"),
        "{g}"
    );
    assert_eq!(rec["legs"]["engine"]["ready"]["kv"]["capacity_tokens"], 512);
    assert!(rec["kv_resize"].is_string());
}

#[test]
fn kv_match_oracle_sets_its_override() {
    let f = Fixture::new(
        "--kv=16,64",
        "--kv=16,32 --resizable",
        "[gates]\nkv_match = \"oracle\"\n",
    );
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let argv = rec["legs"]["oracle"]["argv"].to_string();
    assert!(
        argv.contains("\"--num-gpu-blocks-override\",\"64\""),
        "{argv}"
    );
}

#[test]
fn an_oracle_that_names_no_resize_option_is_not_restarted_and_the_pools_are_refused() {
    let f = Fixture::new(
        "--kv=16,64",
        "--kv=16,32 --resizable --no-resize-option",
        "[gates]\nkv_match = \"oracle\"\n",
    );
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(rec["legs"]["oracle"]["prior_starts"]
        .as_array()
        .unwrap()
        .is_empty());
    let s = gate(&rec, "kv", None)["sentence"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        s.contains(
            "even after trying to restart the oracle, whose ready.kv names no resize_option"
        ) && s.contains("oracle the option that sizes its pool)"),
        "{s}"
    );
}

#[test]
fn degraded_build_on_the_wrong_backend_is_refused() {
    let f = Fixture::new("--backend=cuda --degraded=flash_attn,cublaslt", "", "");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let r = refusals(&rec).join("\n");
    assert!(r.contains("requested cpu, it reports cuda"), "{r}");
    assert!(
        r.contains("2 feature(s) fell back (flash_attn, cublaslt)"),
        "{r}"
    );
}

#[test]
fn kv_null_is_not_applicable_with_the_reason() {
    let f = Fixture::new("", "--kv=none", "");
    let (out, rec) = f.run();
    let rec = rec.unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let g = gate(&rec, "kv", None);
    assert_eq!(g["verdict"], "not_applicable");
    assert!(
        g["sentence"]
            .as_str()
            .unwrap()
            .contains("fake leg without a pool"),
        "{g}"
    );
}

#[test]
fn unknown_unit_key_fails_preflight_with_exit_2_and_no_record() {
    let f = Fixture::new("", "", "");
    let unit = std::fs::read_to_string(f.path("unit.toml"))
        .unwrap()
        .replace("repeat = 2", "repeats = 2");
    std::fs::write(f.path("unit.toml"), unit).unwrap();
    let (out, rec) = f.run();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(rec.is_none());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown field `repeats`"),
        "{}",
        text(&out)
    );
}

#[test]
fn second_run_on_a_held_lease_fails_at_once_with_no_wait_and_waits_without() {
    let f = Fixture::new("", "", "");
    let locks = f.path("locks");
    // Hold the cpu lease with a job for a few seconds.
    let mut holder = Command::new(BIN)
        .args(["lease", "--lock-dir"])
        .arg(&locks)
        .args(["--", "sleep", "5"])
        .spawn()
        .unwrap();
    let lock = locks.join("cpu.lock");
    let t = Instant::now();
    while !std::fs::read_to_string(&lock).is_ok_and(|s| s.contains("pid")) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the holder never wrote the lock file"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = f.run_cmd(&["--no-wait"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("held by pid {}", holder.id())),
        "{err}"
    );
    assert!(err.contains("orchestrator lease -- sleep 5"), "{err}");
    assert!(
        f.record().is_none(),
        "nothing was measured, nothing recorded"
    );

    let t = Instant::now();
    let out = f.run_cmd(&[]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[lease] waiting for the cpu lease"), "{err}");
    assert!(
        t.elapsed() > Duration::from_millis(500),
        "it waited for the holder"
    );
    assert!(holder.wait().unwrap().success());
}

#[test]
fn lease_passes_the_exit_status_through() {
    let d = tempfile::tempdir().unwrap();
    let st = Command::new(BIN)
        .args(["lease", "--lock-dir"])
        .arg(d.path())
        .args(["--", "sh", "-c", "exit 7"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(7));
}

#[test]
fn interrupt_kills_the_running_leg_group_and_exits_2() {
    let f = Fixture::new("--fault=hang-generate", "", "");
    let child = f
        .run_cmd(&[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the engine leg hangs, and read its pid from its log.
    let t = Instant::now();
    let pid = loop {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the engine leg never started hanging"
        );
        std::thread::sleep(Duration::from_millis(50));
        let logs: Vec<PathBuf> = std::fs::read_dir(f.path("records/fake"))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        let Some(log) = logs
            .iter()
            .find(|p| p.to_string_lossy().ends_with(".engine.log"))
        else {
            continue;
        };
        let text = std::fs::read_to_string(log).unwrap();
        if text.contains("hanging on purpose") {
            let pid: i32 = text
                .split("fake leg pid ")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            break pid;
        }
    };
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("interrupted by SIGINT"), "{err}");
    // The oracle leg (first) was measured: the record keeps it, and says what happened.
    let rec = f.record().expect("a record of what was measured");
    assert_eq!(rec["exit_status"], 2);
    assert!(
        rec["interrupted"]
            .as_str()
            .unwrap()
            .starts_with("by SIGINT during the legs"),
        "{}",
        rec["interrupted"]
    );
    assert_eq!(rec["legs"]["engine"]["failure"]["kind"], "interrupted");
    assert_eq!(rec["legs"]["oracle"]["failure"], Value::Null);
    std::thread::sleep(Duration::from_millis(200));
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        state.is_empty() || state.contains(") Z"),
        "the hung leg must be dead: {state}"
    );
}

#[test]
fn check_names_each_failure_and_quotes_the_oracles_fail_lines() {
    let f = Fixture::new("", "--fault=check-fail", "");
    std::fs::remove_file(f.path("engine.sh")).unwrap();
    let out = Command::new(BIN)
        .arg("check")
        .arg(f.path("unit.toml"))
        .arg("--python")
        .arg(f.path("python.sh"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("ok   unit:") && s.contains("ok   model:") && s.contains("ok   golden:"),
        "{s}"
    );
    assert!(
        s.contains("FAIL engine:") && s.contains("engine.sh does not exist"),
        "{s}"
    );
    assert!(s.contains("cargo build --release -p engine"), "{s}");
    assert!(s.contains("FAIL oracle:"), "{s}");
    assert!(
        s.contains("| FAIL vllm: cannot import vllm"),
        "the oracle's FAIL line is quoted: {s}"
    );
    assert!(
        !s.contains("ok   python: 3.11"),
        "only FAIL lines are quoted: {s}"
    );
    assert!(s.contains("preflight FAILED: 2 check(s) failed"), "{s}");
}
