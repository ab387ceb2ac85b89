//! warren-ns: the namespace spec language (`spec`, `specs/namespace.md`), narrowing (`covers`,
//! `narrow`), building a namespace from a spec in this process (`run::spawn`: the handles it is
//! built from, the confinement steps in order, the payload's pty) and the launcher's side of
//! nsd's run socket (`launch`, `cli`: `warren run`, `attach`, `sh`). The daemon that builds
//! namespaces for others is `warren-nsd`; the steps and their reasons are `docs/confinement.md`.

pub mod cli;
pub mod cli_spec;
pub mod confine;
pub mod covers;
pub mod handles;
pub mod launch;
pub mod narrow;
pub mod netgrant;
pub mod profile;
pub mod pty;
pub mod run;
pub mod spec;
#[cfg(test)]
mod testutil;

pub use cli_spec::{CliGrants, spec_from_cli};
pub use confine::fuse::MountServer;
pub use confine::guard::ProtectedDirs;
pub use covers::{Widened, Widening, covers};
pub use run::{PayloadStdio, RunOptions, Running, run, spawn};
pub use spec::{Spec, SpecError, parse};

/// The payload's writable home directory.
pub const HOME: &str = "/home/agent";
/// The namespace's hostname (its own UTS namespace).
pub const HOSTNAME: &str = "warren";
/// The payload's PATH.
pub const PAYLOAD_PATH: &str = "/usr/bin:/bin";
