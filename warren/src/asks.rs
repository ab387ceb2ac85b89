//! `warren run` answers its own command's asks, sudo-style.
//!
//! While the command runs, a thread follows the gate's live event stream (blocking reads of
//! `/gate/events`, never a poll) for this namespace's session and its clones' (the subtree it is
//! the root of). On a terminal, each ask is shown as the gate's `request` file shows it (who
//! asks: namespace, command, the namespaces that cloned it and the subtree's open asks; every
//! non-printing and bidi code point escaped, the argument bytes' length, a fingerprint prefix)
//! on a surface the namespace cannot draw on: its output held (`warren_ns::pty::hold_output`)
//! and the alternate screen reset and cleared (`PromptScreen`). The terminal's input is taken
//! from the namespace for the prompt (`warren_ns::pty::divert_input`), and the typed `once`,
//! `session` or
//! `deny` is written to `/gate/pending/<id>/ctl` on a confirmed-tty operator connection. With no
//! terminal nobody can answer, so each ask is denied at once and stderr says how to answer asks
//! from `warren approvals` instead (`--asks operator`).

use std::collections::{HashSet, VecDeque};
use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;

use anyhow::{Context, Result};
use nix::sys::signal::{SigSet, SigmaskHow};
use tokio::sync::mpsc;
use warren_9p::Fid;
use warren_daemon::Dirs;
use warren_daemon::escape::escaped_lines;
use warren_gate::approvals::{Event, Shown};

use crate::approvals::{operator_connection, request_field, verb};

/// Who answers the asks of `warren run`'s command.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AsksMode {
    /// This terminal, sudo-style (once, session or deny); with no terminal, denied at once.
    #[default]
    Terminal,
    /// Nobody here: asks wait for `warren approvals` (or a write to the ask's ctl) until they
    /// expire.
    Operator,
}

/// Who answered, as the gate's receipts show it.
const NAME_ON_TTY: &str = "warren run";
const NAME_NO_TTY: &str = "warren run (no terminal)";

/// Starts answering the asks of `session` per `mode`; returns once the gate has handed over the
/// connection (an error if it would not). The thread is left to end with the process.
pub fn follow(dirs: &Dirs, session: &str, mode: AsksMode) -> Result<()> {
    if mode == AsksMode::Operator {
        return Ok(());
    }
    let tty = std::io::stdin().is_terminal();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let dirs = dirs.clone();
    let session = session.to_owned();
    spawn_with_signals_blocked(move || {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                let _ = ready_tx.send(Err(e.into()));
                return;
            }
        };
        rt.block_on(async move {
            let connected = async {
                let (client, confirmed) = connect(&dirs, tty).await?;
                let root = client.attach("warren-run", "").await?;
                Ok::<_, anyhow::Error>((client, root, confirmed))
            }
            .await;
            let (client, root, confirmed) = match connected {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            let answering = if tty {
                Answering::Terminal { confirmed }
            } else {
                Answering::DenyAtOnce
            };
            if let Err(e) = answer_asks(&client, &root, &session, answering).await {
                eprintln!("warren run: no longer following the gate's asks: {e:#}");
            }
        });
    })?;
    ready_rx
        .recv()
        .context("the asks thread ended before it was ready")?
        .context("follow the gate's asks for this namespace")
}

/// The gate connection: as root, one the gate hands out on its control socket, named so
/// receipts say `warren run` answered, and confirmed-tty on a terminal (so `session` may be
/// answered); otherwise the operator socket (`once` and `deny` only). Returns whether confirmed.
async fn connect(dirs: &Dirs, tty: bool) -> Result<(warren_9p::Client, bool)> {
    if nix::unistd::geteuid().is_root() {
        let name = if tty { NAME_ON_TTY } else { NAME_NO_TTY };
        return Ok((operator_connection(dirs, tty, Some(name)).await?, tty));
    }
    let client = warren_9p::Client::connect_unix(dirs.socket("gate"))
        .await
        .with_context(|| format!("connect {}", dirs.socket("gate").display()))?;
    Ok((client, false))
}

/// How this launcher answers its command's asks.
#[derive(Clone, Copy)]
enum Answering {
    /// Prompt on the terminal; `session` only on a confirmed-tty connection.
    Terminal { confirmed: bool },
    /// No terminal: deny each at once.
    DenyAtOnce,
}

/// `warren run` blocks the signals it forwards before it starts the namespace, so that one
/// thread takes them; this thread must never take one, whenever it starts.
fn spawn_with_signals_blocked(f: impl FnOnce() + Send + 'static) -> Result<()> {
    let old = SigSet::all().thread_swap_mask(SigmaskHow::SIG_BLOCK)?;
    let spawned = std::thread::Builder::new().name("asks".into()).spawn(f);
    old.thread_set_mask()?;
    spawned?;
    Ok(())
}

