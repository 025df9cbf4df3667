//! The load axis: each leg's time from start to `ready`, of its first start in the run, and
//! the note that says what each load compiled or timed and whether a cache had it.

use crate::legs::protocol::{LoadCache, Ready};
use crate::legs::{LegName, LegRecord};
use crate::util::fmt::fmt_num;

/// The axis of each leg's time from start to `ready`.
pub const LOAD: &str = "load (to ready)";

/// The start that ran the leg's battery, where the kv gate restarted it after a first one.
fn restarted(l: &LegRecord) -> Option<&Ready> {
    if l.prior_starts.iter().any(|p| p.ready.is_some()) {
        l.ready.as_ref()
    } else {
        None
    }
}

/// The leg's first start in this run: where the kv gate restarted it, the start before. The
/// load axis times that one: the restart loads on the caches the first start filled, a cost of
/// the orchestrator's procedure rather than of the leg.
pub fn first_start(l: &LegRecord) -> Option<&Ready> {
    l.prior_starts
        .iter()
        .find_map(|p| p.ready.as_ref())
        .or(l.ready.as_ref())
}

/// What each leg's load compiled or timed and whether a cache had it (`features.load_cache`):
/// a load that skipped its compile because an earlier process left the output is no measure of
/// a cold start, so a ratio between a warm leg and a cold one is named as not like for like;
/// and a leg the kv gate restarted is named, with what its second load took. None where neither
/// leg says anything of this (records older than the field).
pub fn note(engine: &LegRecord, oracle: &LegRecord) -> Option<String> {
    let caches = [engine, oracle].map(|l| (l.leg, first_start(l).map(|r| r.load_cache())));
    if caches.iter().all(|(_, c)| !matches!(c, Some(Some(_))))
        && restarted(engine).is_none()
        && restarted(oracle).is_none()
    {
        return None;
    }
    let parts: Vec<String> = [engine, oracle]
        .iter()
        .zip(&caches)
        .filter_map(|(l, (leg, c))| {
            let what = match c.as_ref()? {
                Some(c) => format!("{leg}: {c}"),
                None => format!("{leg}: not reported"),
            };
            Some(match restarted(l) {
                Some(second) => format!(
                    "{what}, its first start (the kv gate's restart then loaded in {} s, {})",
                    fmt_num(second.load_s),
                    second
                        .load_cache()
                        .map_or("not reported".to_string(), |c| c.to_string())
                ),
                None => what,
            })
        })
        .collect();
    let warm: Vec<LegName> = caches
        .iter()
        .filter(|(_, c)| matches!(c, Some(Some(c)) if c.from_cache()))
        .map(|(leg, _)| *leg)
        .collect();
    let known = caches.iter().all(|(_, c)| {
        matches!(
            c,
            Some(Some(
                LoadCache::None | LoadCache::Cold(_) | LoadCache::Warm(_) | LoadCache::Partial(_)
            ))
        )
    });
    let unlike = match warm.as_slice() {
        [leg] if known => format!(
            "NOT ALIKE: the {leg}'s load took work from a cache an earlier process left and the other's did not, so this ratio flatters the {leg} (a leg's docs say where its caches live: empty them, or warm both, and rerun); "
        ),
        _ => String::new(),
    };
    Some(format!("{unlike}{}", parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numbers::axes::axes;
    use crate::numbers::timing::Timings;

    #[test]
    fn a_warm_load_beside_a_cold_one_is_named_not_alike() {
        let leg = |name: &str, load_cache: Option<serde_json::Value>| {
            let mut l = crate::gates::testing::record(name);
            let mut features = serde_json::json!({"backend": "x", "degraded": []});
            if let Some(c) = load_cache {
                features["load_cache"] = c;
            }
            l.ready = Some(
                serde_json::from_value(
                    serde_json::json!({"load_s": 2.0, "kv": null, "features": features}),
                )
                .unwrap(),
            );
            l
        };
        let cache =
            |state: &str, detail: &str| Some(serde_json::json!({"state": state, "detail": detail}));
        let load_axis = |e: &LegRecord, o: &LegRecord| {
            let t = Timings::default();
            axes(e, o, &t, &t, &[])
                .into_iter()
                .find(|a| a.axis == LOAD)
                .unwrap()
        };
        let note = |e: &LegRecord, o: &LegRecord| load_axis(e, o).note;
        let engine_cold = leg("engine", cache("cold", "kernels done afresh"));
        let oracle_warm = leg("oracle", cache("warm", "torch.compile: 3 graph(s) loaded"));
        let n = note(&engine_cold, &oracle_warm).unwrap();
        assert!(
            n.starts_with("NOT ALIKE: the oracle's load took work from a cache"),
            "{n}"
        );
        assert!(n.contains("flatters the oracle"), "{n}");
        assert!(
            n.ends_with("engine: cold (kernels done afresh); oracle: warm (torch.compile: 3 graph(s) loaded)"),
            "{n}"
        );
        // Both cold, or one with nothing to compile: alike, each named.
        let engine_none = leg("engine", cache("none", "nothing compiled or timed at load"));
        let oracle_cold = leg(
            "oracle",
            cache("cold", "torch.compile: 3 graph(s) compiled afresh"),
        );
        let n = note(&engine_none, &oracle_cold).unwrap();
        assert!(!n.contains("NOT ALIKE"), "{n}");
        assert!(
            n.starts_with("engine: nothing compiled or timed; oracle: cold"),
            "{n}"
        );
        let n = note(&engine_cold, &leg("oracle", cache("partial", "x"))).unwrap();
        assert!(
            n.contains("flatters the oracle") && n.contains("oracle: partly warm (x)"),
            "{n}"
        );
        // A leg that does not say: named so, and no verdict on likeness; neither: no note.
        let n = note(&leg("engine", None), &oracle_warm).unwrap();
        assert_eq!(
            n,
            "engine: not reported; oracle: warm (torch.compile: 3 graph(s) loaded)"
        );
        assert_eq!(note(&leg("engine", None), &leg("oracle", None)), None);
        // The kv gate restarted the engine: its first start is what the axis times, the warm
        // second one is named beside it.
        let mut restarted = leg("engine", cache("warm", "kernels from the cache"));
        let first = leg("engine", cache("cold", "kernels done afresh"));
        let mut first_ready = first.ready.unwrap();
        first_ready.load_s = 48.5;
        restarted.prior_starts = vec![serde_json::from_value(serde_json::json!({
            "argv": [], "log": "/x.log", "ready": first_ready, "reason": "kv",
            "stragglers": [], "exit_status": 0
        }))
        .unwrap()];
        let oracle_cold = leg(
            "oracle",
            cache("cold", "torch.compile: 3 graph(s) compiled afresh"),
        );
        let load = load_axis(&restarted, &oracle_cold);
        assert_eq!((load.ours, load.oracle), (Some(48.5), Some(2.0)));
        let n = load.note.unwrap();
        assert!(!n.contains("NOT ALIKE"), "{n}");
        assert!(
            n.starts_with("engine: cold (kernels done afresh), its first start (the kv gate's restart then loaded in 2.000 s, warm (kernels from the cache)); oracle: cold"),
            "{n}"
        );
        let odd = leg("oracle", cache("lukewarm", ""));
        let engine_warm = leg("engine", cache("warm", "kernels from the cache"));
        let n = note(&engine_warm, &odd).unwrap();
        assert!(
            !n.contains("NOT ALIKE") && n.contains("a load_cache the protocol does not define"),
            "{n}"
        );
    }
}
