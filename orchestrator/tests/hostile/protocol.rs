//! The leg protocol, fuzzed from a fixed seed: hostile request lines to the real `engine serve`
//! (tiny-llama) and to the oracle's request parser, each answered by exactly one `done` or one
//! named `error` and never by a crash or silence; and hostile event lines from a fake leg to
//! `orchestrator run`, which must end in a named leg failure (or pass) and a whole record.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::tally::{self, check_orphans, End, Tally};
use crate::{check_recorded, clip, judge_orchestrator, orchestrator, root, Rng};

fn nasty(rng: &mut Rng) -> Value {
    let deep = (0..200).fold(json!(1), |v, _| json!([v]));
    let long: Vec<u32> = (0..600).map(|i| i % 500).collect();
    let many: Vec<Vec<u32>> = (0..50).map(|i| vec![i]).collect();
    let vals = [
        json!(null),
        json!(-1),
        json!(0),
        json!(1),
        json!(4),
        json!(32),
        json!(511),
        json!(512),
        json!(1u64 << 31),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e308),
        json!(-0.5),
        json!(2.5),
        json!(""),
        json!("x"),
        json!("\u{0}"),
        json!("é".repeat(1000)),
        json!(true),
        json!([]),
        json!({}),
        json!([[]]),
        json!([[1, -1]]),
        json!([[512]]),
        json!([[1, 2], []]),
        json!([["1"]]),
        json!([1, 2]),
        json!([[1.5]]),
        deep,
        json!([long]),
        json!(many),
    ];
    rng.pick(&vals).clone()
}

const FIELDS: [&str; 6] = ["type", "id", "prompts", "max_tokens", "ignore_eos", "batch"];

/// One hostile request line (no newline inside, never blank, never a plain shutdown).
pub fn request_line(rng: &mut Rng, i: usize) -> Vec<u8> {
    let mut v = json!({"type": "generate", "id": format!("q{i}"), "prompts": [[1, 2, 3], [4, 5]],
        "max_tokens": 4, "ignore_eos": true, "batch": 1});
    for _ in 0..1 + rng.below(3) {
        let obj = v.as_object_mut().unwrap();
        let f = *rng.pick(&FIELDS);
        match rng.below(8) {
            0 => {
                obj.remove(f);
            }
            1 => {
                obj.insert(format!("extra{}", rng.below(9)), json!(1));
            }
            2 => {
                obj.insert(
                    "type".into(),
                    json!(*rng.pick(&["verify", "shutdown", "GENERATE", "", "ready"])),
                );
            }
            _ => {
                obj.insert(f.into(), nasty(rng));
            }
        }
    }
    let mut line = v.to_string().into_bytes();
    match rng.below(12) {
        0 => line.truncate(1 + rng.below(line.len() - 1)),
        1 => line.insert(0, 0xff),
        2 => line = b"not json".to_vec(),
        3 => line = format!("[{}]", v).into_bytes(),
        4 => line = vec![b'{'; 2000],
        5 => line = "x".repeat(200_000).into_bytes(),
        _ => {}
    }
    line.retain(|&b| b != b'\n' && b != b'\r');
    if line.iter().all(|b| b.is_ascii_whitespace()) || line == br#"{"type":"shutdown"}"# {
        line = b"{}".to_vec();
    }
    line
}

/// The engine's answer to one request: results, then exactly one `done` or `error`.
fn answer(lines: &mpsc::Receiver<String>) -> End {
    loop {
        let Ok(line) = lines.recv_timeout(Duration::from_secs(20)) else {
            return End::Hang("no done or error within 20 s".into());
        };
        if line == "\u{0}EOF" {
            return End::Panic("the engine closed its stdout".into());
        }
        let Ok(ev) = serde_json::from_str::<Value>(&line) else {
            return End::Unnamed(format!(
                "a stdout line that is not JSON: {}",
                clip(&line, 200)
            ));
        };
        match ev["type"].as_str() {
            Some("result") => continue,
            Some("done") => return End::Accepted,
            Some("error") if ev["code"].as_str().is_some_and(|c| !c.is_empty()) => {
                let m = ev["message"].as_str().unwrap_or("");
                if m.is_empty() || m.len() > 4200 {
                    return End::Unnamed(format!("an error message of {} bytes", m.len()));
                }
                return End::Named;
            }
            _ => return End::Unnamed(clip(&line, 200)),
        }
    }
}