/// What the event stream tells the answering loop.
enum Note {
    Shown(Shown),
    Closed { id: i64, line: String },
}

async fn answer_asks(
    client: &warren_9p::Client,
    root: &Fid,
    session: &str,
    answering: Answering,
) -> Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Note>();
    let closed_tx = tx.clone();
    let view = warren_gate::approvals::approvals(
        client,
        move |s| {
            // Its own asks and its clones' (their `subtree` is this session): the `warren run`
            // that started a namespace answers for everything it cloned.
            if request_field(&s.request, "session") == Some(session)
                || request_field(&s.request, "subtree") == Some(session)
            {
                let _ = tx.send(Note::Shown(s.clone()));
            }
        },
        move |ev| {
            if let Event::Closed { id, line } = ev {
                let _ = closed_tx.send(Note::Closed {
                    id: *id,
                    line: line.clone(),
                });
            }
            true
        },
    );
    let answering = async {
        // Asks already answered or closed, and notes that arrived during a prompt.
        let mut done: HashSet<i64> = HashSet::new();
        let mut backlog: VecDeque<Note> = VecDeque::new();
        loop {
            let note = match backlog.pop_front() {
                Some(n) => n,
                None => match rx.recv().await {
                    Some(n) => n,
                    None => return,
                },
            };
            match note {
                Note::Closed { id, .. } => {
                    done.insert(id);
                }
                // Shown twice when it appeared between the listing and the first event.
                Note::Shown(s) if done.contains(&s.id) => {}
                Note::Shown(s) => {
                    done.insert(s.id);
                    match answering {
                        Answering::Terminal { confirmed } => {
                            prompt(root, &s, confirmed, &mut rx, &mut backlog).await;
                        }
                        Answering::DenyAtOnce => deny_untended(root, &s).await,
                    }
                }
            }
        }
    };
    tokio::select! {
        r = view => r.context("the gate's event stream")?,
        () = answering => {}
    }
    Ok(())
}

/// No terminal: nobody here can answer, so the ask is denied now rather than left to expire.
async fn deny_untended(root: &Fid, ask: &Shown) {
    let tool = request_field(&ask.request, "tool").unwrap_or("?");
    match warren_gate::approvals::answer(root, ask.id, "deny").await {
        Ok(_) => eprintln!(
            "warren run: denied ask {} (tool {tool}): no terminal to ask on. To answer asks \
             from `warren approvals` instead, run with `--asks operator`.",
            ask.id
        ),
        Err(e) => eprintln!(
            "warren run: ask {} (tool {tool}): could not deny it: {e}",
            ask.id
        ),
    }
}

/// The terminal the prompt is written to: the controlling terminal, else stderr.
fn terminal() -> Box<dyn Write + Send> {
    match std::fs::OpenOptions::new().write(true).open("/dev/tty") {
        Ok(f) => Box::new(f),
        Err(_) => Box::new(std::io::stderr()),
    }
}

/// What a typed line ends with.
enum Typed {
    Line(String),
    /// ^C or ^D: the person declines.
    Cancel,
}

/// Where the answer reader is in the typed bytes: keys that send escape sequences (arrows,
/// function keys) and a terminal's own reports (to a query the namespace wrote before the
/// prompt) arrive as sequences whose printable bytes are not typing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    Text,
    /// After ESC.
    Escape,
    /// In a CSI sequence (ESC `[`), until its final byte.
    Csi,
    /// In a string (OSC, DCS, SOS, PM, APC), until BEL or ST.
    Str,
    /// ESC inside a string (ST is ESC `\`).
    StrEscape,
    /// One byte after SS3 (ESC `O`).
    One,
}

impl Keys {
    /// The next state, and whether `b` is typed text.
    fn next(self, b: u8) -> (Keys, bool) {
        match (self, b) {
            (Keys::Text, 0x1b) => (Keys::Escape, false),
            (Keys::Text, _) => (Keys::Text, true),
            (Keys::Escape, b'[') => (Keys::Csi, false),
            (Keys::Escape, b']' | b'P' | b'X' | b'^' | b'_') => (Keys::Str, false),
            (Keys::Escape, b'O') => (Keys::One, false),
            (Keys::Escape | Keys::One, _) => (Keys::Text, false),
            (Keys::Csi, 0x40..=0x7e) => (Keys::Text, false),
            (Keys::Csi, _) => (Keys::Csi, false),
            (Keys::Str, 0x07) => (Keys::Text, false),
            (Keys::Str, 0x1b) => (Keys::StrEscape, false),
            (Keys::Str, _) => (Keys::Str, false),
            (Keys::StrEscape, b'\\') => (Keys::Text, false),
            (Keys::StrEscape, _) => (Keys::Str, false),
        }
    }
}

