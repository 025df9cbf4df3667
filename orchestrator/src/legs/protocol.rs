//! The leg protocol of docs/PROTOCOL.md: the events a leg sends and the requests we send it.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Kv {
    pub block_size: u64,
    pub num_blocks: u64,
    pub capacity_tokens: u64,
    #[serde(default)]
    pub bytes: Option<u64>,
    /// Keys a leg may add (`resize_option`; vLLM's `vllm_reported_tokens`), kept for the record.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Kv {
    /// The option of the leg's own that sizes its pool in blocks (`resize_option`, e.g. vLLM's
    /// `num_gpu_blocks_override`), where the leg names one: the kv gate's resize sets it.
    pub fn resize_option(&self) -> Option<&str> {
        self.extra.get("resize_option").and_then(Value::as_str)
    }

    /// The tokens the pool holds: the leg's own count where it gives one that differs from
    /// blocks x block size (`vllm_reported_tokens`: for a hybrid, vLLM's blocks of 1,040 serve
    /// its attention and Mamba layer groups alike, and it counts 846,080 attention tokens in
    /// 3,305 of them, not 3,437,200), else `capacity_tokens`.
    pub fn tokens(&self) -> u64 {
        self.extra
            .get("vllm_reported_tokens")
            .and_then(Value::as_u64)
            .filter(|&t| t > 0)
            .unwrap_or(self.capacity_tokens)
    }

    /// Tokens per block as [`Kv::tokens`] counts them (the block size, for a plain pool).
    pub fn tokens_per_block(&self) -> u64 {
        (self.tokens() / self.num_blocks.max(1)).max(1)
    }

    /// The recurrent-state slots a hybrid's engine keeps beside its blocks, where it says.
    pub fn state_slots(&self) -> Option<u64> {
        self.extra.get("state_slots").and_then(Value::as_u64)
    }

    /// Pools within `tolerance_blocks` of the larger block (in tokens) count as the same.
    pub fn within(&self, other: &Kv, tolerance_blocks: u64) -> bool {
        let slack = tolerance_blocks * self.tokens_per_block().max(other.tokens_per_block());
        self.tokens().abs_diff(other.tokens()) <= slack
    }

    /// "846080 tokens (3305 blocks of 1040, by the leg's own count)" or "1152 tokens (72 blocks of 16)".
    pub fn describe(&self) -> String {
        let own = if self.tokens() != self.capacity_tokens {
            ", by the leg's own count"
        } else {
            ""
        };
        let slots = self
            .state_slots()
            .map(|s| format!(", and {s} recurrent-state slots"))
            .unwrap_or_default();
        format!(
            "{} tokens ({} blocks of {}{own}){slots}",
            self.tokens(),
            self.num_blocks,
            self.block_size
        )
    }
}

/// Blocks of `tokens_per_block` needed to hold at least `tokens`.
pub fn blocks_for(tokens: u64, tokens_per_block: u64) -> u64 {
    tokens.div_ceil(tokens_per_block.max(1))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ready {
    pub load_s: f64,
    pub kv: Option<Kv>,
    #[serde(default)]
    pub features: Map<String, Value>,
    #[serde(default)]
    pub versions: Map<String, Value>,
    #[serde(default)]
    pub resolved: Map<String, Value>,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub pids: Vec<u32>,
}

impl Ready {
    fn feature_str(&self, key: &str) -> Option<&str> {
        self.features.get(key).and_then(Value::as_str)
    }
    pub fn backend(&self) -> Option<&str> {
        self.feature_str("backend")
    }
    pub fn device(&self) -> Option<&str> {
        self.feature_str("device")
    }
    pub fn dtype(&self) -> Option<&str> {
        self.feature_str("dtype")
    }
    /// `features.degraded` as strings; a missing list reads as empty, a non-list as one entry.
    pub fn degraded(&self) -> Vec<String> {
        match self.features.get("degraded") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                })
                .collect(),
            Some(v) => vec![v.to_string()],
        }
    }
    /// `features.load_cache`: None where the leg does not say.
    pub fn load_cache(&self) -> Option<LoadCache> {
        let v = self.features.get("load_cache")?;
        let detail = v.get("detail").and_then(Value::as_str).unwrap_or("");
        Some(match v.get("state").and_then(Value::as_str) {
            Some("none") => LoadCache::None,
            Some("cold") => LoadCache::Cold(detail.into()),
            Some("warm") => LoadCache::Warm(detail.into()),
            Some("partial") => LoadCache::Partial(detail.into()),
            _ => LoadCache::Unknown(v.to_string()),
        })
    }
    /// Why a leg has no pool (`features.kv`), for a `kv: null` leg.
    pub fn no_kv_reason(&self) -> String {
        match self.features.get("kv") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => "the leg reported kv: null and gave no reason in features.kv".into(),
        }
    }
}

