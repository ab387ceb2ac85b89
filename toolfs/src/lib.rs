//! warren-toolfs: the `/tool` tree. Each connection sees exactly its grant: `tools`, and per
//! granted tool `<name>/{doc,schema,call}`. A call file is a transaction (one open, one call);
//! arguments are parsed strictly, schema-checked and canonicalised before any tool sees them;
//! the gate decides every call before it runs (no gate: every call is denied), and every call
//! that ran is receipted in receiptd; results come back in a canonical envelope with a digest, a
//! taint mark and the receipt.
//! The contract is `specs/tool-tree.md` (and `specs/worker-protocol.md` for the workers); the
//! reasons are `docs/toolfs.md`, the tools themselves `docs/tools.md`.

pub mod args;
mod call;
pub mod catalog;
pub mod client;
pub mod control;
pub mod dispatch;
pub mod echo;
pub mod effects;
pub mod envelope;
pub mod gate;
pub mod grant;
pub mod services;
pub mod tree;

pub mod tools;
pub mod worker;

pub use effects::ReceiptRef;
pub use envelope::{Envelope, Status, Taint};
pub use grant::{ControlClient, GrantRecord, RootGrant, ToolGrant, hand_over};
pub use tree::{ToolTree, TreeLimits};