fn engine_serve(t: &mut Tally, lines_sent: &[Vec<u8>]) {
    let Some(engine) = crate::engine_binary() else {
        return;
    };
    let marker = format!("hostile-serve-{}", std::process::id());
    let mut child = Command::new(engine)
        .args(["serve", "--model"])
        .arg(root().join("goldens/tiny-llama/model"))
        .args(["--max-batch", "4", "--num-blocks", "72"])
        .env("LLM_BENCH_TEST_MARK", &marker)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for l in stdout.lines() {
            match l {
                Ok(l) => {
                    let _ = tx.send(l);
                }
                Err(_) => break,
            }
        }
        let _ = tx.send("\u{0}EOF".into());
    });
    let ready: Value = serde_json::from_str(&rx.recv().unwrap()).unwrap();
    assert_eq!(ready["type"], "ready", "{ready}");
    let mut stdin = child.stdin.take().unwrap();
    for (i, line) in lines_sent.iter().enumerate() {
        let _ = stdin.write_all(line);
        let _ = stdin.write_all(b"\n");
        let _ = stdin.flush();
        let end = answer(&rx);
        let dead = matches!(end, End::Panic(_) | End::Hang(_));
        t.add(
            "engine protocol",
            &format!("line {i}: {}", clip(&String::from_utf8_lossy(line), 120)),
            end,
        );
        if dead {
            break;
        }
    }
    let _ = stdin.write_all(b"{\"type\":\"shutdown\"}\n");
    drop(stdin);
    let st = child.wait().unwrap();
    let end = if st.success() {
        End::Accepted
    } else {
        End::Panic(format!("exit {st} after shutdown"))
    };
    t.add("engine protocol", "shutdown", end);
    check_orphans(t, "engine protocol", &marker);
}

/// The oracle's parser (oracle/protocol.py: parse_line, parse_generate, validate) on the same
/// lines, in one plain python3 (it needs no torch).
fn oracle_parser(t: &mut Tally, lines_sent: &[Vec<u8>]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lines");
    let mut all = vec![];
    for l in lines_sent {
        all.extend_from_slice(l);
        all.push(b'\n');
    }
    std::fs::write(&file, all).unwrap();
    let script = r#"
import sys, traceback
from oracle.protocol import ProtocolError, Limits, parse_line, parse_generate, validate
for raw in open(sys.argv[1], "rb"):
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        print("named"); continue
    try:
        msg = parse_line(line)
        if msg["type"] == "generate":
            validate(parse_generate(msg), Limits(vocab_size=512, max_model_len=512, kv_capacity_tokens=1152))
        print("accepted")
    except ProtocolError as e:
        print("named" if e.code and e.message else "unnamed " + repr(e))
    except Exception as e:
        print("panic " + type(e).__name__ + ": " + str(e)[:200])
"#;
    let mut c = Command::new("python3");
    c.arg("-c").arg(script).arg(&file).env("PYTHONPATH", root());
    let r = tally::run(c, Duration::from_secs(120), |_| {});
    let verdicts: Vec<&str> = r.stdout.lines().collect();
    if verdicts.len() != lines_sent.len() {
        t.add(
            "oracle protocol",
            "the parser run",
            End::Panic(clip(&r.text(), 400)),
        );
        return;
    }
    for (i, v) in verdicts.iter().enumerate() {
        let end = match *v {
            "accepted" => End::Accepted,
            "named" => End::Named,
            v if v.starts_with("panic") => End::Panic(v.to_string()),
            v => End::Unnamed(v.to_string()),
        };
        t.add("oracle protocol", &format!("line {i}"), end);
    }
}

/// Hostile events: a fake leg mutating one event in four, against `orchestrator run`.
fn events(rng: &mut Rng, t: &mut Tally) {
    for i in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let seed = rng.next_u64() % 1_000_000;
        let fuzz = format!("--fault=fuzz-events --seed={seed}");
        let (e, o) = if i % 3 == 2 {
            ("", fuzz.as_str())
        } else {
            (fuzz.as_str(), "")
        };
        crate::units::write_unit(d, e, o);
        let marker = format!("hostile-events-{}-{i}", std::process::id());
        let mut c = orchestrator(&marker);
        c.arg("run")
            .arg(d.join("unit.toml"))
            .arg("--records-dir")
            .arg(d.join("records"))
            .arg("--lock-dir")
            .arg(d.join("locks"))
            .arg("--python")
            .arg(d.join("python.sh"));
        let r = tally::run(c, Duration::from_secs(60), |_| {});
        let recs = tally::records(t, "event fuzz", &d.join("records/fake"));
        check_recorded(t, "event fuzz", &r, 0, &recs);
        t.add(
            "event fuzz",
            &format!("seed {seed}"),
            judge_orchestrator(&r),
        );
        check_orphans(t, "event fuzz", &marker);
    }
}

pub fn run(rng: &mut Rng, t: &mut Tally) {
    let lines: Vec<Vec<u8>> = (0..300).map(|i| request_line(rng, i)).collect();
    engine_serve(t, &lines);
    oracle_parser(t, &lines);
    events(rng, t);
}
