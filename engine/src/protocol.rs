//! The leg protocol's messages (docs/PROTOCOL.md): requests parsed from stdin lines, events
//! written to stdout as one JSON object per line.

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Unknown fields are refused (`malformed_request`, naming them), never ignored: a field the leg
/// does not know would change what the orchestrator believes it asked for (docs/PROTOCOL.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    pub id: String,
    /// Signed so that a negative id is reported as a bad token, not as malformed JSON.
    pub prompts: Vec<Vec<i64>>,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub batch: usize,
}

/// Teacher forcing (docs/PROTOCOL.md `verify`): each prompt decoded feeding `forced`. Unknown
/// fields are refused, as for `generate`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyRequest {
    pub id: String,
    pub prompts: Vec<Vec<i64>>,
    pub forced: Vec<Vec<i64>>,
    pub batch: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Generate(GenerateRequest),
    Verify(VerifyRequest),
    Shutdown,
}

/// Parses one request line. On failure, the request's `id` is returned too where it could be
/// read, so the error event can name the request.
pub fn parse_request(line: &str) -> Result<Request, (Option<String>, Error)> {
    let malformed = |id: Option<String>, message: String| (id, Error::MalformedRequest { message });
    let mut value: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| malformed(None, format!("the line is not JSON ({e}): {}", clip(line))))?;
    let id = value.get("id").and_then(|v| v.as_str()).map(String::from);
    let Some(kind) = value.get("type").and_then(|t| t.as_str()).map(String::from) else {
        return Err(malformed(
            id,
            format!("no string \"type\" field in {}", clip(line)),
        ));
    };
    // The fields other than "type", for a struct that denies unknown ones.
    if let Some(obj) = value.as_object_mut() {
        obj.remove("type");
    }
    match kind.as_str() {
        "generate" => serde_json::from_value(value)
            .map(Request::Generate)
            .map_err(|e| malformed(id, format!("generate: {e}"))),
        "verify" => serde_json::from_value(value)
            .map(Request::Verify)
            .map_err(|e| malformed(id, format!("verify: {e}"))),
        "shutdown" => match value.as_object().map(|o| o.keys().collect::<Vec<_>>()) {
            Some(keys) if keys.is_empty() => Ok(Request::Shutdown),
            keys => Err(malformed(
                id,
                format!("shutdown takes no fields, got {keys:?}"),
            )),
        },
        other => Err(malformed(
            id,
            format!(
                "unknown request type {other:?} (expected \"generate\", \"verify\" or \"shutdown\")"
            ),
        )),
    }
}

fn clip(line: &str) -> String {
    const MAX: usize = 200;
    match line.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &line[..i]),
        None => line.to_string(),
    }
}

/// The longest `message` an error event carries, in characters.
pub const MAX_MESSAGE: usize = 4000;

#[derive(Debug, Clone, Serialize)]
pub struct Kv {
    pub block_size: usize,
    pub num_blocks: usize,
    pub capacity_tokens: usize,
    pub bytes: usize,
    /// A hybrid's per-sequence recurrent states beside the blocks (its Mamba layers): how many
    /// sequences' states the pool holds, and their bytes. Absent for the Llama family.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_slots: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_bytes: Option<usize>,
}

/// `ready.features.load_cache` (docs/PROTOCOL.md): whether the work a load compiles or times
/// came from a cache left by an earlier process, so that a load time is read beside a peer's
/// that did the same work. `parts` are (that work, whether it came from the cache); none: the
/// load compiles and times nothing.
pub fn load_cache(parts: &[(&str, bool)]) -> serde_json::Value {
    let names = |cached: bool| -> Vec<&str> {
        parts
            .iter()
            .filter(|p| p.1 == cached)
            .map(|p| p.0)
            .collect()
    };
    let (cached, fresh) = (names(true), names(false));
    let (state, detail) = match (cached.is_empty(), fresh.is_empty()) {
        (true, true) => ("none", "nothing compiled or timed at load".to_string()),
        (false, true) => ("warm", format!("{} from the cache", and_list(&cached))),
        (true, false) => ("cold", format!("{} done afresh", and_list(&fresh))),
        (false, false) => (
            "partial",
            format!(
                "{} from the cache; {} done afresh",
                and_list(&cached),
                and_list(&fresh)
            ),
        ),
    };
    serde_json::json!({"state": state, "detail": detail})
}

