//! Synthetic run records in the shape `orchestrator run` writes (docs/RECORD.md), with known
//! shifts planted in the samples, for the report and compare tests.

use orchestrator::numbers::axes::{words, Better};
use serde_json::{json, Value};

/// A deterministic value in [-1, 1] for (seed, i): planted noise that never changes.
pub fn noise(seed: u64, i: u64) -> f64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % 2_000_001) as f64 / 1_000_000.0 - 1.0
}

#[derive(Clone)]
pub struct Synth {
    pub unit: String,
    pub tree: String,
    pub created: String,
    pub gpu: String,
    pub driver: String,
    pub vllm: String,
    pub repeat: u32,
    pub prompts: usize,
    /// How much longer each prompt's samples are than the one before (0.01 = 1% per prompt).
    pub spread: f64,
    /// Our per-token time and TTFT are multiplied by this, our throughput divided by it.
    pub engine_scale: f64,
    /// Both legs are multiplied by this (a faster or slower machine).
    pub machine_scale: f64,
    /// Relative amplitude of the planted noise on every sample.
    pub noise: f64,
    pub seed: u64,
    pub token_refused: bool,
    pub kv_refused: bool,
    /// The orchestrator_version the record claims (0.1.0 has a known erratum: record/archive.rs).
    pub version: String,
    /// The oracle's times are multiplied by this and its throughput divided (a host-bound
    /// oracle on a slower host).
    pub oracle_scale: f64,
    /// The host probe's figure before each leg, ms (none: a record without probes).
    pub probe_ms: Option<f64>,
    /// The engine leg's median SM clock over its battery (none: not sampled).
    pub engine_sm_mhz: Option<f64>,
    /// Batch 4 split into its prefill and decode step (records from orchestrator 0.5.0 on).
    pub batch_phases: bool,
}

impl Synth {
    pub fn new(unit: &str, tree: &str, created: &str) -> Synth {
        Synth {
            unit: unit.into(),
            tree: tree.into(),
            created: created.into(),
            gpu: "NVIDIA H200".into(),
            driver: "580.65.06".into(),
            vllm: "0.26.0".into(),
            repeat: 4,
            prompts: 5,
            spread: 0.01,
            engine_scale: 1.0,
            machine_scale: 1.0,
            noise: 0.002,
            seed: 1,
            token_refused: false,
            kv_refused: false,
            version: "0.2.0".into(),
            oracle_scale: 1.0,
            probe_ms: None,
            engine_sm_mhz: None,
            batch_phases: false,
        }
    }

    fn samples(&self, base_s: f64, leg_scale: f64, salt: u64) -> (Vec<Value>, Vec<f64>) {
        let mut v = vec![];
        let mut xs = vec![];
        for pass in 0..self.repeat {
            for p in 0..self.prompts {
                let i = u64::from(pass) * 100 + p as u64 + salt * 10_000;
                // Prompts differ in length, so samples are not all alike.
                let s = base_s
                    * (1.0 + self.spread * p as f64)
                    * leg_scale
                    * self.machine_scale
                    * (1.0 + self.noise * noise(self.seed, i));
                v.push(json!({"prompt": p, "pass": pass, "s": s}));
                xs.push(s);
            }
        }
        (v, xs)
    }

    fn throughput(&self, base: f64, leg_scale: f64, salt: u64) -> Vec<f64> {
        (0..self.repeat)
            .map(|pass| {
                base / leg_scale / self.machine_scale
                    * (1.0 + self.noise * noise(self.seed, u64::from(pass) + salt * 10_000))
            })
            .collect()
    }

    /// One time per repeat.
    fn per_repeat_s(&self, base_s: f64, leg_scale: f64, salt: u64) -> Vec<f64> {
        (0..self.repeat)
            .map(|pass| {
                base_s
                    * leg_scale
                    * self.machine_scale
                    * (1.0 + self.noise * noise(self.seed, u64::from(pass) + salt * 10_000))
            })
            .collect()
    }

    fn median(xs: &[f64]) -> f64 {
        stats::median(xs).unwrap()
    }

