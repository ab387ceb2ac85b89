//! warren-mcpfs: MCP servers as file servers of the `/tool` shape.
//!
//! This crate is the MCP side of mcpfs: an operator's definition of a server ([`config`]), what
//! a server says its tools are and what warren makes of that ([`definition`]: the digest a tool
//! is pinned by, the tier a call of it is decided at), which tools an operator has accepted
//! ([`pins`]: a changed or new definition is held until accepted again), a client session over
//! any byte stream ([`session`], through the official Rust SDK, `rmcp`), and what a tool's
//! result becomes ([`result`]: untrusted data, text as text, everything else described by type,
//! size and digest). The contract is `docs/mcp.md`.

/// The operator's definition of a server (nsd reads it too, to start a stdio server).
pub use warren_proto::mcp as config;
pub mod definition;
pub mod pins;
pub mod result;
pub mod served;
pub mod session;

pub use config::ServerConfig;
pub use definition::{Definition, Tier};
pub use pins::{Pins, Standing};
pub use result::{Attachment, Outcome};
pub use session::{Session, SessionError};
