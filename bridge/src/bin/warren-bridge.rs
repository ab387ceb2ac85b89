//! `warren-bridge`: serves one mounted FUSE connection from one 9P2000.L connection, both
//! inherited as fds, in a process of its own (so nsd, which keeps CAP_SYS_ADMIN, never parses
//! FUSE or 9P itself). Hardens itself, drops to `--runas` once it holds its fds, and exits 0 when
//! the mount goes away. The contract is `specs/bridge.md`.
//!
//!   warren-bridge --fuse-fd 3 --9p-fd 4 [--ctl-fd 5] [--owner UID:GID] [--runas UID:GID]
//!                 [--entry-timeout-ms N] [--sized-files] [--call-files [--report-calls]]
//!                 [--uname U] [--aname A]
//!
//! The control socket (optional) takes one path per line, each a name to drop from the kernel's
//! cache (a grant shrank), and answers each line `ok` or `error: <why>`.

// The daemons on a call's path allocate per request; mimalloc: docs/decisions.md D11 "Allocator".
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use warren_bridge::{Bridge, BridgeOptions, Invalidator, Reconnect};

#[derive(Parser)]
#[command(
    name = "warren-bridge",
    about = "Serve a mounted FUSE fd from a 9P2000.L connection fd"
)]
struct Args {
    /// The /dev/fuse fd, already mounted (inherited from the parent).
    #[arg(long)]
    fuse_fd: RawFd,
    /// A connected stream socket speaking 9P2000.L (inherited from the parent): a Unix socket
    /// (an nsd-made socketpair, a `unix!` server) or a TCP connection (`tcp!host!port`).
    #[arg(long = "9p-fd")]
    p9_fd: RawFd,
    /// A connected stream socket for invalidations (inherited from the parent).
    #[arg(long)]
    ctl_fd: Option<RawFd>,
    /// A connected Unix socket to nsd: when the server goes away (a daemon restarted), the
    /// bridge asks there for a new connection — made by nsd with the same grant — and
    /// re-attaches (inherited from the parent).
    #[arg(long)]
    reconnect_fd: Option<RawFd>,
    /// The owner shown for every file, UID:GID.
    #[arg(long, default_value = "0:0", value_parser = uid_gid)]
    owner: (u32, u32),
    /// Drop to UID:GID (no supplementary groups) once the fds are held.
    #[arg(long, value_parser = uid_gid)]
    runas: Option<(u32, u32)>,
    /// How long the kernel may cache names and attributes.
    #[arg(long, default_value_t = 60_000)]
    entry_timeout_ms: u64,
    /// Files have real sizes (a file server such as diod): use the page cache for files whose
    /// size is not 0, instead of direct I/O on every file.
    #[arg(long)]
    sized_files: bool,
    /// Every file opened for reading and writing is a call file (toolfs's /tool): its first
    /// write goes out with its first read.
    #[arg(long)]
    call_files: bool,
    /// With --call-files and --reconnect-fd: report each finished call to nsd on the reconnect
    /// socket (`called TOOL ARGS_SHA256 ARGS_LEN RESULT_LEN`, a newline, the result's first
    /// bytes), so nsd receipts a namespace's calls to a peer.
    #[arg(long, requires_all = ["call_files", "reconnect_fd"])]
    report_calls: bool,
    #[arg(long, default_value = "warren")]
    uname: String,
    #[arg(long, default_value = "")]
    aname: String,
}

fn uid_gid(s: &str) -> Result<(u32, u32), String> {
    let (u, g) = s.split_once(':').ok_or("expected UID:GID")?;
    Ok((
        u.parse().map_err(|e| format!("uid: {e}"))?,
        g.parse().map_err(|e| format!("gid: {e}"))?,
    ))
}

/// Takes ownership of an fd the parent handed down, after checking it is open. Refuses stderr
/// (the log) and takes each fd at most once.
fn take_inherited(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 0 || fd == libc::STDERR_FILENO {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fd {fd} cannot be served"),
        ));
    }
    // Handed to this process by its parent for the bridge alone, taken once, at startup.
    warren_jail::inherited::take(fd)
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    warren_daemon::init_tracing("warren-bridge");
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "warren-bridge failed");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> io::Result<()> {
    let mut fds = vec![args.fuse_fd, args.p9_fd];
    fds.extend(args.ctl_fd);
    fds.extend(args.reconnect_fd);
    fds.sort_unstable();
    if fds.windows(2).any(|w| w[0] == w[1]) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--fuse-fd, --9p-fd, --ctl-fd and --reconnect-fd must be different fds",
        ));
    }
    warren_daemon::harden()?;
    let fuse = take_inherited(args.fuse_fd)?;
    let p9 = take_inherited(args.p9_fd)?;
    let ctl = args
        .ctl_fd
        .map(take_inherited)
        .transpose()?
        .map(UnixStream::from);
    if let Some(ctl) = &ctl {
        ctl.set_nonblocking(true)?;
    }
    let reconnect_sock = args
        .reconnect_fd
        .map(take_inherited)
        .transpose()?
        .map(UnixStream::from);
    if let Some(r) = &reconnect_sock {
        r.set_nonblocking(true)?;
    }
    if let Some((uid, gid)) = args.runas {
        warren_jail::privilege::drop_to(&warren_jail::privilege::Identity::new(uid, gid))?;
    }
    let p9 = NinePStream::new(p9)?;
    let mut opts = BridgeOptions {
        direct_io_all: !args.sized_files,
        call_files: args.call_files,
        entry_timeout: Duration::from_millis(args.entry_timeout_ms),
        uid: args.owner.0,
        gid: args.owner.1,
        uname: args.uname,
        aname: args.aname,
        reconnect: None,
        calls: None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        if let Some(sock) = reconnect_sock {
            let sock = Arc::new(tokio::sync::Mutex::new(tokio::net::UnixStream::from_std(
                sock,
            )?));
            if args.report_calls {
                let (tx, rx) = tokio::sync::mpsc::channel(64);
                opts.calls = Some(tx);
                tokio::spawn(report_calls(sock.clone(), rx));
            }
            opts.reconnect = Some(reconnect_hook(sock));
        }
        let client = p9.client().await?;
        let bridge = Bridge::new(fuse, client, opts).await?;
        if let Some(ctl) = ctl {
            tokio::spawn(serve_control(
                tokio::net::UnixStream::from_std(ctl)?,
                bridge.invalidator(),
            ));
        }
        bridge.run().await
    })
}