/// Whether the work a leg's load compiles or times (kernels, tunings, a torch.compile) came from
/// a cache an earlier process left (`ready.features.load_cache`, docs/PROTOCOL.md), with the
/// leg's own words for what it did.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadCache {
    /// Nothing to compile or time: every load does the same work.
    None,
    Cold(String),
    Warm(String),
    Partial(String),
    /// A state docs/PROTOCOL.md does not define: the object as the leg wrote it.
    Unknown(String),
}

impl LoadCache {
    /// Some of the load's work was skipped because a cache had it.
    pub fn from_cache(&self) -> bool {
        matches!(self, LoadCache::Warm(_) | LoadCache::Partial(_))
    }
}

impl std::fmt::Display for LoadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadCache::None => write!(f, "nothing compiled or timed"),
            LoadCache::Cold(d) => write!(f, "cold ({d})"),
            LoadCache::Warm(d) => write!(f, "warm ({d})"),
            LoadCache::Partial(d) => write!(f, "partly warm ({d})"),
            LoadCache::Unknown(v) => write!(f, "a load_cache the protocol does not define: {v}"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PromptResult {
    pub id: String,
    pub index: usize,
    pub tokens: Vec<u32>,
    pub elapsed_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_s: Option<f64>,
    /// Which repeat of its prompt this row is, where the request ran the battery over again to
    /// fill a larger batch (spec.rs `prompts_for`): the orchestrator's, never the leg's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub copy: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// One prompt of a `verify` (teacher forcing): per forced position, the leg's greedy choice, the
/// gap between its top logit and its logit for the forced token, and the largest |logit|. JSON has
/// no NaN: a leg writes a non-finite `gap` or `scale` as `null`, read here as None.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Verified {
    pub id: String,
    pub index: usize,
    pub argmax: Vec<u32>,
    pub gap: Vec<Option<f64>>,
    /// None: the leg cannot know it (vLLM's log-probs); an entry None: not finite.
    #[serde(default)]
    pub scale: Option<Vec<Option<f64>>>,
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Done {
    pub id: String,
    pub wall_s: f64,
    #[serde(default)]
    pub tokens: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorEvent {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub fatal: bool,
}

/// Every event a leg may send, by its `type`. A new event is a variant here, a line in
/// [`parse_event`] and one in [`Event::describe`].
#[derive(Debug, Clone)]
pub enum Event {
    Ready(Box<Ready>),
    Result(PromptResult),
    Verified(Verified),
    Done(Done),
    Error(ErrorEvent),
}

impl Event {
    /// The event in words, for a sentence saying it came when it should not have.
    pub fn describe(&self) -> String {
        match self {
            Event::Ready(_) => "a ready event".into(),
            Event::Result(r) => format!("a result for request {:?}", r.id),
            Event::Verified(v) => format!("a verified for request {:?}", v.id),
            Event::Done(d) => format!("done for request {:?}", d.id),
            Event::Error(_) => "an error event".into(),
        }
    }
}

/// Why a stdout line is not a protocol event; the caller quotes the line.
#[derive(Debug, Clone, PartialEq)]
pub enum LineProblem {
    NotJson(String),
    NoType,
    UnknownType(String),
    BadFields(String, String),
    /// A field docs/PROTOCOL.md does not define for this event: refused, never ignored.
    UnknownFields(String, Vec<String>),
}

impl std::fmt::Display for LineProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineProblem::NotJson(e) => write!(f, "not a JSON object ({e})"),
            LineProblem::NoType => write!(f, "a JSON object with no \"type\" field"),
            LineProblem::UnknownType(t) => write!(f, "an unknown event type {t:?}"),
            LineProblem::BadFields(t, e) => {
                write!(f, "a {t:?} event with missing or mistyped fields ({e})")
            }
            LineProblem::UnknownFields(t, keys) => write!(
                f,
                "a {t:?} event with field(s) the protocol does not define ({}); a leg sends only the fields docs/PROTOCOL.md lists (open objects such as features, versions, resolved and kv may hold any key)",
                keys.join(", ")
            ),
        }
    }
}