    pub fn record(&self) -> Value {
        let (e_pt, e_ptx) = self.samples(0.010, self.engine_scale, 1);
        let o = self.oracle_scale;
        let (o_pt, o_ptx) = self.samples(0.012, o, 2);
        let (e_tt, e_ttx) = self.samples(0.050, self.engine_scale, 3);
        let (o_tt, o_ttx) = self.samples(0.040, o, 4);
        let e_b1 = self.throughput(100.0, self.engine_scale, 5);
        let o_b1 = self.throughput(83.0, o, 6);
        let e_b4 = self.throughput(380.0, self.engine_scale, 7);
        let o_b4 = self.throughput(400.0, o, 8);
        let n = e_ptx.len();
        let mut axes = vec![];
        let mut axis = |name: String, unit: &str, better: Better, ours: f64, oracle: f64| {
            let b = better.as_str();
            let memory = matches!(better, Better::LessMemory | Better::Neither);
            axes.push(json!({
                "axis": name, "unit": unit, "better": b, "ours": ours, "oracle": oracle,
                "ratio": ours / oracle, "words": words(better, ours, oracle),
                "ours_refused": self.token_refused, "oracle_refused": false,
                "note": if self.kv_refused && memory {
                    Value::from(if better == Better::Neither { "could NOT be matched" } else { "KV pools not matched: raw, not like-for-like" })
                } else { Value::Null },
            }));
        };
        axis(
            format!("per output token, warm (median, n={n})"),
            "s",
            Better::Lower,
            Self::median(&e_ptx),
            Self::median(&o_ptx),
        );
        axis(
            "output throughput, batch 1".into(),
            "tok/s",
            Better::Higher,
            Self::median(&e_b1),
            Self::median(&o_b1),
        );
        axis(
            "output throughput, batch 4".into(),
            "tok/s",
            Better::Higher,
            Self::median(&e_b4),
            Self::median(&o_b4),
        );
        let phases = self.batch_phases.then(|| {
            [
                (
                    self.per_repeat_s(0.08, self.engine_scale, 9),
                    self.per_repeat_s(0.06, o, 10),
                ),
                (
                    self.per_repeat_s(0.005, self.engine_scale, 11),
                    self.per_repeat_s(0.0055, o, 12),
                ),
            ]
        });
        for (name, (e, o)) in ["prefill, batch 4", "decode step, batch 4"]
            .iter()
            .zip(phases.iter().flatten())
        {
            axis(
                name.to_string(),
                "s",
                Better::Lower,
                Self::median(e),
                Self::median(o),
            );
        }
        axis(
            "time to first token (median)".into(),
            "s",
            Better::Lower,
            Self::median(&e_ttx),
            Self::median(&o_ttx),
        );
        axis("load (to ready)".into(), "s", Better::Lower, 12.5, 61.0);
        axis(
            "peak host memory".into(),
            "MB",
            Better::LessMemory,
            2100.0,
            6400.0,
        );
        let kv_oracle = if self.kv_refused { 65536.0 } else { 8192.0 };
        axis(
            "KV pool".into(),
            "tokens",
            Better::Neither,
            8192.0,
            kv_oracle,
        );
        let mut gates = vec![
            json!({"gate": "leg", "leg": "engine", "verdict": "pass", "text": "ok", "sentence": "the engine leg loaded, ran its battery and shut down cleanly"}),
            json!({"gate": "leg", "leg": "oracle", "verdict": "pass", "text": "ok", "sentence": "the oracle leg loaded, ran its battery and shut down cleanly"}),
        ];
        let mut refusals: Vec<String> = vec![];
        if self.token_refused {
            let rows = self.prompts * self.repeat as usize * 2;
            let s = format!("The engine leg's tokens do not match the golden golden.json: TOKEN MATCH: {}/{} over {} prompt(s) (full rows={}, short rows=0); its timings are printed but refused. Engine: prompt p1 first differs at position 2 (repeat 1, batch 1): got 95, golden 94, not a near-tie (golden margin 0.5000). Hint: a mismatch at a near-tie is reduction-order noise that a golden captured on this device and dtype would absorb; one that is not is a correctness bug to bisect.", rows * 32 - 30, rows * 32, self.prompts, rows - 1);
            gates.push(json!({"gate": "token", "leg": "engine", "verdict": "refused",
                "refusal": {"refusal": "token_mismatch", "leg": "engine", "summary": "TOKEN MATCH", "golden": "golden.json", "mismatches": []},
                "sentence": s.clone()}));
            refusals.push(s);
        } else {
            gates.push(json!({"gate": "token", "leg": "engine", "verdict": "pass", "text": "TOKEN MATCH: all rows full against golden.json", "sentence": "TOKEN MATCH: all rows full against golden.json"}));
        }
        gates.push(json!({"gate": "token", "leg": "oracle", "verdict": "pass", "text": "TOKEN MATCH: all rows full against golden.json", "sentence": "TOKEN MATCH: all rows full against golden.json"}));
        if self.kv_refused {
            let s = "The KV pools could not be matched: engine 8192 tokens (512 blocks of 16), oracle 65536 tokens (128 blocks of 512), 57344 apart against a tolerance of 1 block(s), even after restarting the engine with --num-blocks 4096 (it first held 8192 tokens in 512 blocks of 16; the oracle holds 65536 tokens); the memory and KV axes are reported raw, not like-for-like. Hint: size the pools explicitly (engine num_blocks / kv_cache_memory, oracle num_gpu_blocks_override) to a capacity both block sizes divide.";
            gates.push(json!({"gate": "kv", "leg": null, "verdict": "refused",
                "refusal": {"refusal": "kv_unmatched", "engine": {}, "oracle": {}, "tolerance_blocks": 1, "resized": null},
                "sentence": s}));
            refusals.push(s.to_string());
        }
        let commit: String = self.tree.chars().rev().collect();
        let mut rec = json!({
            "schema": 1,
            "created_utc": self.created,
            "orchestrator_version": self.version,
            "command": ["orchestrator", "run", format!("goldens/{}/unit.toml", self.unit)],
            "unit": {"name": self.unit, "path": format!("/p/goldens/{}/unit.toml", self.unit), "config": {
                "name": self.unit, "model": "model",
                "battery": {"prompts": "prompts.json", "max_tokens": 32, "ignore_eos": true, "warmup": 1, "repeat": self.repeat, "batch_sizes": [1, 4]},
                "golden": [{"file": "golden.json", "device": "cuda", "dtype": "bfloat16"}],
                "engine": {"binary": "target/release/engine", "device": "cuda:0", "args": []},
                "oracle": {"backend": "vllm", "python": "python3", "device": "cuda", "dtype": "bfloat16", "options": {"enforce_eager": false}},
                "lease": {"lock_dir": "/tmp/llm-bench-locks", "idle_max_used_mib": 1024},
                "watchdog": {"load_s": 900, "warmup_s": 600, "battery_s": 3600, "shutdown_s": 30, "grace_s": 5}
            }},
            "project": {"root": "/p", "tree": self.tree, "commit": commit, "dirty": false},
            "engine_binary": {"path": "/p/target/release/engine", "sha256": null},
            "host": {"hostname": "gpu-box", "os": "Linux", "kernel": "6", "cpu_model": "x86", "cores": 16, "memory_bytes": 1, "boot_id": "b",
                "gpu": {"name": self.gpu, "driver": self.driver, "cuda": "13.0"}},
            "lease": {"target": "gpu0", "path": "/tmp/llm-bench-locks/gpu0.lock", "idle_checks": []},
            "legs": {
                "engine": {"leg": "engine", "ready": {"load_s": 12.5, "kv": null, "features": {"backend": "cuda", "degraded": []}, "versions": {"engine": "0.1.0"}, "resolved": {}}},
                "oracle": {"leg": "oracle", "ready": {"load_s": 61.0, "kv": null, "features": {"backend": "vllm"}, "versions": {"vllm": self.vllm, "torch": "2.9.0"}, "resolved": {}}}
            },
            "timings": {
                "engine": {"per_token_s": e_pt, "ttft_s": e_tt, "throughput_tok_s": {"1": e_b1, "4": e_b4}},
                "oracle": {"per_token_s": o_pt, "ttft_s": o_tt, "throughput_tok_s": {"1": o_b1, "4": o_b4}}
            },
            "gates": gates,
            "kv_resize": null,
            "axes": axes,
            "refusals": refusals,
            "exit_status": if self.token_refused || self.kv_refused { 1 } else { 0 }
        });
        for leg in ["engine", "oracle"] {
            if let Some(ms) = self.probe_ms {
                rec["legs"][leg]["host_probe"] =
                    json!({"best_ms": ms, "ms": [ms], "cpu_model": "x86", "kernel": "6"});
            }
        }
        if let Some([(ep, op), (es, os)]) = phases {
            for (leg, p, st) in [("engine", ep, es), ("oracle", op, os)] {
                rec["timings"][leg]["batch_prefill_s"] = json!({"4": p});
                rec["timings"][leg]["batch_step_s"] = json!({"4": st});
            }
        }
        if let Some(mhz) = self.engine_sm_mhz {
            rec["legs"]["engine"]["sampler"] = json!({"summary": {"sm_mhz": {"p5": mhz, "median": mhz, "p95": mhz, "spread_pct": 0.0}}});
        }
        rec
    }

    /// Writes the record to `<root>/<unit>/<stamp>-<tree8>.json` and returns its path.
    pub fn write(&self, root: &std::path::Path) -> std::path::PathBuf {
        let dir = root.join(&self.unit);
        std::fs::create_dir_all(&dir).unwrap();
        let stamp: String = self
            .created
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        let p = dir.join(format!("{stamp}-{}.json", &self.tree[..8]));
        let mut text = serde_json::to_string_pretty(&self.record()).unwrap();
        text.push('\n');
        std::fs::write(&p, text).unwrap();
        p
    }
}
