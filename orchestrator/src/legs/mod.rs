//! Running the legs: the lease over the machine, each leg's process speaking the protocol under
//! its watchdog, its progress, and the samplers beside it. What a leg did is a [`LegRecord`];
//! [`pair`] runs both legs of a run.

pub mod lease;
pub mod leg;
pub mod pair;
mod process;
pub mod progress;
pub mod protocol;
pub mod record;
pub mod sampler;
pub mod spec;
pub mod watchdog;

pub use record::{LegName, LegRecord};
