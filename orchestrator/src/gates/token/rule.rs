//! Which rule judges a leg's tokens at each battery batch size: **exact** match of the
//! free-running tokens where the golden was captured by the same implementation (backend) on
//! the same kind of device in the same dtype and the rows ran at batch 1 (what such a golden
//! reproduces bit for bit), and everywhere for a golden the unit marks `exact = true` (a
//! trained model's sharp logits leave no near-ties); **teacher-forced** everywhere else. The
//! run asks each leg to verify at the teacher-forced batch sizes, and at the exact ones where the
//! golden is its own ([`Rules::verified`]): rows that do not reproduce their own golden bit for
//! bit are then judged by teacher forcing (token.rs).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::leg_device_dtype;
use crate::legs::verified::VerifyPlan;
use crate::legs::LegRecord;
use crate::unit::{device_kind, Golden, GoldenRef, Prompt, Unit};

/// Every batch size the battery runs: 1 (the timing recipe's rows) and each of
/// `battery.batch_sizes`, ascending.
pub fn battery_batches(unit: &Unit) -> Vec<u32> {
    let mut v = vec![1];
    v.extend(unit.config.battery.batch_sizes.iter().copied());
    v.sort_unstable();
    v.dedup();
    v
}

/// The split of the battery's batch sizes between the two rules, for one leg.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rules {
    pub exact: Vec<u32>,
    pub forced: Vec<u32>,
    /// Why the exact rows are held to exact match, in words.
    pub exact_because: Option<String>,
    /// The golden was captured by this leg's own implementation, device and dtype.
    pub own: bool,
}

impl Rules {
    /// The batch sizes the leg verifies (is fed the golden's tokens at): the teacher-forced ones,
    /// and where the golden is its own, the exact ones too. An implementation that compiles and
    /// tunes its kernels afresh in each process (vLLM's torch.compile on Nemotron-H,
    /// docs/ORACLE.md) sums in another order than the process that captured its golden did, and
    /// parts from it at near-ties; its rows are then judged as another implementation's are.
    pub fn verified(&self) -> Vec<u32> {
        let mut v = self.forced.clone();
        if self.own {
            v.extend(&self.exact);
        }
        v.sort_unstable();
        v
    }
}

/// The rules for `leg` against the golden `gref` names.
pub fn rules(unit: &Unit, gref: &GoldenRef, golden: &Golden, leg: &LegRecord) -> Rules {
    let batches = battery_batches(unit);
    if gref.exact {
        return Rules {
            exact: batches,
            forced: vec![],
            exact_because: Some(format!(
                "the unit marks {} exact = true (its model's logits are sharp)",
                gref.file.display()
            )),
            own: false,
        };
    }
    let (device, dtype) = leg_device_dtype(unit, leg);
    let backend = leg.ready.as_ref().and_then(|r| r.backend());
    let cap = &golden.capture;
    let same = backend.is_some()
        && cap.backend.as_deref() == backend
        && device_kind(cap.device.as_deref().unwrap_or(&gref.device)) == device_kind(&device)
        && cap.dtype.as_deref().unwrap_or(&gref.dtype) == dtype;
    let (exact, forced) = batches.into_iter().partition(|&b| same && b == 1);
    Rules {
        exact,
        forced,
        own: same,
        exact_because: same.then(|| {
            format!(
                "{} was captured by the same implementation ({}) on {} in {dtype}, and these rows ran at batch 1",
                gref.file.display(),
                backend.unwrap_or_default(),
                device_kind(&device)
            )
        }),
    }
}

/// The golden entry and content that apply to `leg`, if any.
pub fn golden_of<'a>(
    unit: &'a Unit,
    goldens: &'a BTreeMap<PathBuf, Golden>,
    leg: &LegRecord,
) -> Option<(&'a GoldenRef, &'a Golden)> {
    let (device, dtype) = leg_device_dtype(unit, leg);
    let gref = unit.golden_for(&device, &dtype)?;
    Some((gref, goldens.get(&gref.file)?))
}

