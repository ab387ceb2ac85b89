//! One call through a call file, on a thread of its own: open `call` read-write, write the
//! arguments, read the envelope. The first read runs the call and blocks — through the gate's
//! decision (an ask: until the operator answers) and the tool's run.
//!
//! Withdrawing: a call whose fd is closed before its first read never runs, and one whose
//! first read is interrupted while it is still readying (gate, ask, its turn) is withdrawn by
//! toolfs (the kernel turns the interrupt into FUSE_INTERRUPT, the bridge into Tflush). A
//! blocked read is interrupted by a signal to its thread; SIGUSR1 has a handler in this process
//! (installed at start) so it interrupts and kills nothing. A call already started runs to its
//! end; its result is dropped.

use std::io::{ErrorKind, Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::pthread::{Pthread, pthread_kill, pthread_self};
use nix::sys::signal::Signal;
use tokio::sync::oneshot;

/// The signal that interrupts a call's blocked read (its handler does nothing).
pub const INTERRUPT: Signal = Signal::SIGUSR1;

#[derive(Default)]
struct State {
    /// The thread blocked in (or about to enter) the call's read.
    reading: Option<Pthread>,
    withdrawn: bool,
    finished: bool,
}

/// A call under way.
pub struct Pending {
    state: Arc<Mutex<State>>,
    pub result: oneshot::Receiver<std::io::Result<Vec<u8>>>,
}

/// Starts a call through the call file `call` with `args` (JSON bytes).
pub fn start(call: PathBuf, args: Vec<u8>) -> Pending {
    let state = Arc::new(Mutex::new(State::default()));
    let (done, result) = oneshot::channel();
    let shared = state.clone();
    // A pooled thread: no thread is made per call. It is signalled only while it is in this
    // call's read (`reading`, under the lock), never once the call is `finished`.
    tokio::task::spawn_blocking(move || {
        let outcome = run(&call, &args, &shared);
        shared.lock().unwrap_or_else(|e| e.into_inner()).finished = true;
        let _ = done.send(outcome);
    });
    Pending { state, result }
}

fn run(call: &std::path::Path, args: &[u8], state: &Mutex<State>) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(call)?;
    file.write_all(args)?;
    {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        if s.withdrawn {
            // Closed before its first read: it never runs.
            return Err(ErrorKind::Interrupted.into());
        }
        s.reading = Some(pthread_self());
    }
    let mut envelope = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => envelope.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {
                if state.lock().unwrap_or_else(|e| e.into_inner()).withdrawn {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
    state.lock().unwrap_or_else(|e| e.into_inner()).reading = None;
    Ok(envelope)
}

impl Pending {
    /// Withdraws the call: its fd is closed before its read if it has not begun reading;
    /// otherwise its read is interrupted, again every 50 ms for a second (a signal that lands
    /// just before the read blocks interrupts nothing), until its thread is done.
    pub fn withdraw(&self) {
        if self
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .finished
        {
            return;
        }
        let state = self.state.clone();
        std::thread::spawn(move || {
            for _ in 0..20 {
                {
                    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                    if s.finished {
                        return;
                    }
                    s.withdrawn = true;
                    if let Some(thread) = s.reading {
                        // The thread is alive: it sets `finished` under this lock before ending.
                        let _ = pthread_kill(thread, INTERRUPT);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
}

/// A call whose caller is gone (a cancelled request, a closed HTTP session, a dropped handler)
/// is withdrawn like a cancelled one.
impl Drop for Pending {
    fn drop(&mut self) {
        self.withdraw();
    }
}
