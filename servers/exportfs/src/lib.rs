//! warren-exportfs: this host's trees served to other hosts over authenticated, encrypted 9P,
//! and the dialling side nsd uses to import another host's (docs/distribution.md).
//!
//! - [`keys`]: the host's Ed25519 identity (`warren keys init|show`).
//! - [`peers`]: the peers file, who may connect and what each may mount.
//! - [`wire`]: the Noise XX handshake and the encrypted frames.
//! - [`server`]: the listener, its deadline and its pre-auth budget (shares per source).
//! - [`control`]: how exportfs gets a peer's tree from nsd.
//! - [`dir`]: a host directory served read-only.

pub mod control;
pub mod dir;
pub mod server;

/// The link's keys, peers file and wire (shared with nsd, which dials).
pub use warren_proto::export::{keys, peers, wire};