/// "a", "a and b", "a, b and c".
fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Ready {
        load_s: f64,
        kv: Option<Kv>,
        features: serde_json::Value,
        versions: serde_json::Value,
        resolved: serde_json::Value,
        pid: u32,
        pids: Vec<u32>,
    },
    Result {
        id: String,
        index: usize,
        tokens: Vec<u32>,
        elapsed_s: f64,
        ttft_s: f64,
    },
    /// One prompt's verify scores. JSON has no NaN: a NaN `gap` or `scale` (NaN logits) is
    /// written as `null`.
    Verified {
        id: String,
        index: usize,
        argmax: Vec<u32>,
        gap: Vec<f64>,
        scale: Option<Vec<f64>>,
        path: &'static str,
    },
    Done {
        id: String,
        wall_s: f64,
        tokens: usize,
    },
    Error {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        code: &'static str,
        message: String,
        fatal: bool,
    },
}

impl Event {
    /// The error event of `e`; its message is cut at [`MAX_MESSAGE`] characters (a note says
    /// how many more there were), so that no input can make one protocol line unbounded.
    pub fn error(id: Option<String>, e: &Error) -> Self {
        let mut message = e.to_string();
        if let Some((cut, _)) = message.char_indices().nth(MAX_MESSAGE) {
            let more = message[cut..].chars().count();
            message.truncate(cut);
            message.push_str(&format!("... ({more} more characters)"));
        }
        Self::Error {
            id,
            code: e.code(),
            message,
            fatal: e.is_fatal(),
        }
    }

    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("events are plain data")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_is_warm_only_when_all_its_work_came_from_the_cache() {
        let state = |parts: &[(&str, bool)]| load_cache(parts)["state"].clone();
        assert_eq!(state(&[]), "none");
        assert_eq!(state(&[("kernels", true), ("tuning", true)]), "warm");
        assert_eq!(state(&[("kernels", false), ("tuning", false)]), "cold");
        assert_eq!(state(&[("kernels", true), ("tuning", false)]), "partial");
        assert_eq!(
            load_cache(&[
                ("kernels", true),
                ("GEMV tuning", false),
                ("step paths", false)
            ])["detail"],
            "kernels from the cache; GEMV tuning and step paths done afresh"
        );
        assert_eq!(
            load_cache(&[("a", true), ("b", true), ("c", true)])["detail"],
            "a, b and c from the cache"
        );
    }

    fn err(line: &str) -> (Option<String>, String, &'static str) {
        let (id, e) = parse_request(line).unwrap_err();
        (id, e.to_string(), e.code())
    }

