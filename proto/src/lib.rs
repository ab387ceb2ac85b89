//! warren-proto: the records that cross warren's process boundaries, with the client side of
//! each exchange, so that a reader finds every wire format in one place (the 9P contracts are in
//! `specs/`). Today: nsd's run and MCP server sockets ([`launch`]), llmfs's control socket ([`llm`]).

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
