//! warren's supervisor (the `warren-supervisor` binary) and the front door's way to start, stop
//! and read it (`warren up|down|status`, the [`front_door`] functions the CLI calls).
//!
//! The supervisor holds a flock on `<runtime>/warren.lock` for its whole life (one set of
//! daemons per runtime dir), binds every daemon's sockets itself as root and starts each daemon
//! under its own uid ([`supervise`]), and restarts a daemon that dies.

pub mod daemons;
pub mod front_door;
pub mod prepare;
pub mod state;
pub mod supervise;

pub use front_door::{
    DaemonReport, Up, bring_up, bring_up_with_env, daemon_reports, down_with, libexec_dir, status,
    up,
};
pub use state::{DaemonState, daemon_states, supervisor_running};
