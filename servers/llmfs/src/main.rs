//! `warren-llmfs`: serves the model as files (`docs/llm.md`) on the operator socket
//! `<runtime>/llm.sock`, and on each namespace's connection nsd hands over on
//! `<runtime>/llmfs.ctl` (`mount llm PATH`); each connection has sessions of its own.

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
use warren_proto::llm::CONTROL_NAME;

/// The fd of the key file, opened for llmfs by the supervisor (empty: it found none).
const KEY_FD_ENV: &str = "WARREN_LLM_KEY_FD";

/// The key from an inherited fd (`name` is the file it was opened from, for errors).
fn read_key_fd(fd: &str, name: &std::path::Path) -> anyhow::Result<Option<String>> {
    use std::io::Read;
    let fd: i32 = fd
        .parse()
        .map_err(|_| anyhow::anyhow!("{KEY_FD_ENV}={fd}: not an fd number"))?;
    // The supervisor opened this fd for us alone; it is read once, here.
    let mut file = std::fs::File::from(
        warren_jail::inherited::take(fd)
            .map_err(|e| anyhow::anyhow!("{KEY_FD_ENV}={fd}: not an open fd: {e}"))?,
    );
    let mut key = String::new();
    file.read_to_string(&mut key)
        .map_err(|e| anyhow::anyhow!("cannot read the key file {}: {e}", name.display()))?;
    if key.trim().is_empty() {
        anyhow::bail!("the key file {} is empty", name.display());
    }
    Ok(Some(key.trim().to_owned()))
}

#[derive(Parser, Debug)]
#[command(
    name = "warren-llmfs",
    about = "warren's model server: the model served as files (9P2000.L)"
)]
struct Args {
    /// Where the sockets live (default: $WARREN_RUNTIME_DIR, else /run/warren).
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
    /// The backend's base URL (the API paths `/v1/...` are appended). None: every ask ends with
    /// an error saying so (the supervisor starts llmfs whether or not one was given).
    #[arg(long, env = "WARREN_LLM_URL", default_value = "")]
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
    /// Decide no namespace's model call (for tests of llmfs alone). Without it and with no gate
    /// connection (`WARREN_GATE_FD`), every namespace's model call is denied.
    #[arg(long)]
    no_gate: bool,
    /// MiB llmfs holds at most for one namespace subtree's sessions (settings, conversations,
    /// requests, replies) when its root's spec sets no `limit llm-bytes=`; and for each operator
    /// connection.
    #[arg(long, default_value_t = warren_llmfs::memory::DEFAULT_SUBTREE_BYTES >> 20)]
    subtree_mb: u64,
    /// MiB one request to the model may have at most (its JSON body): an ask whose conversation
    /// needs more is refused.
    #[arg(long, default_value_t = warren_llmfs::memory::DEFAULT_MAX_REQUEST_BYTES >> 20)]
    max_request_mb: u64,
}

fn main() -> anyhow::Result<()> {
    // The gate connection first: no other fd may be opened before it is taken.
    let gate_fd = warren_toolfs::gate::take_inherited_fd()?;
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
    let mib = |flag: &str, n: u64| {
        n.checked_mul(1 << 20)
            .filter(|&b| b > 0)
            .ok_or_else(|| anyhow::anyhow!("{flag} {n}: MiB, more than 0"))
    };
    let subtree_bytes = mib("--subtree-mb", args.subtree_mb)?;
    let max_request_bytes = mib("--max-request-mb", args.max_request_mb)?;
    // A new session starts with this name: it must be one a namespace could write to `model`.
    warren_llmfs::session::check_model(args.model.as_bytes())
        .map_err(|e| anyhow::anyhow!("--model {:?}: {e}", args.model))?;
    let key_file = args
        .key_file
        .clone()
        .unwrap_or_else(|| dirs.secrets.join("llm.key"));
    // The supervisor reads the key file as root (the secrets dir is not llmfs's) and hands it
    // over as an fd.
    let key = match std::env::var(KEY_FD_ENV) {
        Ok(fd) if fd.is_empty() => None,
        Ok(fd) => read_key_fd(&fd, &key_file)?,
        Err(_) => BackendConfig::read_key(&key_file)?,
    };
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
        max_request_bytes,
    };
    let ledger = warren_llmfs::memory::Ledger::new(subtree_bytes);
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
        let gate = if args.no_gate {
            tracing::warn!("--no-gate: namespaces' model calls are not decided by the gate");
            None
        } else {
            Some(Arc::new(
                warren_proto::gate::GateClient::inherited(gate_fd).await,
            ))
        };
        // The control socket first: once `llm.sock` answers, both do.
        let ctl = warren_daemon::operator::listen(&dirs.control(CONTROL_NAME))?;
        let listener = warren_daemon::operator::listen(&dirs.socket("llm"))?;
        tracing::info!(
            runtime = %dirs.runtime.display(),
            api = args.api.as_str(),
            url = %args.url,
            "llmfs ready"
        );
        let make_tree: Arc<dyn Fn() -> LlmTree + Send + Sync> = Arc::new(move || {
            LlmTree::new(
                backend.clone(),
                receipts.clone(),
                defaults.clone(),
                ledger.clone(),
            )
        });
        let for_ctl = make_tree.clone();
        let make = move |_peer| Some(Arc::new(make_tree()));
        tokio::spawn(warren_llmfs::control::serve_control(
            ctl,
            for_ctl,
            gate,
            warren_9p::Limits::default(),
        ));
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
