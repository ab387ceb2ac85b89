//! The launcher's side of a namespace's pty (`RunOptions::pty`): raw mode on the launcher's
//! terminal, the window size carried over (again on every SIGWINCH), and the bytes relayed both
//! ways. The line discipline that turns ^C into SIGINT is the namespace's own pty's. While the
//! launcher prompts on its terminal, `divert_input` takes the typed bytes away from the namespace.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;
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

/// Where typed bytes go instead of the namespace while a divert is installed.
type InputSink = Box<dyn FnMut(&[u8]) + Send>;

/// The launcher's one divert (process-wide: there is one terminal).
static DIVERT: Mutex<Option<InputSink>> = Mutex::new(None);

/// While this lives, what is typed on the launcher's terminal goes to its sink, not to the
/// namespace (a prompt of the launcher's own, e.g. `warren run` asking about a tool call).
/// Dropping it sends input to the namespace again.
pub struct InputDivert(());

/// Installs `sink` as the divert, replacing any other. Bytes already read from the terminal are
/// not taken back; everything read from now on goes to `sink`, which runs on the input thread
/// under the divert's lock: it must hand the bytes on (e.g. to a channel), never block.
pub fn divert_input(sink: impl FnMut(&[u8]) + Send + 'static) -> InputDivert {
    *DIVERT.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(sink));
    InputDivert(())
}

impl Drop for InputDivert {
    fn drop(&mut self) {
        *DIVERT.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Copies the launcher's stdin to the namespace, or to the divert while one is installed.
fn relay_input(mut to_ns: std::fs::File) {
    let mut stdin = io::stdin().lock();
    let mut buf = [0u8; 4096];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if let Some(sink) = DIVERT.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            sink(&buf[..n]);
            continue;
        }
        if to_ns.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// Relays stdin → master and master → stdout on two threads. Returns the output thread, which
/// ends when the namespace's last holder of the pty is gone (EIO on the master); join it to
/// have every byte written before exiting. The input thread is left to die with the process.
pub fn relay(master: &OwnedFd) -> io::Result<JoinHandle<()>> {
    let to_ns = std::fs::File::from(master.try_clone()?);
    let from_ns = std::fs::File::from(master.try_clone()?);
    std::thread::spawn(move || relay_input(to_ns));
    Ok(std::thread::spawn(move || {
        let mut from_ns = from_ns;
        let mut out = io::stdout().lock();
        let _ = io::copy(&mut from_ns, &mut out);
        let _ = io::Write::flush(&mut out);
    }))
}
