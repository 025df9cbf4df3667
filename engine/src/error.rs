//! Every failure the engine can report. Each variant's Display is the whole explanation, with the
//! figures and the fix, because it travels verbatim to the orchestrator in an `error` event.

use std::fmt;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// The model could not be loaded: config, files, tensors.
    Load {
        message: String,
    },
    /// A request line that is not a valid protocol message.
    MalformedRequest {
        message: String,
    },
    BadToken {
        prompt: usize,
        position: usize,
        id: i64,
        vocab: usize,
        /// In the prompt's forced tokens (verify), not in the prompt.
        forced: bool,
    },
    EmptyPrompt {
        prompt: usize,
    },
    TooLong {
        prompt: usize,
        prompt_len: usize,
        /// New tokens, or (verify) forced tokens.
        max_tokens: usize,
        max_context: usize,
        /// A verify request: `max_tokens` counts the prompt's forced tokens.
        forced: bool,
    },
    OverCapacity {
        prompt: usize,
        needed_tokens: usize,
        needed_blocks: usize,
        pool_blocks: usize,
        block_size: usize,
    },
    BatchTooLarge {
        batch: usize,
        max_batch: usize,
    },
    /// `ENGINE_FAULT` names something that is not a fault.
    UnknownFault {
        name: String,
    },
    /// `ENGINE_FAULT` plants a fault this model cannot have.
    FaultDoesNotApply {
        fault: &'static str,
        reason: String,
    },
    /// A bad command-line or pool setting.
    Config {
        message: String,
    },
    Internal {
        message: String,
    },
}

impl Error {
    /// The stable protocol name of the cause (docs/PROTOCOL.md).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Load { .. }
            | Self::Config { .. }
            | Self::UnknownFault { .. }
            | Self::FaultDoesNotApply { .. } => "load_failed",
            Self::MalformedRequest { .. } => "malformed_request",
            Self::BadToken { .. } => "bad_token",
            Self::EmptyPrompt { .. } => "empty_prompt",
            Self::TooLong { .. } => "too_long",
            Self::OverCapacity { .. } | Self::BatchTooLarge { .. } => "over_capacity",
            Self::Internal { .. } => "internal",
        }
    }

    /// Whether the leg must exit after reporting it.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Self::Load { .. }
                | Self::Config { .. }
                | Self::UnknownFault { .. }
                | Self::FaultDoesNotApply { .. }
                | Self::Internal { .. }
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Load { message } => write!(f, "cannot load the model: {message}"),
            Self::MalformedRequest { message } => write!(
                f,
                "malformed request: {message}; each request is one JSON object per line with a \
                 \"type\" of \"generate\", \"verify\" or \"shutdown\" (docs/PROTOCOL.md)"
            ),
            Self::BadToken {
                prompt,
                position,
                id,
                vocab,
                forced: false,
            } => write!(
                f,
                "prompt {prompt}, position {position}: token id {id} is outside the vocabulary \
                 [0, {vocab}); the prompts must be tokenized for this model"
            ),
            Self::BadToken {
                prompt,
                position,
                id,
                vocab,
                forced: true,
            } => write!(
                f,
                "forced tokens of prompt {prompt}, position {position}: token id {id} is outside \
                 the vocabulary [0, {vocab}); the forced tokens must be this model's token ids"
            ),
            Self::EmptyPrompt { prompt } => write!(
                f,
                "prompt {prompt} has no tokens; every prompt needs at least one token id"
            ),
            Self::TooLong {
                prompt,
                prompt_len,
                max_tokens,
                max_context,
                forced,
            } => {
                let (what, fix) = if *forced {
                    (format!("{max_tokens} forced tokens"), "the forced tokens")
                } else {
                    (format!("max_tokens {max_tokens}"), "max_tokens")
                };
                write!(
                    f,
                    "prompt {prompt}: {prompt_len} prompt tokens + {what} = {} exceeds the \
                     model's maximum context of {max_context} tokens (max_position_embeddings); \
                     shorten the prompt or lower {fix}",
                    prompt_len + max_tokens
                )
            }
            Self::OverCapacity {
                prompt,
                needed_tokens,
                needed_blocks,
                pool_blocks,
                block_size,
            } => write!(
                f,
                "prompt {prompt} needs {needed_tokens} tokens of KV cache ({needed_blocks} blocks \
                 of {block_size}) but the whole pool holds {pool_blocks} blocks ({} tokens); \
                 start the engine with --num-blocks {needed_blocks} or more (or a larger \
                 --kv-cache-memory)",
                pool_blocks * block_size
            ),
            Self::BatchTooLarge { batch, max_batch } => write!(
                f,
                "batch {batch} exceeds this engine's --max-batch {max_batch}; start the engine \
                 with --max-batch {batch} or more"
            ),
            Self::UnknownFault { name } => {
                let names: Vec<&str> = crate::fault::Fault::ALL.iter().map(|f| f.name()).collect();
                write!(
                    f,
                    "{}={name:?} is not a fault this engine can plant; the faults are {} \
                     (comma-separated; a test-only injector, docs/ENGINE.md); unset {} for a \
                     clean build",
                    crate::fault::ENV,
                    names.join(", "),
                    crate::fault::ENV
                )
            }
            Self::FaultDoesNotApply { fault, reason } => write!(
                f,
                "{}={fault} does not apply to this model: {reason}; plant it in a model that \
                 has what it breaks, or unset it",
                crate::fault::ENV
            ),
            Self::Config { message } => write!(f, "{message}"),
            Self::Internal { message } => write!(f, "internal error: {message}"),
        }
    }
}

impl std::error::Error for Error {}
