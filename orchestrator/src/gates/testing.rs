//! What the gates' tests share: leg records with and without GPU samples, and one gate judged
//! over a pair of them.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Gate, GateInput, GateResult};
use crate::legs::sampler::summary::summarize;
use crate::legs::sampler::Row;
use crate::legs::LegRecord;
use crate::unit::Unit;

/// A leg record that ran its battery, with nothing sampled.
pub fn record(leg: &str) -> LegRecord {
    serde_json::from_value(serde_json::json!({
        "leg": leg, "argv": [], "log": "/x.log", "ready": null,
        "phases": [{"phase": "battery", "elapsed_s": 1.0, "ok": true}],
        "requests": [], "watchdog": null, "stragglers": [], "exit_status": 0,
        "failure": null, "host_mem": {"peak_rss_bytes": 0, "samples": 0, "period_ms": 100}
    }))
    .unwrap()
}

/// A GPU-sampled leg: `sm` MHz and busy throughout its battery, on boot "b".
pub fn sampled(leg: &str, sm: u32) -> LegRecord {
    let mut rows = vec![Row::Phase {
        t_us: 0,
        phase: "battery".into(),
    }];
    for i in 1..50u64 {
        let mut poll = Row::poll(i * 20_000, "battery", Some(sm));
        if let Row::Gpu {
            throttle,
            persistence,
            ..
        } = &mut poll
        {
            (*throttle, *persistence) = (Some(0), Some(true));
        }
        rows.push(poll);
        rows.push(Row::Util {
            t_us: i * 20_000,
            phase: "battery".into(),
            pct: 70,
            source: "buffer".into(),
        });
    }
    let mut r = record(leg);
    r.sampler.summary = Some(summarize(&rows));
    r.sampler.boot_id = Some("b".into());
    r.gpu_checked = true;
    r
}

/// `gate`'s verdicts on the pair, under a minimal unit.
pub fn judge(gate: &dyn Gate, engine: &LegRecord, oracle: &LegRecord) -> Vec<GateResult> {
    let unit = Unit::parse(
        Path::new("/x/unit.toml"),
        "name = \"t\"\nmodel = \"m\"\n[battery]\nprompts = \"p.json\"\n[[golden]]\nfile = \"g.json\"\n[oracle]\nbackend = \"transformers\"\n",
    )
    .unwrap();
    let goldens = BTreeMap::new();
    gate.judge(&GateInput {
        unit: &unit,
        goldens: &goldens,
        prompt_ids: &[],
        engine,
        oracle,
        kv_resize: None,
    })
}