/// What the run asks `leg` to verify after its battery: the prompts, the golden's tokens cut to
/// the battery's max_tokens, at the batch sizes the teacher-forced rule judges (none: no verify
/// phase; also when no golden applies, which the token gate refuses on its own).
pub fn verify_plan(
    unit: &Unit,
    goldens: &BTreeMap<PathBuf, Golden>,
    prompts: &[Prompt],
    leg: &LegRecord,
) -> VerifyPlan {
    let Some((gref, golden)) = golden_of(unit, goldens, leg) else {
        return VerifyPlan::default();
    };
    let n = unit.config.battery.max_tokens as usize;
    let forced: Option<Vec<Vec<u32>>> = prompts
        .iter()
        .map(|p| {
            golden
                .output(&p.id)
                .map(|o| o.tokens[..o.tokens.len().min(n)].to_vec())
        })
        .collect();
    match forced {
        Some(forced) => VerifyPlan {
            prompts: prompts.iter().map(|p| p.tokens.clone()).collect(),
            forced,
            batches: rules(unit, gref, golden, leg).verified(),
        },
        None => VerifyPlan::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn unit(exact: bool) -> Unit {
        Unit::parse(
            Path::new("/u/unit.toml"),
            &format!(
                "name = \"u\"\nmodel = \"m\"\n[battery]\nprompts = \"p.json\"\nbatch_sizes = [1, 8]\n\
                 [[golden]]\nfile = \"g.json\"\ndevice = \"cuda\"\ndtype = \"bfloat16\"\nexact = {exact}\n\
                 [engine]\ndevice = \"cuda:0\"\n[oracle]\nbackend = \"vllm\"\ndevice = \"cuda\"\ndtype = \"bfloat16\"\n"
            ),
        )
        .unwrap()
    }

    fn golden() -> Golden {
        serde_json::from_value(serde_json::json!({
            "schema": 1, "max_tokens": 4,
            "capture": {"backend": "vllm", "device": "cuda", "dtype": "bfloat16"},
            "outputs": [{"id": "p0", "tokens": [1, 2, 3, 4, 5]}]
        }))
        .unwrap()
    }

    fn leg(name: &str, backend: &str) -> LegRecord {
        let mut l = crate::gates::testing::record(name);
        l.ready = Some(
            serde_json::from_value(serde_json::json!({"load_s": 1.0, "kv": null,
                "features": {"backend": backend, "device": "cuda", "dtype": "bfloat16"}}))
            .unwrap(),
        );
        l
    }

    #[test]
    fn the_goldens_own_implementation_is_exact_at_batch_1_only() {
        let (u, g) = (unit(false), golden());
        let r = rules(&u, &u.config.golden[0], &g, &leg("oracle", "vllm"));
        assert_eq!((r.exact, r.forced), (vec![1], vec![8]));
        assert_eq!(
            r.exact_because.as_deref(),
            Some("g.json was captured by the same implementation (vllm) on cuda in bfloat16, and these rows ran at batch 1")
        );
        let r = rules(&u, &u.config.golden[0], &g, &leg("engine", "cuda"));
        assert_eq!((r.exact, r.forced), (vec![], vec![1, 8]));
    }

    #[test]
    fn a_leg_verifies_its_own_goldens_exact_batches_too_and_no_others() {
        let (u, g) = (unit(false), golden());
        // The oracle against its own golden: batch 1 exact, and verified there too, so that rows
        // parting from that golden at near-ties can be judged as the engine's are.
        let own = rules(&u, &u.config.golden[0], &g, &leg("oracle", "vllm"));
        assert_eq!(own.verified(), vec![1, 8]);
        // The engine against vLLM's golden: every batch teacher-forced, each verified once.
        let other = rules(&u, &u.config.golden[0], &g, &leg("engine", "cuda"));
        assert_eq!(other.verified(), vec![1, 8]);
        // A golden marked exact is no leg's own: its exact rows are held exact, nothing verified.
        let marked = unit(true);
        let r = rules(
            &marked,
            &marked.config.golden[0],
            &g,
            &leg("oracle", "vllm"),
        );
        assert_eq!((r.exact.clone(), r.verified()), (vec![1, 8], vec![]));
        // The run's plan asks for the same.
        let goldens = BTreeMap::from([(PathBuf::from("g.json"), g)]);
        let prompts = vec![Prompt {
            id: "p0".into(),
            tokens: vec![9],
        }];
        assert_eq!(
            verify_plan(&u, &goldens, &prompts, &leg("oracle", "vllm")).batches,
            vec![1, 8]
        );
        assert!(
            verify_plan(&marked, &goldens, &prompts, &leg("oracle", "vllm"))
                .batches
                .is_empty()
        );
    }

    #[test]
    fn a_golden_marked_exact_holds_every_leg_and_batch_to_exact_match() {
        let (u, g) = (unit(true), golden());
        let r = rules(&u, &u.config.golden[0], &g, &leg("engine", "cuda"));
        assert_eq!((r.exact, r.forced), (vec![1, 8], vec![]));
    }

    #[test]
    fn the_verify_plan_forces_the_goldens_tokens_cut_to_max_tokens() {
        let u = {
            let mut u = unit(false);
            u.config.battery.max_tokens = 3;
            u
        };
        let goldens = BTreeMap::from([(PathBuf::from("g.json"), golden())]);
        let prompts = vec![Prompt {
            id: "p0".into(),
            tokens: vec![9, 9],
        }];
        let p = verify_plan(&u, &goldens, &prompts, &leg("engine", "cuda"));
        assert_eq!(
            (p.prompts, p.forced, p.batches),
            (vec![vec![9, 9]], vec![vec![1, 2, 3]], vec![1, 8])
        );
        assert!(
            verify_plan(&u, &BTreeMap::new(), &prompts, &leg("engine", "cuda"))
                .batches
                .is_empty()
        );
    }
}
