//! Unit files and their data files, mutated: a key set to a hostile value, removed, misspelt,
//! the file cut or a byte changed; prompts, goldens and config.json with ids outside the
//! vocabulary, short outputs, wrong types. Each goes through `orchestrator check`; those with
//! one mutation also through `orchestrator run` over the fake legs, whose record must be whole.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::tally::{self, check_orphans, Tally};
use crate::{check_recorded, judge_orchestrator, orchestrator, Rng};

const PROMPTS: [&[u32]; 3] = [&[1, 2, 3], &[4, 5], &[6, 7, 8, 9]];

/// (table, key): every key a unit file has; "" is the top level, "golden" the [[golden]] entry.
const KEYS: &[(&str, &str)] = &[
    ("", "name"),
    ("", "model"),
    ("battery", "prompts"),
    ("battery", "max_tokens"),
    ("battery", "ignore_eos"),
    ("battery", "warmup"),
    ("battery", "repeat"),
    ("battery", "batch_sizes"),
    ("golden", "file"),
    ("golden", "device"),
    ("golden", "dtype"),
    ("engine", "binary"),
    ("engine", "device"),
    ("engine", "block_size"),
    ("engine", "num_blocks"),
    ("engine", "kv_cache_memory"),
    ("engine", "max_batch"),
    ("engine", "args"),
    ("oracle", "backend"),
    ("oracle", "device"),
    ("oracle", "dtype"),
    ("gates", "near_tie_margin"),
    ("gates", "kv_match"),
    ("gates", "kv_tolerance_blocks"),
    ("gates", "golden_config_ignore"),
    ("gates", "clock_min_busy_pct"),
    ("gates", "clock_basis"),
    ("lease", "gpu"),
    ("lease", "idle_max_used_mib"),
    ("watchdog", "load_s"),
    ("watchdog", "warmup_s"),
    ("watchdog", "battery_s"),
    ("watchdog", "shutdown_s"),
    ("watchdog", "grace_s"),
    ("watchdog", "stall_factor"),
    ("watchdog", "stall_min_s"),
    ("sampler", "nvml_period_ms"),
    ("sampler", "host_period_ms"),
];

/// Values a careless hand types.
const VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "7",
    "1e300",
    "-1e300",
    "inf",
    "nan",
    "1.5",
    "18446744073709551615",
    "9223372036854775807",
    "4294967296",
    "\"\"",
    "\"a\\nb\"",
    "\"../x\"",
    "\"/\"",
    "\"cuda:99\"",
    "\"float64\"",
    "\"cpu\"",
    "\"cuda\"",
    "\"vllm\"",
    "\"off\"",
    "true",
    "false",
    "[]",
    "[0]",
    "[1, 1000000]",
    "[1, 2]",
    "{}",
    "\"x\"",
    "\"\\u0000\"",
    "1970-01-01",
    "[\"a\", 1]",
];

/// Writes the fake unit the mutations start from (8-token golden, a 1000-token vocabulary,
/// the fake legs run with `engine_args` / `oracle_args`) into `d`; returns unit.toml's text.
pub fn write_unit(d: &Path, engine_args: &str, oracle_args: &str) -> String {
    let engine = crate::common::write_fake_unit(d, &PROMPTS, engine_args, oracle_args);
    std::fs::write(
        d.join("model/config.json"),
        r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "vocab_size": 1000, "eos_token_id": [2, 7]}"#,
    )
    .unwrap();
    let text = format!(
        r#"name = "fake"
model = "model"
[battery]
prompts = "prompts.json"
max_tokens = 8
warmup = 1
repeat = 2
batch_sizes = [1, 2]
[[golden]]
file = "golden.json"
device = "cpu"
dtype = "float32"
[engine]
binary = "{}"
block_size = 16
num_blocks = 64
max_batch = 4
[oracle]
backend = "transformers"
device = "cpu"
dtype = "float32"
[gates]
near_tie_margin = 0.001
[lease]
idle_max_used_mib = 1024
[watchdog]
load_s = 10
warmup_s = 5
battery_s = 5
shutdown_s = 3
grace_s = 0.5
[sampler]
host_period_ms = 100
"#,
        engine.display()
    );
    std::fs::write(d.join("unit.toml"), &text).unwrap();
    text
}

/// `key = value` in `table` of a TOML text: replaced where present, else added at the table's
/// start (the top level's start for "").
fn set_key(text: &str, table: &str, key: &str, value: &str) -> String {
    let header = match table {
        "" => None,
        "golden" => Some("[[golden]]".to_string()),
        t => Some(format!("[{t}]")),
    };
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut current: Option<String> = None;
    let (mut at, mut found) = (if header.is_none() { Some(0) } else { None }, None);
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with('[') {
            current = Some(l.trim().to_string());
            if current == header {
                at = Some(i + 1);
            }
        } else if current == header && l.split('=').next().map(str::trim) == Some(key) {
            found = Some(i);
            break;
        }
    }
    let line = format!("{key} = {value}");
    match (found, at) {
        (Some(i), _) => lines[i] = line,
        (None, Some(i)) => lines.insert(i, line),
        (None, None) => {
            lines.push(header.unwrap_or_default());
            lines.push(line);
        }
    }
    lines.join("\n") + "\n"
}

