//! warren-receiptd: the receipt daemon. Serves `/receipts` on `<runtime>/receipts.sock` and alone
//! reads the signing key. See `specs/receipts.md` and `docs/receipts.md`.

// The daemons on a call's path allocate per request; mimalloc: docs/decisions.md D11 "Allocator".
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use warren_daemon::identity;
use warren_receiptd::daemon::{self, DaemonConfig};
use warren_receiptd::{Durability, Log, LogConfig};

#[derive(Parser)]
#[command(
    name = "warren-receiptd",
    about = "Signed, hash-chained receipts served over 9P at /receipts"
)]
struct Args {
    /// Runtime dir (the socket is <runtime>/receipts.sock).
    #[arg(long, env = "WARREN_RUNTIME_DIR", default_value = "/run/warren")]
    runtime_dir: PathBuf,
    /// Data dir (receipts.db, mode 0600).
    #[arg(long, env = "WARREN_DATA_DIR", default_value = "/var/lib/warren")]
    data_dir: PathBuf,
    /// Secrets dir (receiptd/signing.key; dir 0700, file 0600).
    #[arg(
        long,
        env = "WARREN_SECRETS_DIR",
        default_value = "/etc/warren/secrets"
    )]
    secrets_dir: PathBuf,
    /// The socket path (default <runtime>/receipts.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The control socket, where root (nsd) hands over read-only views of one scope (default
    /// <runtime>/receipts.ctl).
    #[arg(long)]
    control: Option<PathBuf>,
    /// The gate's uid: the only appender of decision receipts (default: warren's gate uid).
    #[arg(long)]
    gate_uid: Option<u32>,
    /// toolfs's uid: an appender of effect receipts (default: warren's toolfs uid).
    #[arg(long)]
    toolfs_uid: Option<u32>,
    /// mcpfs's uid: an appender of effect receipts (default: warren's mcpfs uid).
    #[arg(long)]
    mcpfs_uid: Option<u32>,
    /// llmfs's uid: an appender of the model calls' query receipts (default: warren's llmfs uid).
    #[arg(long)]
    llmfs_uid: Option<u32>,
    /// netproxy's uid: an appender of effect receipts (default: warren's netproxy uid).
    #[arg(long)]
    netproxy_uid: Option<u32>,
    /// wal: acknowledge at WAL commit, fdatasync within 5 ms; fsync: acknowledge after it.
    #[arg(long, value_enum, default_value = "wal")]
    durable: Durability,
    /// Refuse appends (and receipt the refusal) below this much free space in the data dir; its
    /// lower half is the reserve kept for receiptd's own receipts and the gate's denials.
    #[arg(long, env = "WARREN_RECEIPTS_MIN_FREE_MB", default_value_t = 64)]
    min_free_mb: u64,
    /// Receipts per second per namespace subtree where its root's spec sets no
    /// `limit receipts=` (burst: 2 s of it).
    #[arg(long, env = "WARREN_RECEIPTS_SUBTREE_RATE", default_value_t = warren_receiptd::budget::DEFAULT_SUBTREE_RATE)]
    subtree_rate: u64,
    /// Receipt MiB in total per namespace subtree where its root's spec sets no
    /// `limit receipt-bytes=`.
    #[arg(long, env = "WARREN_RECEIPTS_SUBTREE_MB", default_value_t = warren_receiptd::budget::DEFAULT_SUBTREE_BYTES >> 20)]
    subtree_mb: u64,
    /// Per-scope receipt rate (per second) and burst.
    #[arg(long, default_value_t = warren_receiptd::log::DEFAULT_RATE_PER_SEC)]
    rate: f64,
    #[arg(long, default_value_t = warren_receiptd::log::DEFAULT_RATE_BURST)]
    burst: f64,
    /// Checkpoint a scope after this many uncovered entries...
    #[arg(long, default_value_t = 100)]
    checkpoint_rows: u64,
    /// ...or this many milliseconds after its first uncovered entry.
    #[arg(long, default_value_t = 5000)]
    checkpoint_ms: u64,
    /// Never generate a key at start: with no key, appends are refused.
    #[arg(long)]
    no_generate_key: bool,
    /// Generate the signing key (if the registry is empty), print its id and exit.
    #[arg(long, conflicts_with = "rotate_key")]
    init_key: bool,
    /// Rotate the signing key (daemon stopped), print the new id and exit.
    #[arg(long)]
    rotate_key: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    warren_daemon::init_tracing("receiptd");
    if let Err(e) = warren_daemon::harden() {
        eprintln!("warren-receiptd: hardening failed: {e}");
        return ExitCode::FAILURE;
    }
    let mut log = LogConfig::new(&args.data_dir, &args.secrets_dir);
    log.durability = args.durable;
    log.min_free_bytes = args.min_free_mb << 20;
    log.rate_per_sec = args.rate;
    log.rate_burst = args.burst;
    log.subtree_rate = args.subtree_rate.max(1);
    log.subtree_bytes = args.subtree_mb.max(1) << 20;
    log.checkpoint_rows = args.checkpoint_rows;
    log.checkpoint_interval = Duration::from_millis(args.checkpoint_ms);
    log.generate_key = !args.no_generate_key;
    let result = if args.init_key || args.rotate_key {
        offline(log, args.rotate_key)
    } else {
        let socket = args
            .socket
            .unwrap_or_else(|| args.runtime_dir.join("receipts.sock"));
        let control = args
            .control
            .unwrap_or_else(|| args.runtime_dir.join("receipts.ctl"));
        daemon::run(DaemonConfig {
            log,
            socket,
            control: Some(control),
            daemons: warren_receiptd::access::DaemonUids {
                gate: Some(args.gate_uid.unwrap_or_else(|| identity::Role::Gate.uid())),
                toolfs: Some(
                    args.toolfs_uid
                        .unwrap_or_else(|| identity::Role::Toolfs.uid()),
                ),
                mcpfs: Some(
                    args.mcpfs_uid
                        .unwrap_or_else(|| identity::Role::Mcpfs.uid()),
                ),
                llmfs: Some(
                    args.llmfs_uid
                        .unwrap_or_else(|| identity::Role::Llmfs.uid()),
                ),
                netproxy: Some(
                    args.netproxy_uid
                        .unwrap_or_else(|| identity::Role::Netproxy.uid()),
                ),
            },
        })
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warren-receiptd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn offline(mut cfg: LogConfig, rotate: bool) -> anyhow::Result<()> {
    cfg.generate_key = true;
    let mut log = Log::open(cfg)?;
    let keyid = log
        .signer_status()
        .map(str::to_owned)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let keyid = if rotate {
        log.rotate().map_err(|e| anyhow::anyhow!("{e}"))?
    } else {
        keyid
    };
    log.shutdown();
    println!("{keyid}");
    Ok(())
}
