//! warren-ns: the namespace spec language, narrowing (`covers`), confinement, and nsd — its `/ns`
//! tree, the run socket `warren run`, `attach` and `sh` launch through, and the tool workers it
//! builds for toolfs. The contracts are `specs/namespace.md` (the spec language),
//! `specs/ns-tree.md` (`/ns` and the run socket) and `specs/worker-protocol.md` §1 (worker
//! builds); the steps and their reasons are `docs/confinement.md`.

pub mod cli;
pub mod confine;
pub mod covers;
pub mod handles;
pub mod launch;
pub mod mount_server;
pub mod narrow;
pub mod netgrant;
pub mod nsd;
pub mod pty;
pub mod reach;
pub mod run;
pub mod spec;
#[cfg(test)]
mod testutil;
pub mod worker;

pub use confine::fuse::MountServer;
pub use confine::guard::ProtectedDirs;
pub use covers::{Widened, Widening, covers};
pub use mount_server::{ServedMounts, new_session_id};
pub use run::{CliGrants, PayloadStdio, RunOptions, Running, run, spawn, spec_from_cli};
pub use spec::{Spec, SpecError, parse};

/// The payload's writable home directory.
pub const HOME: &str = "/home/agent";
/// The namespace's hostname (its own UTS namespace).
pub const HOSTNAME: &str = "warren";
/// The payload's PATH.
pub const PAYLOAD_PATH: &str = "/usr/bin:/bin";
