//! warren-proto: the records that cross warren's process boundaries, with the client side of
//! each exchange, so that a reader finds every wire format in one place (the 9P contracts are in
//! `specs/`), and so that nsd, which builds and sends records, links no server crate
//! (`tests/no_server_deps.rs`). What a daemon makes of a sound record stays in the daemon.
//!
//! - [`control`]: the control sockets' exchange (one record with fds, one line back).
//! - [`gate`]: the gate's control record and tiers, the decide request and [`gate::Answer`], and
//!   [`gate::GateClient`], the one client of the gate.
//! - [`lineage`]: a namespace's chain, carried by every record nsd makes for a namespace.
//! - [`toolfs`]: the grant records toolfs and mcpfs serve connections by.
//! - [`worker`]: toolfs asking nsd for a tool worker, and the toolfs ↔ worker frames.
//! - [`receipts`]: receiptd's view record and [`receipts::Appender`], its one append client.
//! - [`net`]: netproxy's grant record and the destination patterns it lists.
//! - [`mcp`]: an operator's definition of an MCP server (mcpfs serves it, nsd starts it).
//! - [`export`]: the host-to-host link (keys, peers file, wire) and nsd's export socket.
//! - [`launch`]: nsd's run and MCP server sockets; [`llm`]: llmfs's control socket.

pub mod control;
pub mod export;
pub mod gate;
pub mod launch;
pub mod lineage;
pub mod llm;
pub mod mcp;
pub mod net;
pub mod receipts;
pub mod toolfs;
pub mod worker;
