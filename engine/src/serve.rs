//! `engine serve`: the leg protocol over stdin/stdout (docs/PROTOCOL.md).

use std::io::{BufRead, Write};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::generate::{Engine, Summary};
use crate::load::{self, LoadOptions};
use crate::protocol::{parse_request, Event, Kv, Request};

/// Loads the model, serves requests until `shutdown` or end of input, and returns the exit
/// status. `started` is the process start, so that `load_s` covers everything before `ready`.
pub fn serve(
    opts: &LoadOptions,
    started: Instant,
    input: impl BufRead,
    mut out: impl Write,
) -> i32 {
    let mut engine = match load::load(opts) {
        Ok(e) => e,
        Err(e) => {
            let _ = send(&mut out, &Event::error(None, &e));
            return 1;
        }
    };
    let pool = engine.backend().pool();
    let ready = Event::Ready {
        load_s: started.elapsed().as_secs_f64(),
        kv: Some(Kv {
            block_size: pool.block_size,
            num_blocks: pool.num_blocks,
            capacity_tokens: pool.capacity_tokens(),
            bytes: pool.bytes(),
            state_slots: (pool.state_slots > 0).then_some(pool.state_slots),
            state_bytes: (pool.state_slots > 0).then_some(pool.state_bytes()),
        }),
        features: engine.features(),
        versions: serde_json::json!({ "engine": env!("CARGO_PKG_VERSION") }),
        resolved: load::resolved(opts, &engine),
        pid: std::process::id(),
        pids: vec![std::process::id()],
    };
    if send(&mut out, &ready).is_err() {
        return 1;
    }
    for line in input.lines() {
        let Ok(line) = line else {
            let e = Error::MalformedRequest {
                message: "stdin is not valid UTF-8".into(),
            };
            if send(&mut out, &Event::error(None, &e)).is_err() {
                return 1;
            }
            continue;
        };
        if line.trim().is_empty() {
            continue;
        }
        let req = match parse_request(&line) {
            Ok(Request::Shutdown) => return 0,
            Ok(r) => r,
            Err((id, e)) => {
                if send(&mut out, &Event::error(id, &e)).is_err() {
                    return 1;
                }
                continue;
            }
        };
        let (id, outcome) = run(&mut engine, req, &mut out);
        let event = match &outcome {
            Ok(s) => Event::Done {
                id,
                wall_s: s.wall_s,
                tokens: s.tokens,
            },
            Err(e) => Event::error(Some(id), e),
        };
        if send(&mut out, &event).is_err() {
            return 1;
        }
        if outcome.as_ref().is_err_and(Error::is_fatal) {
            return 1;
        }
    }
    0
}

/// Validates and runs one `generate` or `verify` request, sending its per-prompt events;
/// returns its id and summary.
fn run(engine: &mut Engine, req: Request, out: &mut impl Write) -> (String, Result<Summary>) {
    match req {
        Request::Generate(g) => {
            let outcome = engine
                .validate(&g.prompts, g.max_tokens, g.ignore_eos, g.batch)
                .and_then(|valid| {
                    engine.generate(&valid, |r| {
                        let event = Event::Result {
                            id: g.id.clone(),
                            index: r.index,
                            tokens: r.tokens,
                            elapsed_s: r.elapsed_s,
                            ttft_s: r.ttft_s,
                        };
                        send(out, &event)
                    })
                });
            (g.id, outcome)
        }
        Request::Verify(v) => {
            let outcome = engine
                .validate_verify(&v.prompts, &v.forced, v.batch)
                .and_then(|valid| {
                    engine.verify(&valid, |r| {
                        let event = Event::Verified {
                            id: v.id.clone(),
                            index: r.index,
                            argmax: r.tokens,
                            gap: r.scores.iter().map(|s| s.gap as f64).collect(),
                            scale: Some(r.scores.iter().map(|s| s.scale as f64).collect()),
                            // Positions after the first come from the timed decode step; the
                            // first from the prefill, as a generated first token does.
                            path: "decode",
                        };
                        send(out, &event)
                    })
                });
            (v.id, outcome)
        }
        Request::Shutdown => unreachable!("shutdown is answered before a request runs"),
    }
}

fn send(out: &mut impl Write, event: &Event) -> Result<()> {
    writeln!(out, "{}", event.to_line())
        .and_then(|_| out.flush())
        .map_err(|e| Error::Internal {
            message: format!("cannot write to stdout: {e}"),
        })
}