/// Reads one line from the diverted input, echoing it (the launcher's terminal is raw).
async fn read_line(input: &mut mpsc::UnboundedReceiver<Vec<u8>>, out: &mut dyn Write) -> Typed {
    let mut line = String::new();
    let mut keys = Keys::Text;
    while let Some(bytes) = input.recv().await {
        for b in bytes {
            let typed;
            (keys, typed) = keys.next(b);
            if !typed {
                continue;
            }
            match b {
                b'\r' | b'\n' => {
                    let _ = out.write_all(b"\r\n");
                    return Typed::Line(line);
                }
                0x03 | 0x04 => {
                    let _ = out.write_all(b"^C\r\n");
                    return Typed::Cancel;
                }
                0x7f | 0x08 if line.pop().is_some() => {
                    let _ = out.write_all(b"\x08 \x08");
                }
                0x20..=0x7e => {
                    line.push(b as char);
                    let _ = out.write_all(&[b]);
                }
                _ => {} // other controls and non-ASCII: not part of an answer
            }
        }
        let _ = out.flush();
    }
    Typed::Cancel
}

/// Waits until ask `id` closes; other notes go to `backlog`. Returns the closing line.
async fn closed(
    rx: &mut mpsc::UnboundedReceiver<Note>,
    id: i64,
    backlog: &mut VecDeque<Note>,
) -> String {
    while let Some(note) = rx.recv().await {
        match note {
            Note::Closed { id: c, line } if c == id => return line,
            other => backlog.push_back(other),
        }
    }
    std::future::pending().await
}

/// The terminal while a prompt is up: the namespace's output held and a fresh surface (the
/// alternate screen, reset: `warren_ns::pty::FRESH_SURFACE`), so what the operator answers is
/// drawn from the gate's bytes alone. Leaving it returns to the namespace's screen, then lets
/// the namespace's held output through.
struct PromptScreen {
    out: Box<dyn Write + Send>,
    left: bool,
    _hold: warren_ns::pty::OutputHold,
}

impl PromptScreen {
    fn open() -> PromptScreen {
        let hold = warren_ns::pty::hold_output();
        let mut out = terminal();
        let _ = out.write_all(warren_ns::pty::FRESH_SURFACE);
        PromptScreen {
            out,
            left: false,
            _hold: hold,
        }
    }

    /// Leaves the prompt's surface and says on the namespace's screen how the ask ended.
    fn leave(mut self, said: &str) {
        let _ = self.out.write_all(warren_ns::pty::LEAVE_SURFACE);
        let _ = write!(self.out, "\r\nwarren run: {said}\r\n");
        let _ = self.out.flush();
        self.left = true;
    }
}

impl Drop for PromptScreen {
    fn drop(&mut self) {
        if !self.left {
            let _ = self.out.write_all(warren_ns::pty::LEAVE_SURFACE);
            let _ = self.out.flush();
        }
    }
}

/// The request's lines as they fit a terminal of `(rows, cols)`: each indented and cut to the
/// width with a marker (any character outside ASCII counted as two columns, so a wide one
/// never wraps a line), at most as many as leave room for the heading and the question, and a
/// last line saying how many were left out and where the whole request is read.
pub(crate) fn fit_to_screen(request: &str, (rows, cols): (u16, u16)) -> Vec<String> {
    let cols = usize::from(cols.max(20));
    let room = usize::from(rows.max(8)) - 3;
    let width = |c: &char| if c.is_ascii() { 1 } else { 2 };
    let cut = |line: &str| -> String {
        let mut out = String::from("  ");
        if 2 + line.chars().map(|c| width(&c)).sum::<usize>() < cols {
            out.push_str(line);
            return out;
        }
        // Room for the marker " …" (its ellipsis counted as two columns).
        let mut used = 2;
        for c in line.chars() {
            if used + width(&c) + 3 >= cols {
                break;
            }
            out.push(c);
            used += width(&c);
        }
        out.push_str(" …");
        out
    };
    let lines: Vec<&str> = request.lines().collect();
    if lines.len() <= room {
        return lines.iter().map(|l| cut(l)).collect();
    }
    let mut out: Vec<String> = lines[..room - 1].iter().map(|l| cut(l)).collect();
    out.push(cut(&format!(
        "… {} more lines: read the whole request with `warren approvals`",
        lines.len() - (room - 1)
    )));
    out
}

