//! `engine serve`: the leg protocol over stdin/stdout (docs/PROTOCOL.md).

use std::io::{BufRead, Write};
use std::time::Instant;

use crate::error::{Error, Result};
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
        }),
        features: engine.backend().features(),
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
            Ok(Request::Generate(g)) => g,
            Err((id, e)) => {
                if send(&mut out, &Event::error(id, &e)).is_err() {
                    return 1;
                }
                continue;
            }
        };
        let outcome = engine
            .validate(&req.prompts, req.max_tokens, req.ignore_eos, req.batch)
            .and_then(|valid| {
                engine.generate(&valid, |r| {
                    send(
                        &mut out,
                        &Event::Result {
                            id: req.id.clone(),
                            index: r.index,
                            tokens: r.tokens,
                            elapsed_s: r.elapsed_s,
                            ttft_s: r.ttft_s,
                        },
                    )
                })
            });
        let event = match &outcome {
            Ok(s) => Event::Done {
                id: req.id.clone(),
                wall_s: s.wall_s,
                tokens: s.tokens,
            },
            Err(e) => Event::error(Some(req.id.clone()), e),
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

fn send(out: &mut impl Write, event: &Event) -> Result<()> {
    writeln!(out, "{}", event.to_line())
        .and_then(|_| out.flush())
        .map_err(|e| Error::Internal {
            message: format!("cannot write to stdout: {e}"),
        })
}
