//! `warren-llmfs`: serves the model as files (`docs/llm.md`) on the operator socket
//! `<runtime>/llm.sock`, each connection with sessions of its own.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use warren_daemon::Dirs;
use warren_daemon::operator::OperatorPolicy;
use warren_llmfs::backend::{Api, Backend, BackendConfig};
use warren_llmfs::receipts::Receipts;
use warren_llmfs::session::Defaults;
use warren_llmfs::tree::LlmTree;

#[derive(Parser, Debug)]
#[command(
    name = "warren-llmfs",
    about = "warren's model server: the model served as files (9P2000.L)"
)]
struct Args {
    /// Where the sockets live (default: $WARREN_RUNTIME_DIR, else /run/warren).
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
    /// The backend's base URL (the API paths `/v1/...` are appended).
    #[arg(long, env = "WARREN_LLM_URL")]
    url: String,
    /// The backend's wire API.
    #[arg(long, env = "WARREN_LLM_API", value_enum, default_value_t = Api::Openai)]
    api: Api,
    /// The file holding the API key (default: <secrets>/llm.key). A missing file means no key.
    #[arg(long, env = "WARREN_LLM_KEY_FILE")]
    key_file: Option<PathBuf>,
    /// The model a new session starts with (a session writes `model` to choose another).
    #[arg(long, env = "WARREN_LLM_MODEL", default_value = "")]
    model: String,
    /// Seconds an ask may take in all, retries included (a session's `ctl` sets its own).
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// `max_tokens` sent with each ask unless a session sets its own (0: none sent; Anthropic's
    /// API requires one, so 4096 is sent there).
    #[arg(long, default_value_t = 0)]
    max_tokens: u32,
    /// Tries of an ask on 429, 5xx or an unreachable backend, the first included.
    #[arg(long, default_value_t = 4)]
    tries: u32,
    /// The first wait between tries, in milliseconds; it doubles each time, unless the backend
    /// says how long to wait (`Retry-After`).
    #[arg(long, default_value_t = 500)]
    backoff_ms: u64,
    /// receiptd's socket for the model calls' receipts (default: <runtime>/receipts.sock).
    #[arg(long)]
    receipts: Option<PathBuf>,
    /// Receipt no model call (asks are then not refused for want of receiptd).
    #[arg(long, conflicts_with = "receipts")]
    no_receipts: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    warren_daemon::init_tracing("llmfs");
    warren_daemon::harden()?;
    let env_dirs = Dirs::from_env();
    let dirs = Dirs {
        runtime: args.runtime_dir.clone().unwrap_or(env_dirs.runtime.clone()),
        ..env_dirs
    };
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        anyhow::bail!("--timeout {}: seconds, more than 0", args.timeout);
    }
    let key_file = args
        .key_file
        .clone()
        .unwrap_or_else(|| dirs.secrets.join("llm.key"));
    let key = BackendConfig::read_key(&key_file)?;
    if key.is_none() {
        tracing::warn!(
            "{} does not exist: asking without a key",
            key_file.display()
        );
    }
    let backend = Arc::new(Backend::new(BackendConfig {
        api: args.api,
        url: args.url.clone(),
        key,
        key_file: Some(key_file),
        tries: args.tries,
        backoff_first: Duration::from_millis(args.backoff_ms),
    })?);
    let defaults = Defaults {
        model: args.model.clone(),
        timeout: Duration::from_secs_f64(args.timeout),
        max_tokens: (args.max_tokens > 0).then_some(args.max_tokens),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let receipts = if args.no_receipts {
            tracing::warn!("--no-receipts: model calls are not receipted");
            None
        } else {
            let socket = args.receipts.unwrap_or_else(|| dirs.socket("receipts"));
            Some(Arc::new(Receipts::start(socket)))
        };
        let listener = warren_daemon::operator::listen(&dirs.socket("llm"))?;
        tracing::info!(
            runtime = %dirs.runtime.display(),
            api = args.api.as_str(),
            url = %args.url,
            "llmfs ready"
        );
        let make = move |_peer| {
            Some(Arc::new(LlmTree::new(
                backend.clone(),
                receipts.clone(),
                defaults.clone(),
            )))
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            () = warren_daemon::operator::accept_loop(
                listener,
                OperatorPolicy::from_host(),
                make,
                warren_9p::Limits::default(),
            ) => {}
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        }
        anyhow::Ok(())
    })
}