fn remove_key(text: &str, key: &str) -> String {
    text.lines()
        .filter(|l| l.split('=').next().map(str::trim) != Some(key))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// One JSON data file changed: a value made hostile somewhere inside it.
fn mutate_json(rng: &mut Rng, v: &mut serde_json::Value) {
    use serde_json::json;
    let nasty = [
        json!(-1),
        json!(1000),
        json!(4294967296u64),
        json!(1e300),
        json!("x"),
        json!(null),
        json!([]),
        json!({}),
        json!(0),
        json!(2),
        json!([1, 2]),
        json!(true),
    ];
    let mut node = v;
    loop {
        let keys: Vec<String> = match node {
            serde_json::Value::Object(m) => m.keys().cloned().collect(),
            serde_json::Value::Array(a) => (0..a.len()).map(|i| i.to_string()).collect(),
            _ => vec![],
        };
        if keys.is_empty() || rng.chance(3) {
            break;
        }
        let k = rng.pick(&keys).clone();
        node = match node {
            serde_json::Value::Object(m) => m.get_mut(&k).unwrap(),
            serde_json::Value::Array(a) => &mut a[k.parse::<usize>().unwrap()],
            _ => unreachable!(),
        };
    }
    match rng.below(4) {
        0 if node.is_array() => {
            let a = node.as_array_mut().unwrap();
            let keep = rng.below(a.len() + 1);
            a.truncate(keep);
        }
        1 if node.is_object() => {
            let m = node.as_object_mut().unwrap();
            if let Some(k) = m.keys().next().cloned() {
                m.remove(&k);
            }
        }
        _ => *node = rng.pick(&nasty).clone(),
    }
}

/// One mutation of the unit directory `d` (unit text in `text`); returns what it did.
fn mutate(rng: &mut Rng, d: &Path, text: &mut String) -> String {
    match rng.below(10) {
        0..=3 => {
            let (table, key) = *rng.pick(KEYS);
            let v = *rng.pick(VALUES);
            *text = set_key(text, table, key, v);
            format!("[{table}] {key} = {v}")
        }
        4 => {
            let (_, key) = *rng.pick(KEYS);
            *text = remove_key(text, key);
            format!("removed {key}")
        }
        5 => {
            let (table, _) = *rng.pick(KEYS);
            *text = set_key(text, table, "repeats", "2");
            format!("[{table}] unknown key")
        }
        6 => {
            let mut b = text.clone().into_bytes();
            let i = rng.below(b.len());
            match rng.below(3) {
                0 => b.truncate(i),
                1 => b[i] = rng.below(256) as u8,
                _ => b.insert(i, *rng.pick(b"\"[]=\n\\\x00")),
            }
            *text = String::from_utf8_lossy(&b).into_owned();
            format!("unit.toml bytes changed at {i}")
        }
        n => {
            let file = match n {
                7 => "prompts.json",
                8 => "golden.json",
                _ => "model/config.json",
            };
            let p = d.join(file);
            let mut v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap_or_default();
            mutate_json(rng, &mut v);
            let mut s = v.to_string();
            if rng.chance(8) {
                s.truncate(rng.below(s.len()));
            }
            std::fs::write(&p, s).unwrap();
            format!("{file} changed")
        }
    }
}

pub fn run(rng: &mut Rng, t: &mut Tally) {
    for i in 0..160 {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut text = write_unit(d, "", "");
        let n = 1 + rng.below(2);
        let what: Vec<String> = (0..n).map(|_| mutate(rng, d, &mut text)).collect();
        std::fs::write(d.join("unit.toml"), &text).unwrap();
        let what = what.join("; ");
        let marker = format!("hostile-unit-{}-{i}", std::process::id());
        let python: PathBuf = d.join("python.sh");
        let mut c = orchestrator(&marker);
        c.arg("check")
            .arg(d.join("unit.toml"))
            .arg("--python")
            .arg(&python);
        let r = tally::run(c, Duration::from_secs(30), |_| {});
        t.add("unit check", &what, judge_orchestrator(&r));
        check_orphans(t, "unit check", &marker);
        // One mutation in three also runs, over the fake legs.
        if n == 1 && rng.chance(3) {
            let mut c = orchestrator(&marker);
            c.arg("run")
                .arg(d.join("unit.toml"))
                .arg("--records-dir")
                .arg(d.join("records"))
                .arg("--lock-dir")
                .arg(d.join("locks"))
                .arg("--python")
                .arg(&python);
            let r = tally::run(c, Duration::from_secs(60), |_| {});
            let end = judge_orchestrator(&r);
            let recs = d.join("records");
            let dirs: Vec<PathBuf> = std::fs::read_dir(&recs)
                .map(|rd| rd.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            let mut all = vec![];
            for u in &dirs {
                all.extend(tally::records(t, "unit run", u));
            }
            check_recorded(t, "unit run", &r, 0, &all);
            t.add("unit run", &what, end);
            check_orphans(t, "unit run", &marker);
        }
    }
}
