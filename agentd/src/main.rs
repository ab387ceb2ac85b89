//! `warren-agentd`: runs a task as warren's agent, inside a namespace (`warren agent` builds one
//! and starts this in it). Progress on stderr, the final answer on stdout; exit status 0 when
//! the model finished, 1 when a budget was spent, 3 when the model failed, 2 on a usage error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use warren_agentd::agent::{self, Config, End};
use warren_agentd::wrap::Limits;

#[derive(Parser, Debug)]
#[command(
    name = "warren-agentd",
    about = "warren's agent, run inside a namespace"
)]
struct Args {
    /// The model's tree (`mount llm PATH`).
    #[arg(long, default_value = "/mnt/llm")]
    llm: PathBuf,
    /// The tool tree (`mount tool PATH …`).
    #[arg(long, default_value = "/tool")]
    tools: PathBuf,
    /// Where MCP servers are mounted, one directory each.
    #[arg(long, default_value = "/mnt/mcp")]
    mcp: PathBuf,
    /// The model's name (default: llmfs's).
    #[arg(long)]
    model: Option<String>,
    /// Turns (model asks) at most.
    #[arg(long, default_value_t = 20)]
    max_turns: u32,
    /// Tokens (prompt and completion, summed over the turns) at most.
    #[arg(long, default_value_t = 200_000)]
    max_tokens: u64,
    /// Seconds in all at most.
    #[arg(long, default_value_t = 600)]
    max_seconds: u64,
    /// The namespace's spec, as the operator wrote it: told to the model in words.
    #[arg(long)]
    grant: Option<PathBuf>,
    /// Write the transcript (JSON lines) here.
    #[arg(long)]
    transcript: Option<PathBuf>,
    /// A file given to the model as context, wrapped as untrusted data (repeat for more).
    #[arg(long)]
    context: Vec<PathBuf>,
    /// Bytes of each context file given to the model.
    #[arg(long, default_value_t = 32 << 10)]
    context_bytes: usize,
    /// Tool calls in one turn at most (more: none of that turn's run).
    #[arg(long, default_value_t = 16)]
    max_calls_per_turn: usize,
    /// The task.
    task: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = Config {
        task: args.task,
        grant: args.grant,
        llm: args.llm,
        tool_root: args.tools,
        mcp_root: args.mcp,
        model: args.model,
        max_turns: args.max_turns,
        max_tokens: args.max_tokens,
        max_time: Duration::from_secs(args.max_seconds),
        transcript: args.transcript,
        context: args.context,
        limits: Limits {
            context_bytes: args.context_bytes,
            calls_per_turn: args.max_calls_per_turn,
            ..Limits::default()
        },
    };
    match agent::run(&cfg) {
        Ok(end) => {
            match &end {
                End::Finished(answer) => {
                    agent::say("finished");
                    // The model's words reach a terminal: controls and the like escaped.
                    println!("{}", warren_daemon::escape::escaped_lines(answer));
                }
                End::Budget(which) => agent::say(&format!("stopped: the {which} budget is spent")),
                // The backend's or llmfs's words: escaped like every other line.
                End::ModelError(e) => agent::say(&format!("stopped: the model failed: {e}")),
            }
            ExitCode::from(end.status())
        }
        Err(e) => {
            agent::say(&format!("{e:#}"));
            ExitCode::from(3)
        }
    }
}
