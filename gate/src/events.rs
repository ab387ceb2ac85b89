//! The live event stream behind `/gate/events`: each ask shown and each ask closed, as one line.
//! A reader blocks until there is an event past what it has read (a `watch` channel wakes it),
//! so `warren approvals` is event-driven, never a poll.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::watch;

/// Events kept for readers that fall behind; an older event is gone for them.
const RETAINED: usize = 4096;

#[derive(Clone, Debug)]
pub struct Event {
    pub seq: u64,
    /// The session the event is about (namespace readers see only their descendants').
    pub session: String,
    /// One line, newline included.
    pub line: String,
}

pub struct Events {
    log: Mutex<VecDeque<Event>>,
    latest: watch::Sender<u64>,
}

impl Default for Events {
    fn default() -> Events {
        Events {
            log: Mutex::new(VecDeque::new()),
            latest: watch::channel(0).0,
        }
    }
}

impl Events {
    pub fn push(&self, session: &str, line: String) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let seq = log.back().map_or(1, |e| e.seq + 1);
        log.push_back(Event {
            seq,
            session: session.to_owned(),
            line,
        });
        if log.len() > RETAINED {
            log.pop_front();
        }
        drop(log);
        self.latest.send_replace(seq);
    }

    /// The newest event's sequence number (0: none yet).
    pub fn latest(&self) -> u64 {
        *self.latest.borrow()
    }

    /// Events after `after` that `keep` lets through; waits until there is at least one.
    pub async fn after(&self, after: u64, keep: impl Fn(&Event) -> bool) -> Vec<Event> {
        let mut rx = self.latest.subscribe();
        let mut cursor = after;
        loop {
            let found: Vec<Event> = {
                let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
                log.iter().filter(|e| e.seq > cursor).cloned().collect()
            };
            if let Some(last) = found.last() {
                cursor = last.seq;
            }
            let kept: Vec<Event> = found.into_iter().filter(|e| keep(e)).collect();
            if !kept.is_empty() {
                return kept;
            }
            if rx.wait_for(|&latest| latest > cursor).await.is_err() {
                return Vec::new();
            }
        }
    }
}

/// One reader's view of the stream: the bytes it has been shown, from the events after the
/// moment it opened the file.
pub struct Cursor {
    /// The last event rendered.
    seq: u64,
    /// Bytes before `base` were dropped once read past.
    base: u64,
    buf: Vec<u8>,
}

impl Cursor {
    pub fn new(from_seq: u64) -> Cursor {
        Cursor {
            seq: from_seq,
            base: 0,
            buf: Vec::new(),
        }
    }

    /// Bytes at `offset` (at most `count`), waiting for an event if there is nothing there yet.
    pub async fn read(
        &mut self,
        events: &Events,
        offset: u64,
        count: u32,
        keep: impl Fn(&Event) -> bool,
    ) -> Vec<u8> {
        // Drop what the reader has moved past (it reads forward).
        if offset > self.base {
            let drop_n = ((offset - self.base) as usize).min(self.buf.len());
            self.buf.drain(..drop_n);
            self.base += drop_n as u64;
        }
        let start = offset.max(self.base);
        while start >= self.base + self.buf.len() as u64 {
            let got = events.after(self.seq, &keep).await;
            let Some(last) = got.last() else {
                return Vec::new();
            };
            self.seq = last.seq;
            for e in got {
                self.buf.extend_from_slice(e.line.as_bytes());
            }
        }
        let from = (start - self.base) as usize;
        let to = from.saturating_add(count as usize).min(self.buf.len());
        self.buf[from..to].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_reader_blocks_until_an_event_it_may_see() {
        let events = Arc::new(Events::default());
        events.push("a", "old\n".into());
        let mut cursor = Cursor::new(events.latest());
        let reader = {
            let events = events.clone();
            tokio::spawn(async move { cursor.read(&events, 0, 100, |e| e.session == "b").await })
        };
        tokio::task::yield_now().await;
        events.push("a", "not mine\n".into());
        tokio::task::yield_now().await;
        assert!(!reader.is_finished());
        events.push("b", "mine\n".into());
        assert_eq!(reader.await.unwrap(), b"mine\n");
    }

    #[tokio::test]
    async fn offsets_continue_across_reads() {
        let events = Events::default();
        let mut cursor = Cursor::new(0);
        events.push("s", "one\n".into());
        events.push("s", "two\n".into());
        assert_eq!(cursor.read(&events, 0, 3, |_| true).await, b"one");
        assert_eq!(cursor.read(&events, 3, 100, |_| true).await, b"\ntwo\n");
    }
}
