//! What every warren daemon shares: where its files live, how it hardens itself, how it accepts
//! operator connections (and refuses everyone else), and how a trusted peer hands it a connection
//! with fds over a control socket. It serves no tree of its own; the sockets and directories it
//! guards are listed in `docs/architecture.md` ("Sockets and directories"), and the claims it
//! backs (operator-only sockets, warren's dirs never bindable) in `docs/security-model.md`.

pub mod accept;
pub mod dirs;
pub mod escape;
pub mod handoff;
pub mod identity;
pub mod operator;
pub mod peer;

pub use dirs::Dirs;
pub use warren_jail::privilege::{harden, raise_fd_limit};

/// Logs to stderr, filtered by `WARREN_LOG` (default `info`), each line tagged with the daemon.
pub fn init_tracing(name: &'static str) {
    init_tracing_with(name, "info");
}

/// As [`init_tracing`], with `default` as the filter when `WARREN_LOG` is unset (e.g.
/// `info,rmcp=warn`: a library that logs every message of a hostile peer at info would let the
/// peer write warren's log).
pub fn init_tracing_with(name: &'static str, default: &str) {
    use tracing_subscriber::{EnvFilter, fmt};
    let filter = EnvFilter::try_from_env("WARREN_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
    tracing::debug!(daemon = name, "tracing started");
}
