//! Running the legs: the lease over the machine, each leg's process speaking the protocol under
//! its watchdog, its progress, and the samplers beside it. What a leg did is a [`LegRecord`].

pub mod lease;
pub mod leg;
pub mod progress;
pub mod protocol;
pub mod sampler;
pub mod watchdog;

pub use leg::{LegName, LegRecord};