/// Shows the ask on the terminal and answers it with what the person types.
async fn prompt(
    root: &Fid,
    ask: &Shown,
    confirmed: bool,
    rx: &mut mpsc::UnboundedReceiver<Note>,
    backlog: &mut VecDeque<Note>,
) {
    let (typed_tx, mut typed) = mpsc::unbounded_channel::<Vec<u8>>();
    let _divert = warren_ns::pty::divert_input(move |bytes| {
        let _ = typed_tx.send(bytes.to_vec());
    });
    let mut screen = PromptScreen::open();
    let out = &mut screen.out;
    // The gate escaped the request; whatever it let through is escaped here all the same. Each
    // line is cut to the terminal's width and the whole to its height, so no line wraps into
    // what looks like another and nothing the gate wrote scrolls off the top.
    let size = warren_jail::tty::get_winsize(std::io::stdin().as_fd())
        .map(|[rows, cols, ..]| (rows, cols))
        .unwrap_or((24, 80));
    let shown: String = fit_to_screen(&escaped_lines(&ask.request), size)
        .iter()
        .map(|l| format!("{l}\r\n"))
        .collect();
    let _ = write!(
        out,
        "\x1b[1mwarren run: the command asks (ask {}):\x1b[0m\r\n{shown}",
        ask.id
    );
    let choices = if confirmed {
        "once, session or deny"
    } else {
        "once or deny"
    };
    let verb_line = loop {
        let _ = write!(out, "allow? {choices}: ");
        let _ = out.flush();
        let typed = tokio::select! {
            t = read_line(&mut typed, &mut **out) => t,
            line = closed(rx, ask.id, backlog) => {
                screen.leave(&format!("ask {} closed before an answer: {}", ask.id, escaped_lines(&line)));
                return;
            }
        };
        let word = match typed {
            Typed::Cancel => "deny".to_owned(),
            Typed::Line(l) => l.trim().to_ascii_lowercase(),
        };
        let word = match word.as_str() {
            "o" => "once",
            "s" => "session",
            "d" | "n" | "no" => "deny",
            w => w,
        };
        match word {
            "once" | "deny" => match verb(word, Some(&ask.request)) {
                Ok(v) => break v,
                Err(e) => {
                    let _ = write!(out, "{}\r\n", escaped_lines(&e));
                }
            },
            "session" if confirmed => break "allow session".to_owned(),
            "" => {}
            other => {
                let _ = write!(out, "{other:?}: answer {choices}\r\n");
            }
        }
    };
    let said = match warren_gate::approvals::answer(root, ask.id, &verb_line).await {
        Ok(reply) => escaped_lines(reply.trim()),
        Err(e) => format!(
            "ask {}: {verb_line}: refused: {}",
            ask.id,
            escaped_lines(&e.to_string())
        ),
    };
    screen.leave(&said);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request taller or wider than the terminal never wraps or scrolls: every line fits
    /// one row (a wide character counted as two), and the lines left out are said.
    #[test]
    fn a_request_is_fitted_to_the_terminal() {
        let wide = format!(
            "args {{\"command\":\"echo PWNED; id{}tool fs_write\"}}",
            " ".repeat(300)
        );
        let request = format!("ask 1\ntool shell\n{wide}\n{}", "x\n".repeat(40));
        let lines = fit_to_screen(&request, (24, 80));
        assert_eq!(lines.len(), 21);
        for l in &lines {
            let cols: usize = l.chars().map(|c| if c.is_ascii() { 1 } else { 2 }).sum();
            assert!(cols < 80, "{l:?}");
        }
        assert_eq!(lines[1], "  tool shell");
        assert!(
            lines[2].starts_with("  args {\"command\":\"echo PWNED; id")
                && lines[2].ends_with(" …")
        );
        assert!(lines[20].contains("more lines"), "{:?}", lines[20]);
        let cjk = "名".repeat(100);
        for l in fit_to_screen(&cjk, (24, 40)) {
            let cols: usize = l.chars().map(|c| if c.is_ascii() { 1 } else { 2 }).sum();
            assert!(cols < 40, "{l:?}");
        }
    }

    fn typed(bytes: &[u8]) -> String {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(bytes.to_vec()).unwrap();
        drop(tx);
        let mut echo = Vec::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        match rt.block_on(read_line(&mut rx, &mut echo)) {
            Typed::Line(l) => l,
            Typed::Cancel => "<cancel>".into(),
        }
    }

    /// A terminal's report (to a query the namespace wrote before the prompt) and keys that
    /// send sequences are not typing: only what the person typed is the answer.
    #[test]
    fn escape_sequences_in_the_input_are_not_typing() {
        assert_eq!(typed(b"\x1b[?1;2conce\r"), "once");
        assert_eq!(typed(b"\x1b]l once\x1b\\deny\r"), "deny");
        assert_eq!(typed(b"\x1b]11;rgb:0/0/0\x07deny\r"), "deny");
        assert_eq!(typed(b"\x1bOAdeny\x1b[A\r"), "deny");
        assert_eq!(typed(b"onx\x7fce\n"), "once");
    }
}
