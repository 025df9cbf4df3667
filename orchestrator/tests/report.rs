//! `orchestrator report` against checked-in records (tests/fixtures/report/records): the output
//! must equal the checked-in BENCHMARKS.md and chart byte for byte, twice over, and the two
//! files there that are not readable records must be named without stopping the report.
//!
//! After an intended change to the report, regenerate the expected files with
//! `UPDATE_EXPECTED=1 cargo test -p orchestrator --test report -- --test-threads=1`
//! and read the diff before committing it; the records themselves are rewritten the same way
//! (`write_fixture_records`).

mod synth;

use std::path::{Path, PathBuf};
use std::process::Command;
use synth::Synth;

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report")
}

fn report(out: &Path) -> std::process::Output {
    Command::new(BIN)
        .arg("report")
        .arg("--records-dir")
        .arg(fixtures().join("records"))
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn benchmarks_md_equals_the_expected_file_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("a/BENCHMARKS.md");
    let o = report(&out);
    let stderr = String::from_utf8_lossy(&o.stderr);
    // Written, but exit 1: two files under the records directory are not records it can read.
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    let got = std::fs::read_to_string(&out).unwrap();
    let chart = std::fs::read_to_string(tmp.path().join("a/charts/tiny-llama.svg")).unwrap();
    let expected = fixtures().join("expected");
    if std::env::var("UPDATE_EXPECTED").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(expected.join("charts")).unwrap();
        std::fs::write(expected.join("BENCHMARKS.md"), &got).unwrap();
        std::fs::write(expected.join("charts/tiny-llama.svg"), &chart).unwrap();
    }
    assert_eq!(
        got,
        std::fs::read_to_string(expected.join("BENCHMARKS.md")).unwrap(),
        "BENCHMARKS.md differs from tests/fixtures/report/expected/BENCHMARKS.md"
    );
    assert_eq!(
        chart,
        std::fs::read_to_string(expected.join("charts/tiny-llama.svg")).unwrap()
    );
    // A unit with fewer than three trees gets no chart.
    assert!(!tmp.path().join("a/charts/nemotron-h.svg").exists());

    // Again, elsewhere: the same records give the same bytes.
    let out2 = tmp.path().join("b/BENCHMARKS.md");
    report(&out2);
    assert_eq!(got, std::fs::read_to_string(&out2).unwrap());
}

#[test]
fn malformed_and_future_schema_records_are_named_and_the_rest_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("BENCHMARKS.md");
    let o = report(&out);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("future/20270101T000000Z-ffffffff.json was not read: it is a schema 2 record and this orchestrator reads schema 1 at most"),
        "{stderr}"
    );
    assert!(
        stderr
            .contains("tiny-llama/20261105T000000Z-broken.json was not read: it is not valid JSON"),
        "{stderr}"
    );
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(md.contains("## Records not read"), "{md}");
    assert!(
        md.contains("## nemotron-h") && md.contains("## tiny-llama"),
        "{md}"
    );
}

#[test]
fn the_report_says_what_refused_and_where() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("BENCHMARKS.md");
    report(&out);
    let md = std::fs::read_to_string(&out).unwrap();
    let nemo = &md[md.find("## nemotron-h").unwrap()..md.find("## tiny-llama").unwrap()];
    assert!(
        nemo.contains("**No speed number, by the unit's own rule.** The rule that refused: the token gate (engine leg), whose refusal is quoted below in full."),
        "{nemo}"
    );
    let tiny = &md[md.find("## tiny-llama").unwrap()..];
    // The kv refusal sits under the latest table, naming the rows it concerns, and the speed
    // numbers stay gated.
    let table_end = tiny.find("Refusals (1)").unwrap();
    assert!(tiny[..table_end].contains("| KV pool |"), "{tiny}");
    assert!(
        tiny.contains(
            "- Concerns the rows peak host memory and KV pool. The KV pools could not be matched"
        ),
        "{tiny}"
    );
    assert!(!tiny.contains("No speed number"), "{tiny}");
    assert!(
        tiny.contains("Oracle: vllm 0.26.0. GPU: NVIDIA H200, driver 580.65.06."),
        "{tiny}"
    );
    // History: three trees, oldest first, the refused one named.
    let h = &tiny[tiny.find("### History").unwrap()..];
    let (a, b, c) = (
        h.find("| `aaaaaaaa`").unwrap(),
        h.find("| `bbbbbbbb`").unwrap(),
        h.find("| `cccccccc`").unwrap(),
    );
    assert!(a < b && b < c, "{h}");
    assert!(h.contains("x refused by token"), "{h}");
    assert!(h.contains("x refused by kv"), "{h}");
    assert!(h.contains("](charts/tiny-llama.svg)"), "{h}");
}

