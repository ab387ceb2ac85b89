//! warren-nsd: the namespace daemon. It serves `/ns` to the operator over 9P (`nsd`), builds
//! namespaces for launchers on its run socket (`run_socket`: `warren run`, `attach`, `sh`), for
//! mcpfs on `nsd-mcp.ctl` (`mcp_socket`) and for exportfs's peers on `nsd-export.ctl`
//! (`export_socket`), makes each namespace's 9P connections and hands them with their grants to
//! the servers (`mount_server`), and builds toolfs's tool workers (`worker`). It opens every bind
//! source with the operator's own credentials (`reach`). The spec language and the building of a
//! namespace from a spec are `warren-ns`; the raw confinement steps are `warren-jail`.
//!
//! The contracts are `specs/ns-tree.md` (`/ns` and the run socket) and
//! `specs/worker-protocol.md` §1 (worker builds); the steps and their reasons are
//! `docs/confinement.md`.

pub mod export_socket;
pub mod mcp_socket;
pub mod mount_server;
pub mod nsd;
pub mod reach;
pub mod run_socket;
pub mod worker;

pub use mount_server::{ServedMounts, new_session_id};
