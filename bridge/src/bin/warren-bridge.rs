//! `warren-bridge`: serves one mounted FUSE connection from one 9P2000.L connection, both
//! inherited as fds, in a process of its own (so nsd, which keeps CAP_SYS_ADMIN, never parses
//! FUSE or 9P itself). Hardens itself, drops to `--runas` once it holds its fds, and exits 0 when
//! the mount goes away.
//!
//!   warren-bridge --fuse-fd 3 --9p-fd 4 [--ctl-fd 5] [--owner UID:GID] [--runas UID:GID]
//!                 [--entry-timeout-ms N] [--sized-files] [--uname U] [--aname A]
//!
//! The control socket (optional) takes one path per line, each a name to drop from the kernel's
//! cache (a grant shrank), and answers each line `ok` or `error: <why>`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use clap::Parser;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use warren_bridge::{Bridge, BridgeOptions, Invalidator};

#[derive(Parser)]
#[command(
    name = "warren-bridge",
    about = "Serve a mounted FUSE fd from a 9P2000.L connection fd"
)]
struct Args {
    /// The /dev/fuse fd, already mounted (inherited from the parent).
    #[arg(long)]
    fuse_fd: RawFd,
    /// A connected stream socket speaking 9P2000.L (inherited from the parent).
    #[arg(long = "9p-fd")]
    p9_fd: RawFd,
    /// A connected stream socket for invalidations (inherited from the parent).
    #[arg(long)]
    ctl_fd: Option<RawFd>,
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
    // SAFETY: F_GETFD only reads the descriptor's flags; a closed number fails with EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd is open (checked above) and was handed to this process by its parent for the
    // bridge alone; it is taken once, at startup, before this process opens any fd of its own,
    // so no other owner of the number exists.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::fcntl::fcntl(
        &owned,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    Ok(owned)
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
    fds.sort_unstable();
    if fds.windows(2).any(|w| w[0] == w[1]) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--fuse-fd, --9p-fd and --ctl-fd must be different fds",
        ));
    }
    warren_daemon::harden()?;
    let fuse = take_inherited(args.fuse_fd)?;
    let p9 = UnixStream::from(take_inherited(args.p9_fd)?);
    let ctl = args
        .ctl_fd
        .map(take_inherited)
        .transpose()?
        .map(UnixStream::from);
    if let Some(ctl) = &ctl {
        ctl.set_nonblocking(true)?;
    }
    if let Some((uid, gid)) = args.runas {
        warren_daemon::privilege::drop_to(uid, gid, &[])?;
    }
    p9.set_nonblocking(true)?;
    let opts = BridgeOptions {
        direct_io_all: !args.sized_files,
        entry_timeout: Duration::from_millis(args.entry_timeout_ms),
        uid: args.owner.0,
        gid: args.owner.1,
        uname: args.uname,
        aname: args.aname,
        reconnect: None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = warren_9p::Client::new(tokio::net::UnixStream::from_std(p9)?, 1 << 20).await?;
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
