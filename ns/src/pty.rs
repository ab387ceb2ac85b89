//! The launcher's side of a namespace's pty (`RunOptions::pty`): raw mode on the launcher's
//! terminal, the window size carried over (again on every SIGWINCH), and the bytes relayed both
//! ways. The line discipline that turns ^C into SIGINT is the namespace's own pty's.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::thread::JoinHandle;

use nix::sys::termios::{SetArg, Termios, cfmakeraw, tcgetattr, tcsetattr};

use crate::confine::sys;

/// The launcher's terminal in raw mode until dropped.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    pub fn enter() -> io::Result<RawMode> {
        let stdin = io::stdin();
        let saved = tcgetattr(stdin.as_fd())?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = tcsetattr(io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

/// Gives the namespace's pty the launcher terminal's window size (on SIGWINCH; the first size
/// is set by the namespace's pid 1 before the command starts).
pub fn sync_winsize(master: &OwnedFd) -> io::Result<()> {
    sys::set_winsize(master.as_fd(), sys::get_winsize(io::stdin().as_fd())?)
}

/// Relays stdin → master and master → stdout on two threads. Returns the output thread, which
/// ends when the namespace's last holder of the pty is gone (EIO on the master); join it to
/// have every byte written before exiting. The input thread is left to die with the process.
pub fn relay(master: &OwnedFd) -> io::Result<JoinHandle<()>> {
    let to_ns = std::fs::File::from(master.try_clone()?);
    let from_ns = std::fs::File::from(master.try_clone()?);
    std::thread::spawn(move || {
        let mut to_ns = to_ns;
        let _ = io::copy(&mut io::stdin().lock(), &mut to_ns);
    });
    Ok(std::thread::spawn(move || {
        let mut from_ns = from_ns;
        let mut out = io::stdout().lock();
        let _ = io::copy(&mut from_ns, &mut out);
        let _ = io::Write::flush(&mut out);
    }))
}
