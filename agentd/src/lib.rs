//! warren-agentd: warren's own agent. It runs inside a namespace and holds nothing it cannot see
//! there: its model is the llmfs session it mints under `/mnt/llm`, its tools are the `call`
//! files under `/tool` and `/mnt/mcp/*`. `docs/agent.md` says what it does and why.

pub mod agent;
pub mod tools;
pub mod wrap;
