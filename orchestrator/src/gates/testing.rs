//! What the gates' tests share: leg records with and without GPU samples, and one gate judged
//! over a pair of them.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Gate, GateInput, GateResult};
use crate::legs::protocol::PromptResult;
use crate::legs::record::{RequestKind, RequestRecord};
use crate::legs::sampler::summary::summarize;
use crate::legs::sampler::Row;
use crate::legs::watchdog::Phase;
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

/// `gate`'s verdicts on the pair as `judge_all` gives them (a leg not run: not applicable).
pub fn judge_with(gate: &dyn Gate, engine: &LegRecord, oracle: &LegRecord) -> Vec<GateResult> {
    with_input(engine, oracle, |input| {
        super::absent::judge_present(gate, input)
    })
}

/// `gate`'s verdicts on the pair, under a minimal unit.
pub fn judge(gate: &dyn Gate, engine: &LegRecord, oracle: &LegRecord) -> Vec<GateResult> {
    with_input(engine, oracle, |input| gate.judge(input))
}

fn with_input(
    engine: &LegRecord,
    oracle: &LegRecord,
    f: impl FnOnce(&GateInput) -> Vec<GateResult>,
) -> Vec<GateResult> {
    let unit = Unit::parse(
        Path::new("/x/unit.toml"),
        "name = \"t\"\nmodel = \"m\"\n[battery]\nprompts = \"p.json\"\n[[golden]]\nfile = \"g.json\"\n[oracle]\nbackend = \"transformers\"\n",
    )
    .unwrap();
    let goldens = BTreeMap::new();
    f(&GateInput {
        unit: &unit,
        goldens: &goldens,
        prompt_ids: &[],
        engine,
        oracle,
        kv_resize: None,
    })
}

/// A leg whose battery holds, per (pass, batch), one request with these rows.
pub fn battery(leg: &str, rows: Vec<(u32, u32, Vec<Vec<u32>>)>) -> LegRecord {
    let mut l = record(leg);
    l.requests = rows
        .into_iter()
        .map(|(pass, batch, toks)| RequestRecord {
            id: format!("r{pass}-b{batch}"),
            phase: Phase::Battery,
            pass,
            kind: if batch == 1 {
                RequestKind::Decode
            } else {
                RequestKind::Batch
            },
            batch,
            max_tokens: 4,
            wall_s: 1.0,
            results: toks
                .into_iter()
                .enumerate()
                .map(|(i, tokens)| PromptResult {
                    id: format!("r{pass}"),
                    index: i,
                    tokens,
                    elapsed_s: 0.1,
                    ttft_s: None,
                    copy: 0,
                })
                .collect(),
        })
        .collect();
    l
}