/// The 9P connection, by the socket's address family.
enum NinePStream {
    Unix(UnixStream),
    Tcp(std::net::TcpStream),
}

impl NinePStream {
    /// A 9P client on the connection.
    async fn client(self) -> io::Result<warren_9p::Client> {
        match self {
            NinePStream::Unix(s) => {
                warren_9p::Client::new(tokio::net::UnixStream::from_std(s)?, 1 << 20).await
            }
            NinePStream::Tcp(s) => {
                warren_9p::Client::new(tokio::net::TcpStream::from_std(s)?, 1 << 20).await
            }
        }
    }

    fn new(fd: OwnedFd) -> io::Result<NinePStream> {
        use nix::sys::socket::SockaddrLike;
        let addr: nix::sys::socket::SockaddrStorage =
            nix::sys::socket::getsockname(std::os::fd::AsRawFd::as_raw_fd(&fd))?;
        let stream = match addr.family() {
            Some(nix::sys::socket::AddressFamily::Unix) => NinePStream::Unix(UnixStream::from(fd)),
            Some(
                nix::sys::socket::AddressFamily::Inet | nix::sys::socket::AddressFamily::Inet6,
            ) => NinePStream::Tcp(std::net::TcpStream::from(fd)),
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("--9p-fd is a socket of family {other:?}, not Unix or TCP"),
                ));
            }
        };
        match &stream {
            NinePStream::Unix(s) => s.set_nonblocking(true)?,
            NinePStream::Tcp(s) => {
                s.set_nonblocking(true)?;
                s.set_nodelay(true)?;
            }
        }
        Ok(stream)
    }
}

/// Asks nsd for a new connection on `sock` (`reconnect` → `ok` plus the fd, or `error: <why>`).
/// The bridge calls it once per lost connection, one at a time.
fn reconnect_hook(sock: Arc<tokio::sync::Mutex<tokio::net::UnixStream>>) -> Reconnect {
    Box::new(move || {
        let sock = sock.clone();
        Box::pin(async move {
            let sock = sock.lock().await;
            warren_daemon::handoff::send_async(&sock, b"reconnect", &[]).await?;
            let (reply, mut fds) = warren_daemon::handoff::recv_async(&sock).await?;
            match (reply.as_slice(), fds.pop(), fds.is_empty()) {
                (b"ok", Some(fd), true) => NinePStream::new(fd)?.client().await,
                _ => Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("nsd: {}", String::from_utf8_lossy(&reply)),
                )),
            }
        })
    })
}

/// Sends each finished call to nsd (`called …`) and waits for its `ok`, one at a time on the
/// socket the reconnect requests share; a refusal is logged (nsd says why in its own log).
async fn report_calls(
    sock: Arc<tokio::sync::Mutex<tokio::net::UnixStream>>,
    mut calls: tokio::sync::mpsc::Receiver<(
        warren_bridge::CallReport,
        tokio::sync::oneshot::Sender<()>,
    )>,
) {
    while let Some((c, ack)) = calls.recv().await {
        let mut record = format!(
            "called {} {} {} {}\n",
            c.tool, c.args_sha256, c.args_len, c.result_len
        )
        .into_bytes();
        record.extend_from_slice(&c.result);
        let sock = sock.lock().await;
        let answered = async {
            warren_daemon::handoff::send_async(&sock, &record, &[]).await?;
            warren_daemon::handoff::recv_async(&sock).await
        };
        match answered.await {
            Ok((reply, _)) if reply == b"ok" => {}
            Ok((reply, _)) => tracing::warn!(
                tool = %c.tool,
                "nsd did not record a call: {}",
                String::from_utf8_lossy(&reply)
            ),
            Err(e) => tracing::warn!(tool = %c.tool, "nsd did not record a call: {e}"),
        }
        let _ = ack.send(());
    }
}

/// The longest control line taken (a path); longer lines are answered with an error.
const MAX_CTL_LINE: usize = 4096;

/// One path per line → `ok` or `error: <why>`, until the parent closes the socket.
async fn serve_control(stream: tokio::net::UnixStream, invalidator: Invalidator) {
    let (rd, mut wr) = stream.into_split();
    let mut lines = BufReader::new(rd).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let answer = if line.len() > MAX_CTL_LINE {
            format!("error: line longer than {MAX_CTL_LINE} bytes\n")
        } else {
            match invalidator.invalidate(line.trim()).await {
                Ok(()) => "ok\n".to_owned(),
                Err(e) => format!("error: {e}\n"),
            }
        };
        if wr.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}
