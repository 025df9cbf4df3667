//! Our inference engine: Hugging Face Llama-family checkpoints, a paged KV cache and greedy
//! decoding, served over the leg protocol (docs/PROTOCOL.md).

pub mod backend;
pub mod bench;
pub mod config;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod fault;
pub mod generate;
pub mod hybrid;
pub mod kv;
pub mod load;
pub mod protocol;
pub mod rope;
pub mod serve;
pub mod weights;

pub use error::{Error, Result};
