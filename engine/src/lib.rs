//! Our inference engine.
