//! The launcher's side of a namespace's pty (`RunOptions::pty`): raw mode on the launcher's
//! terminal, the window size carried over (again on every SIGWINCH), and the bytes relayed both
//! ways. The line discipline that turns ^C into SIGINT is the namespace's own pty's. While the
//! launcher prompts on its terminal, `divert_input` takes the typed bytes away from the namespace
//! and `hold_output` keeps the namespace's bytes off the terminal, and the prompt is drawn on a
//! [`FRESH_SURFACE`] the namespace's earlier bytes cannot have prepared.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;

use nix::sys::termios::{SetArg, Termios, cfmakeraw, tcgetattr, tcsetattr};

use warren_jail::tty;

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
    tty::set_winsize(master.as_fd(), tty::get_winsize(io::stdin().as_fd())?)
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

/// Whether the namespace's output is held (a launcher prompt is on the terminal).
static OUTPUT_HELD: Mutex<bool> = Mutex::new(false);
/// Signalled when the hold is released.
static OUTPUT_RELEASED: Condvar = Condvar::new();

/// While this lives, nothing the namespace writes reaches the terminal: the relay keeps the
/// chunk it has read (at most one buffer) and reads no more, so the namespace's writes block on
/// its full pty instead of piling up here. Dropping it lets the held bytes through.
pub struct OutputHold(());

/// Holds the namespace's output. Returns once a write the relay had begun has ended, so every
/// byte written to the terminal after this is the launcher's own.
pub fn hold_output() -> OutputHold {
    *OUTPUT_HELD.lock().unwrap_or_else(|p| p.into_inner()) = true;
    OutputHold(())
}

impl Drop for OutputHold {
    fn drop(&mut self) {
        *OUTPUT_HELD.lock().unwrap_or_else(|p| p.into_inner()) = false;
        OUTPUT_RELEASED.notify_all();
    }
}

/// Written before a launcher prompt: a surface on which nothing the namespace wrote before can
/// change what the prompt shows. In order: CAN and ST end an escape sequence or a string (OSC,
/// DCS) left open, which would swallow the prompt; synchronized output ends (else nothing new
/// is drawn); the alternate screen, cleared (the namespace's screen is kept for after); a soft
/// reset (DECSTR) and the settings it may leave: attributes, scroll margins, origin mode,
/// autowrap, insert mode, reverse video, a hidden cursor, character sets, the colour palette;
/// mouse, focus and paste reports off (their bytes are not typing); the cursor home.
pub const FRESH_SURFACE: &[u8] = concat!(
    "\x18\x1b\\",                                 // CAN, ST
    "\x1b[?2026l",                                // synchronized output off
    "\x1b[?1049h",                                // alternate screen
    "\x1b[!p\x1b[0m\x1b[r\x1b[?6l\x1b[?7h",       // DECSTR, SGR 0, margins, origin, autowrap
    "\x1b[4l\x1b[?5l\x1b[?25h",                   // insert mode, reverse video, cursor shown
    "\x0f\x1b(B",                                 // SI, G0 = ASCII
    "\x1b]104\x1b\\\x1b]110\x1b\\\x1b]111\x1b\\", // palette, foreground, background
    "\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1004l\x1b[?1006l\x1b[?2004l",
    "\x1b[H\x1b[2J",
)
.as_bytes();

/// Written after a launcher prompt: the alternate screen cleared and left, the cursor back
/// where the namespace had it.
pub const LEAVE_SURFACE: &[u8] = b"\x1b[H\x1b[2J\x1b[?1049l";

/// Copies the namespace's output to the terminal, except while a [`hold_output`] lives. The
/// write happens under the hold's lock, so a hold never starts in the middle of one.
fn relay_output(mut from_ns: std::fs::File, out: &mut impl Write) {
    let mut buf = [0u8; 4096];
    loop {
        let n = match from_ns.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return, // EIO: the namespace's last holder of the pty is gone
        };
        let mut held = OUTPUT_HELD.lock().unwrap_or_else(|p| p.into_inner());
        while *held {
            held = OUTPUT_RELEASED
                .wait(held)
                .unwrap_or_else(|p| p.into_inner());
        }
        if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
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
        relay_output(from_ns, &mut io::stdout().lock());
    }))
}
