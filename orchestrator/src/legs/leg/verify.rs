//! The verify phase: after the battery, the leg is asked to teacher-force the golden's tokens at
//! each battery batch size the token gate needs (docs/PROTOCOL.md `verify`), under its own
//! watchdog deadline and phase mark, so that no timing or sampling window that feeds an axis
//! sees it. What it answered goes into the leg record (legs/verified.rs).

use std::time::Instant;

use super::LegRun;
use crate::legs::process::{Fault, LegProcess};
use crate::legs::progress::Progress;
use crate::legs::protocol::{Event, Request};
use crate::legs::record::PhaseTime;
use crate::legs::spec::{battery_row, filled};
use crate::legs::verified::{VerifiedRow, VerifyPlan, VerifyRecord};
use crate::legs::watchdog::Phase;

impl LegProcess {
    /// Teacher-forces `forced` after `prompts` at `batch`, every row of the request answered
    /// once.
    async fn verify(
        &mut self,
        id: &str,
        prompts: &[Vec<u32>],
        forced: &[Vec<u32>],
        batch: u32,
        prog: &mut Progress,
    ) -> Result<VerifyRecord, Fault> {
        let req = Request::Verify {
            id,
            prompts,
            forced,
            batch,
        };
        self.send(&req.line()).await?;
        let n = prompts.len();
        let mut rows: Vec<Option<VerifiedRow>> = vec![None; n];
        loop {
            match self.next_event().await? {
                Event::Verified(v) if v.id == id => {
                    let i = v.index;
                    let Some(forced) = forced.get(i) else {
                        return Err(Fault::Protocol(format!(
                            "sent a verified for index {i} of request {id:?}, which has {n} prompt(s)"
                        )));
                    };
                    if v.argmax.len() != forced.len() || v.gap.len() != forced.len() {
                        return Err(Fault::Protocol(format!(
                            "sent a verified for index {i} of request {id:?} with {} argmax and {} gap entries for {} forced tokens",
                            v.argmax.len(),
                            v.gap.len(),
                            forced.len()
                        )));
                    }
                    if rows[i].is_some() {
                        return Err(Fault::Protocol(format!(
                            "sent two verified for index {i} of request {id:?}"
                        )));
                    }
                    rows[i] = Some(VerifiedRow::of(&v, forced));
                    prog.tick(1);
                }
                Event::Done(d) if d.id == id => {
                    let missing: Vec<usize> = (0..n).filter(|&i| rows[i].is_none()).collect();
                    if !missing.is_empty() {
                        return Err(Fault::Protocol(format!(
                            "sent done for request {id:?} without verified for index(es) {missing:?}"
                        )));
                    }
                    return Ok(VerifyRecord {
                        id: id.to_string(),
                        batch,
                        wall_s: d.wall_s,
                        rows: rows.into_iter().flatten().collect(),
                    });
                }
                Event::Error(e) => return Err(Fault::ErrorEvent(e)),
                other => {
                    return Err(Fault::Protocol(format!(
                        "sent {} while request {id:?} was being answered",
                        other.describe()
                    )))
                }
            }
        }
    }
}

async fn verify_all(
    p: &mut LegProcess,
    plan: &VerifyPlan,
    done: &mut Vec<VerifyRecord>,
    prog: &mut Progress,
) -> Result<(), Fault> {
    for &batch in &plan.batches {
        // As the battery does (spec.rs `prompts_for`): a batch larger than the battery runs its
        // prompts over again, and each row names its battery prompt and repeat.
        let (prompts, forced) = (filled(&plan.prompts, batch), filled(&plan.forced, batch));
        let mut rec = p
            .verify(&format!("v-b{batch}"), &prompts, &forced, batch, prog)
            .await?;
        for row in &mut rec.rows {
            (row.index, row.copy) = battery_row(row.index, plan.prompts.len());
        }
        done.push(rec);
    }
    Ok(())
}

impl LegRun {
    /// The verify phase (nothing to do when the plan names no batch size). False when the leg
    /// failed in it: the failure is recorded as for any phase.
    pub async fn verify(&mut self, plan: &VerifyPlan) -> bool {
        if plan.batches.is_empty() || self.failed() {
            return !self.failed();
        }
        self.mark(Phase::Verify);
        let Some(p) = self.proc.as_mut() else {
            return false;
        };
        let total = plan
            .batches
            .iter()
            .map(|&b| plan.prompts.len().max(b as usize))
            .sum();
        let mut prog = Progress::start(self.record.leg.as_str(), "verify", total, self.quiet);
        let deadline = Phase::Verify.deadline(&self.wd);
        self.phase_started = Instant::now();
        let mut done = vec![];
        let r = tokio::time::timeout(deadline, verify_all(p, plan, &mut done, &mut prog)).await;
        self.record.verify.append(&mut done);
        let ok = self.settle(Phase::Verify, deadline, r).await.is_some();
        let el = prog.finish(if ok { "done" } else { "FAILED" });
        self.record.phases.push(PhaseTime {
            phase: Phase::Verify,
            elapsed_s: el,
            ok,
        });
        ok
    }
}
