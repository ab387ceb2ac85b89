//! warren-receiptd: signed, hash-chained receipts that a stranger verifies offline.
//!
//! - [`receipt`]: the body (RFC 8785 JSON), the append request, the hybrid logical clock.
//! - [`dsse`]: the DSSE envelope and PAE; [`keys`]: Ed25519 keys, RFC 7638 ids, the registry.
//! - [`merkle`]: RFC 9162 tree hashing, frontier, proofs; [`note`]: C2SP signed-note checkpoints.
//! - [`log`]: the log itself over SQLite ([`store`]), with group commit ([`sync`]).
//! - [`batch`]: appends that arrive together share one transaction.
//! - [`verify`]: export and offline verification; [`tree`]: the `/receipts` 9P tree.
//!
//! The normative format is `specs/receipts.md`.

pub mod access;
pub mod batch;
pub mod budget;
pub mod client;
pub mod control;
pub mod daemon;
pub mod dsse;
pub mod keys;
pub mod log;
pub mod merkle;
pub mod note;
pub mod receipt;
pub mod store;
pub mod sync;
pub mod tree;
pub mod verify;

pub use access::{AppendError, Role};
pub use log::{Ack, Log, LogConfig};
pub use receipt::{AppendRequest, Kind};
pub use sync::Durability;
pub use verify::{Require, VerifyOutcome, export, export_registry, verify, verify_with};
