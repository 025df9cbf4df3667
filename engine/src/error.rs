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
    },
    EmptyPrompt {
        prompt: usize,
    },
    TooLong {
        prompt: usize,
        prompt_len: usize,
        max_tokens: usize,
        max_context: usize,
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
            Self::Load { .. } | Self::Config { .. } => "load_failed",
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
            Self::Load { .. } | Self::Config { .. } | Self::Internal { .. }
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
                 \"type\" of \"generate\" or \"shutdown\" (docs/PROTOCOL.md)"
            ),
            Self::BadToken {
                prompt,
                position,
                id,
                vocab,
            } => write!(
                f,
                "prompt {prompt}, position {position}: token id {id} is outside the vocabulary \
                 [0, {vocab}); the prompts must be tokenized for this model"
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
            } => write!(
                f,
                "prompt {prompt}: {prompt_len} prompt tokens + max_tokens {max_tokens} = {} \
                 exceeds the model's maximum context of {max_context} tokens \
                 (max_position_embeddings); shorten the prompt or lower max_tokens",
                prompt_len + max_tokens
            ),
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
            Self::Config { message } => write!(f, "{message}"),
            Self::Internal { message } => write!(f, "internal error: {message}"),
        }
    }
}

impl std::error::Error for Error {}
