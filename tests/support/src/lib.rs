//! What the workspace's integration tests share (a dev-dependency only).
//!
//! - [`bins`]: the workspace's built binaries, found one way ([`bins::bin`]).
//! - [`daemons`]: each daemon as a real process ([`daemons::Process`]), started from its
//!   binary with the arguments every test gives it, ready once its sockets accept.
//! - [`dirs`]: a short temp directory for sockets ([`dirs::short`]); one with a given mode.
//! - [`kernel`]: the kernel features a test needs, failing by name where one is missing
//!   (`scripts/test` leaves such tests out, counted as skipped, on a host without it).
//! - [`llm_script`]: the scripted model backend, a real HTTP server.
//! - [`receipts`]: receiptd's logs read over its socket, envelopes and bodies.
//! - [`approver`]: an operator allowing every ask the gate shows.
//! - [`race`]: the symlink-swap race's fixtures (toolfs's and warren's race tests).
//! - [`tls`]: a TLS server with a test CA (netproxy's and warren's network tests).
//! - [`wire`]: a frame sent by an unprivileged peer.

pub mod approver;
pub mod bins;
pub mod daemons;
pub mod dirs;
pub mod kernel;
pub mod llm_script;
pub mod race;
pub mod receipts;
pub mod tls;
pub mod wire;