/// The fixture records must be exactly what tests/synth writes for them, so a change to the
/// synthetic record shape cannot leave stale fixtures behind. `UPDATE_EXPECTED=1` rewrites them.
#[test]
fn fixture_records_are_what_synth_writes() {
    if std::env::var("UPDATE_EXPECTED").is_ok_and(|v| v == "1") {
        let root = fixtures().join("records");
        let _ = std::fs::remove_dir_all(&root);
        write_fixture_records(&root);
    }
    let tmp = tempfile::tempdir().unwrap();
    write_fixture_records(tmp.path());
    let list = |root: &Path| {
        let mut v = vec![];
        for u in std::fs::read_dir(root).unwrap().flatten() {
            for f in std::fs::read_dir(u.path()).unwrap().flatten() {
                let p = f.path();
                v.push((
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
        v.sort();
        v
    };
    let (want, got) = (list(tmp.path()), list(&fixtures().join("records")));
    assert_eq!(
        want.iter().map(|x| &x.0).collect::<Vec<_>>(),
        got.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        assert!(w == g, "{} differs from what synth writes", name.display());
    }
}

fn write_fixture_records(root: &Path) {
    let small = |unit: &str, tree: &str, created: &str| {
        let mut s = Synth::new(unit, tree, created);
        s.prompts = 3;
        s.repeat = 2;
        s
    };
    small(
        "tiny-llama",
        "aaaaaaaa00000000000000000000000000000001",
        "2026-11-01T10:00:00Z",
    )
    .write(root);
    let mut b = small(
        "tiny-llama",
        "bbbbbbbb00000000000000000000000000000002",
        "2026-11-02T10:00:00Z",
    );
    b.token_refused = true;
    b.engine_scale = 1.3;
    b.write(root);
    let mut c = small(
        "tiny-llama",
        "cccccccc00000000000000000000000000000003",
        "2026-11-03T10:00:00Z",
    );
    c.engine_scale = 0.8;
    c.write(root);
    // The same tree again, later: the history keeps only this, its latest record.
    let mut c2 = c.clone();
    c2.created = "2026-11-04T10:00:00Z".into();
    c2.kv_refused = true;
    c2.seed = 7;
    c2.write(root);
    let mut n = small(
        "nemotron-h",
        "dddddddd00000000000000000000000000000004",
        "2026-11-04T12:00:00Z",
    );
    n.token_refused = true;
    // Written by 0.1.0, whose peak host memory is withdrawn when read (record/archive.rs, errata).
    n.version = "0.1.0".into();
    n.write(root);
    std::fs::write(
        root.join("tiny-llama/20261105T000000Z-broken.json"),
        "{\"schema\": 1, \"unit\": ",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("future")).unwrap();
    std::fs::write(
        root.join("future/20270101T000000Z-ffffffff.json"),
        "{\"schema\": 2, \"unit\": {\"name\": \"future\"}}\n",
    )
    .unwrap();
}

/// A unit's records from two GPUs (a fleet's): each class under its own heading, with its own
/// latest run, history and chart, and the header says so. A unit of one class is as before.
#[test]
fn records_from_two_host_classes_are_never_mixed() {
    let tmp = tempfile::tempdir().unwrap();
    let recs = tmp.path().join("records");
    let trees = ["aaaaaaaa", "bbbbbbbb", "cccccccc"];
    for (i, t) in trees.iter().enumerate() {
        for (gpu, day) in [("NVIDIA H200", 1), ("NVIDIA A100-SXM4-80GB", 4)] {
            let mut s = Synth::new("u", t, &format!("2026-11-0{}T10:00:00Z", day + i));
            s.gpu = gpu.into();
            // The A100 is slower for both legs: its ratio is its own.
            s.machine_scale = if day == 4 { 2.0 } else { 1.0 };
            s.write(&recs);
        }
    }
    Synth::new("v", "aaaaaaaa", "2026-11-01T11:00:00Z").write(&recs);
    let out = tmp.path().join("BENCHMARKS.md");
    // What a report drew when u's records were of one class, and a file that is not a chart.
    std::fs::create_dir_all(tmp.path().join("charts")).unwrap();
    std::fs::write(tmp.path().join("charts/u.svg"), "<svg/>").unwrap();
    std::fs::write(tmp.path().join("charts/README"), "kept").unwrap();
    let o = Command::new(BIN)
        .arg("report")
        .arg("--records-dir")
        .arg(&recs)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(
        md.contains("Records come from more than one host class (GPU, driver, host CPU)"),
        "{md}"
    );
    let u = &md[md.find("## u\n").unwrap()..md.find("## v\n").unwrap()];
    assert!(
        u.contains("The records of u come from 2 host classes"),
        "{u}"
    );
    let a100 = "### u on NVIDIA A100-SXM4-80GB, driver 580.65.06, host x86 (16 cores)";
    let h200 = "### u on NVIDIA H200, driver 580.65.06, host x86 (16 cores)";
    let (ia, ih) = (u.find(a100).unwrap(), u.find(h200).unwrap());
    assert!(ia < ih, "classes in sorted order: {u}");
    let (sa, sh) = (&u[ia..ih], &u[ih..]);
    // Each class's latest run is its own latest record, and its history holds its own records.
    assert!(
        sa.contains("Latest run: record `u/20261106T100000Z-cccccccc.json`"),
        "{sa}"
    );
    assert!(
        sh.contains("Latest run: record `u/20261103T100000Z-cccccccc.json`"),
        "{sh}"
    );
    for s in [sa, sh] {
        assert_eq!(s.matches("#### History").count(), 1, "{s}");
        let h = &s[s.find("#### History").unwrap()..];
        let rows = h.lines().filter(|l| l.starts_with("| `")).count();
        assert_eq!(rows, 3, "three trees, one row each: {h}");
    }
    assert!(
        sh.contains("| `aaaaaaaa` | `aaaaaaaa` | 2026-11-01T10:00:00Z |"),
        "{sh}"
    );
    assert!(!sa.contains("2026-11-01T10:00:00Z"), "{sa}");
    for (s, slug) in [
        (sa, "nvidia-a100-sxm4-80gb-580.65.06-x86-16-cores"),
        (sh, "nvidia-h200-580.65.06-x86-16-cores"),
    ] {
        let file = format!("charts/u.{slug}.svg");
        assert!(s.contains(&format!("]({file})")), "{s}");
        assert!(tmp.path().join(&file).exists(), "{file}");
    }
    // The one-class chart is gone (and said so), the file that is not a chart stays.
    assert!(!tmp.path().join("charts/u.svg").exists());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("charts/u.svg (a chart these records no longer draw)"),
        "{stdout}"
    );
    assert!(tmp.path().join("charts/README").exists());
    // One class: the section is as it always was.
    let v = &md[md.find("## v\n").unwrap()..];
    assert!(v.starts_with("## v\n\nLatest run: record `v/"), "{v}");
    assert!(
        v.contains("### History") && !v.contains(" on NVIDIA"),
        "{v}"
    );
}
