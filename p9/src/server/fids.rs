//! The per-connection fid table, and the queues that keep requests on one fid in arrival order.
//!
//! Every request takes its place in the queue of each fid it names (including the newfid of a
//! walk or attach) when it is read, before it is spawned. A place is a oneshot: the request waits
//! for its predecessor's sender to drop (on completion, on error, or when its task is aborted by a
//! flush), and drops its own when done. Requests naming different fids never wait on each other.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{Mutex as AsyncMutex, oneshot};

use crate::{Errno, Result};

/// A live fid: the tree's state (taken out only when the fid is clunked or the session ends)
/// and whether it has been opened.
pub(super) struct Live<F> {
    state: Option<F>,
    pub(super) opened: bool,
}

impl<F> Live<F> {
    /// The tree's state; EBADF once the session has taken it away.
    pub(super) fn state(&mut self) -> Result<&mut F> {
        self.state.as_mut().ok_or(Errno::EBADF)
    }

    pub(super) fn take(&mut self) -> Option<F> {
        self.state.take()
    }

    /// Replaces the state (a walk with newfid == fid), returning the old one.
    pub(super) fn replace(&mut self, state: F) -> Option<F> {
        self.opened = false;
        self.state.replace(state)
    }
}

pub(super) type LiveRef<F> = Arc<AsyncMutex<Live<F>>>;

struct Slot<F> {
    live: Option<LiveRef<F>>,
    /// The place of the last request queued on this fid.
    tail: Option<oneshot::Receiver<()>>,
    /// Requests queued on this fid and not yet finished.
    queued: usize,
}

/// A request's places in the queues of the fids it names.
pub(super) struct Places {
    pub(super) wait_for: Vec<oneshot::Receiver<()>>,
    pub(super) done: Vec<oneshot::Sender<()>>,
    pub(super) fids: Vec<u32>,
}

pub(super) struct FidTable<F> {
    slots: HashMap<u32, Slot<F>>,
    live_count: usize,
}

impl<F> FidTable<F> {
    pub(super) fn new() -> FidTable<F> {
        FidTable {
            slots: HashMap::new(),
            live_count: 0,
        }
    }

    /// Queues a request on `fids` (distinct).
    pub(super) fn enqueue(&mut self, fids: Vec<u32>) -> Places {
        let mut places = Places {
            wait_for: Vec::new(),
            done: Vec::new(),
            fids,
        };
        for &fid in &places.fids {
            let slot = self.slots.entry(fid).or_insert_with(|| Slot {
                live: None,
                tail: None,
                queued: 0,
            });
            let (tx, rx) = oneshot::channel();
            if let Some(prev) = slot.tail.replace(rx) {
                places.wait_for.push(prev);
            }
            slot.queued += 1;
            places.done.push(tx);
        }
        places
    }

    /// A request queued on `fids` has finished (or was cancelled).
    pub(super) fn release(&mut self, fids: &[u32]) {
        for fid in fids {
            if let Some(slot) = self.slots.get_mut(fid) {
                slot.queued = slot.queued.saturating_sub(1);
                if slot.queued == 0 && slot.live.is_none() {
                    self.slots.remove(fid);
                }
            }
        }
    }

    pub(super) fn get(&self, fid: u32) -> Option<LiveRef<F>> {
        self.slots.get(&fid).and_then(|s| s.live.clone())
    }

    /// Whether a new fid numbered `fid` may be created now.
    pub(super) fn check_new(&self, fid: u32, max: usize) -> Result<()> {
        if self.get(fid).is_some() {
            // diod's libnpfs answers EIO to an attach or walk onto a live fid; so do we.
            return Err(Errno::EIO);
        }
        if self.live_count >= max {
            return Err(Errno::EMFILE);
        }
        Ok(())
    }

    /// Makes `fid` live with `state`; on refusal the state comes back for the tree to clunk.
    pub(super) fn insert(
        &mut self,
        fid: u32,
        state: F,
        max: usize,
    ) -> std::result::Result<(), (Errno, F)> {
        if let Err(e) = self.check_new(fid, max) {
            return Err((e, state));
        }
        let slot = self.slots.entry(fid).or_insert_with(|| Slot {
            live: None,
            tail: None,
            queued: 0,
        });
        slot.live = Some(Arc::new(AsyncMutex::new(Live {
            state: Some(state),
            opened: false,
        })));
        self.live_count += 1;
        Ok(())
    }

    /// Removes `fid` from the table (Tclunk, Tremove).
    pub(super) fn remove(&mut self, fid: u32) -> Option<LiveRef<F>> {
        let slot = self.slots.get_mut(&fid)?;
        let live = slot.live.take()?;
        self.live_count -= 1;
        if slot.queued == 0 {
            self.slots.remove(&fid);
        }
        Some(live)
    }

    /// Empties the table (Tversion, end of connection), returning every live fid.
    pub(super) fn drain(&mut self) -> Vec<LiveRef<F>> {
        self.live_count = 0;
        self.slots.drain().filter_map(|(_, s)| s.live).collect()
    }

    #[cfg(test)]
    fn slots(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_freed_when_idle_and_dead() {
        let mut t = FidTable::<u8>::new();
        let p = t.enqueue(vec![1, 2]);
        assert!(p.wait_for.is_empty());
        t.insert(2, 0, 10).unwrap();
        let q = t.enqueue(vec![2]);
        assert_eq!(q.wait_for.len(), 1);
        t.release(&p.fids);
        assert_eq!(t.slots(), 1, "fid 1 never became live: its slot is gone");
        assert_eq!(t.check_new(2, 10), Err(Errno::EIO));
        assert!(t.remove(2).is_some());
        t.release(&q.fids);
        assert_eq!(t.slots(), 0);
        assert_eq!(t.check_new(2, 10), Ok(()));
    }

    #[test]
    fn fid_cap() {
        let mut t = FidTable::<u8>::new();
        t.insert(1, 0, 1).unwrap();
        assert_eq!(t.insert(2, 0, 1).unwrap_err().0, Errno::EMFILE);
    }
}