/// Every top-level field each event may carry (docs/PROTOCOL.md). Any other field refuses the
/// line: a misspelt optional field (`ttft` for `ttft_s`) would otherwise vanish unnoticed. The
/// objects inside (`features`, `versions`, `resolved`, `kv`) are open.
pub const EVENT_FIELDS: &[(&str, &[&str])] = &[
    (
        "ready",
        &[
            "type", "load_s", "kv", "features", "versions", "resolved", "pid", "pids",
        ],
    ),
    (
        "result",
        &["type", "id", "index", "tokens", "elapsed_s", "ttft_s"],
    ),
    ("done", &["type", "id", "wall_s", "tokens"]),
    ("error", &["type", "id", "code", "message", "fatal"]),
    (
        "verified",
        &["type", "id", "index", "argmax", "gap", "scale", "path"],
    ),
];

pub fn parse_event(line: &str) -> Result<Event, LineProblem> {
    let v: Value = serde_json::from_str(line).map_err(|e| LineProblem::NotJson(e.to_string()))?;
    let Value::Object(obj) = &v else {
        return Err(LineProblem::NotJson("not an object".into()));
    };
    let ty = obj
        .get("type")
        .and_then(Value::as_str)
        .ok_or(LineProblem::NoType)?
        .to_string();
    if let Some((_, known)) = EVENT_FIELDS.iter().find(|(t, _)| *t == ty) {
        let unknown: Vec<String> = obj
            .keys()
            .filter(|k| !known.contains(&k.as_str()))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(LineProblem::UnknownFields(ty, unknown));
        }
    }
    fn fields<T: DeserializeOwned>(ty: &str, v: Value) -> Result<T, LineProblem> {
        serde_json::from_value(v).map_err(|e| LineProblem::BadFields(ty.into(), e.to_string()))
    }
    match ty.as_str() {
        "ready" => Ok(Event::Ready(Box::new(fields(&ty, v)?))),
        "result" => Ok(Event::Result(fields(&ty, v)?)),
        "verified" => Ok(Event::Verified(fields(&ty, v)?)),
        "done" => Ok(Event::Done(fields(&ty, v)?)),
        "error" => Ok(Event::Error(fields(&ty, v)?)),
        _ => Err(LineProblem::UnknownType(ty)),
    }
}

/// Every request the orchestrator sends, tagged by `type`. A new request is a variant here.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request<'a> {
    Generate {
        id: &'a str,
        prompts: &'a [Vec<u32>],
        max_tokens: u32,
        ignore_eos: bool,
        batch: u32,
    },
    /// Teacher forcing, untimed (the token gate's; docs/PROTOCOL.md).
    Verify {
        id: &'a str,
        prompts: &'a [Vec<u32>],
        forced: &'a [Vec<u32>],
        batch: u32,
    },
    Shutdown,
}

