//! warren's supervisor and the front door's way to start, stop and read it.

pub mod supervise;

pub use supervise::*;
