//! llmfs: the model served as files. Each connection mints sessions (`new`); a session's files
//! hold its model, system prompt and tools, and its `ask` file takes a message and streams the
//! model's reply back as JSON lines. `docs/llm.md` describes the tree and its backends.

pub mod backend;
pub mod control;
pub mod gate;
pub mod memory;
pub mod receipts;
pub mod session;
pub mod tree;