impl Request<'_> {
    /// The request as one protocol line, newline included.
    pub fn line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("a request always serializes");
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(bs: u64, n: u64) -> Kv {
        Kv {
            block_size: bs,
            num_blocks: n,
            capacity_tokens: bs * n,
            bytes: None,
            extra: Default::default(),
        }
    }

    #[test]
    fn a_hybrid_pool_is_counted_in_the_legs_own_tokens() {
        // vLLM 0.26.0 on nemotron-h-8b (H200, 2026-12-01): 3,305 blocks of 1,040, 846,080 tokens.
        let mut vllm = kv(1040, 3305);
        vllm.extra
            .insert("vllm_reported_tokens".into(), serde_json::json!(846_080));
        assert_eq!((vllm.tokens(), vllm.tokens_per_block()), (846_080, 256));
        let mut engine = kv(16, 52_880);
        engine
            .extra
            .insert("state_slots".into(), serde_json::json!(8));
        assert!(engine.within(&vllm, 1) && vllm.within(&engine, 1));
        // One of vLLM's blocks (256 tokens) apart still matches; two do not.
        assert!(kv(16, 52_880 + 16).within(&vllm, 1));
        assert!(!kv(16, 52_880 + 33).within(&vllm, 1));
        // The engine's resize to it, and vLLM's to the engine, in their own blocks.
        assert_eq!(blocks_for(vllm.tokens(), engine.tokens_per_block()), 52_880);
        assert_eq!(
            blocks_for(kv(16, 1000).tokens(), vllm.tokens_per_block()),
            63
        );
        assert_eq!(
            vllm.describe(),
            "846080 tokens (3305 blocks of 1040, by the leg's own count)"
        );
        assert_eq!(
            engine.describe(),
            "846080 tokens (52880 blocks of 16), and 8 recurrent-state slots"
        );
    }

    #[test]
    fn within_one_block_of_the_larger_size() {
        assert!(kv(16, 64).within(&kv(16, 65), 1));
        assert!(!kv(16, 64).within(&kv(16, 66), 1));
        assert!(kv(16, 33).within(&kv(512, 1), 1));
        assert_eq!(blocks_for(1000, 16), 63);
        assert_eq!(blocks_for(1024, 16), 64);
    }

    #[test]
    fn requests_are_one_line_each_tagged_by_type() {
        let prompts = vec![vec![1, 2]];
        let g = Request::Generate {
            id: "r0-n8",
            prompts: &prompts,
            max_tokens: 8,
            ignore_eos: true,
            batch: 1,
        };
        assert_eq!(
            g.line(),
            "{\"type\":\"generate\",\"id\":\"r0-n8\",\"prompts\":[[1,2]],\"max_tokens\":8,\"ignore_eos\":true,\"batch\":1}\n"
        );
        assert_eq!(Request::Shutdown.line(), "{\"type\":\"shutdown\"}\n");
    }

    #[test]
    fn events_parse_and_problems_are_named() {
        let r = parse_event(r#"{"type":"ready","load_s":1.5,"kv":null,"features":{"backend":"cpu","degraded":[]},"versions":{},"resolved":{},"pid":7}"#).unwrap();
        let Event::Ready(r) = r else { panic!() };
        assert_eq!(r.backend(), Some("cpu"));
        assert!(r.degraded().is_empty());
        assert!(matches!(parse_event("hello"), Err(LineProblem::NotJson(_))));
        assert_eq!(parse_event(r#"{"a":1}"#).unwrap_err(), LineProblem::NoType);
        assert_eq!(
            parse_event(r#"{"type":"progress"}"#).unwrap_err(),
            LineProblem::UnknownType("progress".into())
        );
        assert!(matches!(
            parse_event(r#"{"type":"result","id":"x"}"#),
            Err(LineProblem::BadFields(..))
        ));
    }

    #[test]
    fn verified_reads_null_as_not_finite_and_a_missing_scale_as_unknown() {
        let e = parse_event(r#"{"type":"verified","id":"v","index":1,"argmax":[3,0],"gap":[0.0,null],"scale":[2.5,null],"path":"decode"}"#).unwrap();
        let Event::Verified(v) = e else { panic!() };
        assert_eq!(v.gap, vec![Some(0.0), None]);
        assert_eq!(v.scale, Some(vec![Some(2.5), None]));
        let e = parse_event(r#"{"type":"verified","id":"v","index":0,"argmax":[3],"gap":[0.5],"scale":null,"path":"prefill"}"#).unwrap();
        let Event::Verified(v) = e else { panic!() };
        assert_eq!((v.scale, v.path.as_str()), (None, "prefill"));
        let v = Request::Verify {
            id: "v8",
            prompts: &[vec![1, 2]],
            forced: &[vec![3]],
            batch: 8,
        };
        assert_eq!(
            v.line(),
            "{\"type\":\"verify\",\"id\":\"v8\",\"prompts\":[[1,2]],\"forced\":[[3]],\"batch\":8}\n"
        );
    }

    #[test]
    fn an_unknown_field_refuses_the_event_and_open_objects_stay_open() {
        let e = parse_event(
            r#"{"type":"result","id":"x","index":0,"tokens":[1],"elapsed_s":0.1,"ttft":0.01}"#,
        )
        .unwrap_err();
        assert_eq!(
            e,
            LineProblem::UnknownFields("result".into(), vec!["ttft".into()])
        );
        assert!(e.to_string().contains("(ttft)"), "{e}");
        assert!(matches!(
            parse_event(r#"{"type":"done","id":"x","wall_s":1,"tokens":2,"extra":true}"#),
            Err(LineProblem::UnknownFields(..))
        ));
        let r = parse_event(
            r#"{"type":"ready","load_s":1,"kv":{"block_size":16,"num_blocks":2,"capacity_tokens":32,"vllm_reported_tokens":30},"features":{"anything":1},"versions":{},"resolved":{"x":[1]},"pid":7,"pids":[7]}"#,
        );
        assert!(r.is_ok(), "{r:?}");
        // Every event type parse_event reads has its list of fields.
        for ty in ["ready", "result", "done", "error", "verified"] {
            assert!(EVENT_FIELDS.iter().any(|(t, _)| *t == ty), "{ty}");
        }
    }
}