    #[test]
    fn parses_generate_and_shutdown() {
        let r = parse_request(
            r#"{"type":"generate","id":"a","prompts":[[1,2],[3]],"max_tokens":4,"ignore_eos":true,"batch":2}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            Request::Generate(GenerateRequest {
                id: "a".into(),
                prompts: vec![vec![1, 2], vec![3]],
                max_tokens: 4,
                ignore_eos: true,
                batch: 2
            })
        );
        assert_eq!(
            parse_request(r#"{"type":"shutdown"}"#).unwrap(),
            Request::Shutdown
        );
    }

    #[test]
    fn parses_verify() {
        let r = parse_request(
            r#"{"type":"verify","id":"v","prompts":[[1,2]],"forced":[[3,4,5]],"batch":1}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            Request::Verify(VerifyRequest {
                id: "v".into(),
                prompts: vec![vec![1, 2]],
                forced: vec![vec![3, 4, 5]],
                batch: 1
            })
        );
        let (id, m, code) = err(r#"{"type":"verify","id":"w","prompts":[[1]],"batch":1}"#);
        assert_eq!((id.as_deref(), code), (Some("w"), "malformed_request"));
        assert!(m.contains("verify: missing field `forced`"), "{m}");
        let (_, m, _) =
            err(r#"{"type":"verify","id":"w","prompts":[[1]],"forced":[[1.5]],"batch":1}"#);
        assert!(m.contains("verify: invalid type"), "{m}");
    }

    #[test]
    fn a_nan_score_is_null_in_json() {
        let line = Event::Verified {
            id: "v".into(),
            index: 0,
            argmax: vec![3, 0],
            gap: vec![0.0, f64::NAN],
            scale: Some(vec![2.5, f64::NAN]),
            path: "decode",
        }
        .to_line();
        assert_eq!(
            line,
            r#"{"type":"verified","id":"v","index":0,"argmax":[3,0],"gap":[0.0,null],"scale":[2.5,null],"path":"decode"}"#
        );
    }

    #[test]
    fn malformed_lines_are_named() {
        let (id, m, code) = err("not json");
        assert_eq!((id, code), (None, "malformed_request"));
        assert!(m.contains("not JSON") && m.contains("not json"), "{m}");
        let (_, m, _) = err(r#"{"id":"x"}"#);
        assert!(m.contains("no string \"type\""), "{m}");
        let (id, m, _) = err(r#"{"type":"fly","id":"x"}"#);
        assert_eq!(id.as_deref(), Some("x"));
        assert!(m.contains("unknown request type \"fly\""), "{m}");
        let (id, m, _) =
            err(r#"{"type":"generate","id":"g","prompts":[[1]],"ignore_eos":true,"batch":1}"#);
        assert_eq!(id.as_deref(), Some("g"));
        assert!(m.contains("missing field `max_tokens`"), "{m}");
        let (_, m, _) = err(
            r#"{"type":"generate","id":"g","prompts":"1,2","max_tokens":1,"ignore_eos":true,"batch":1}"#,
        );
        assert!(m.contains("invalid type"), "{m}");
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let (_, m, _) = err(
            r#"{"type":"verify","id":"v","prompts":[[1]],"forced":[[2]],"batch":1,"max_tokens":3}"#,
        );
        assert!(m.contains("unknown field `max_tokens`"), "{m}");
        let (id, m, code) = err(
            r#"{"type":"generate","id":"g","prompts":[[1]],"max_tokens":2,"ignore_eos":true,"batch":1,"temperature":0.7}"#,
        );
        assert_eq!((id.as_deref(), code), (Some("g"), "malformed_request"));
        assert!(m.contains("unknown field `temperature`"), "{m}");
        let (_, m, _) = err(r#"{"type":"shutdown","now":true}"#);
        assert!(
            m.contains("shutdown takes no fields") && m.contains("now"),
            "{m}"
        );
    }

    #[test]
    fn error_messages_are_bounded() {
        let e = Error::Load {
            message: "x".repeat(1_000_000),
        };
        let Event::Error { message, .. } = Event::error(None, &e) else {
            panic!()
        };
        assert!(message.len() < MAX_MESSAGE + 100, "{}", message.len());
        let more = e.to_string().len() - MAX_MESSAGE;
        assert!(message.ends_with(&format!("... ({more} more characters)")));
    }

    #[test]
    fn events_serialize_with_type_tag() {
        let line = Event::Done {
            id: "a".into(),
            wall_s: 1.5,
            tokens: 3,
        }
        .to_line();
        assert_eq!(line, r#"{"type":"done","id":"a","wall_s":1.5,"tokens":3}"#);
        let e = Event::error(None, &Error::EmptyPrompt { prompt: 2 }).to_line();
        let v: serde_json::Value = serde_json::from_str(&e).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["code"], "empty_prompt");
        assert_eq!(v["fatal"], false);
        assert!(v.get("id").is_none());
    }
}
