//! warren's gate: decides every tool call from its name, its exact arguments, its session and
//! typed context states — never from what the session has been saying — and receipts every
//! decision before it answers. See `specs/gate-tree.md` and `docs/gate.md`.

pub mod approvals;
pub mod control;
pub mod escape;
pub mod events;
pub mod gate;
pub mod policy;
pub mod receipts;
pub mod request;
pub mod scope;
pub mod store;
pub mod tree;

pub use gate::{Answer, Config, Gate};
pub use policy::{ContextState, Verdict};
