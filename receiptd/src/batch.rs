//! Appends that arrive together share one transaction.
//!
//! A SQLite commit is most of an append's cost (the WAL frames of the pages it touched, written
//! whole, and the locking around them), and it costs about the same for one entry as for
//! twenty. So an append does not commit on its own: it joins the queue, and the first to join
//! an empty queue starts a commit task. That task lets every connection whose request has
//! already arrived run first (one `yield_now`, which also polls the sockets once more), then
//! takes the whole queue and appends it with [`Log::append_writes`]: one transaction, each write
//! still checked and refused on its own. An append alone in the queue waits for nobody; under
//! load, the gate's decisions and toolfs's effects commit together.
//!
//! The commit runs on a task of its own, never inside a caller's future, so a caller that goes
//! away (a flushed request, a closed connection) cannot strand the queue behind it.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::access::AppendError;
use crate::log::{Ack, Write};
use crate::tree::Shared;

type Queued = (Write, oneshot::Sender<Result<Vec<Ack>, AppendError>>);

/// The writes waiting for the next commit.
#[derive(Default)]
pub struct Batcher {
    queue: Mutex<Vec<Queued>>,
}

impl Batcher {
    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Queued>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Appends `write` in the next commit; its acks (one per request), or why it was refused.
pub async fn append(shared: &Arc<Shared>, write: Write) -> Result<Vec<Ack>, AppendError> {
    let (tx, rx) = oneshot::channel();
    let first = {
        let mut queue = shared.batcher.queue();
        queue.push((write, tx));
        queue.len() == 1
    };
    if first {
        tokio::spawn(commit(Arc::clone(shared)));
    }
    rx.await
        .unwrap_or_else(|_| Err(AppendError::Storage("the commit was abandoned".into())))
}

async fn commit(shared: Arc<Shared>) {
    tokio::task::yield_now().await;
    let queued = std::mem::take(&mut *shared.batcher.queue());
    let (writes, replies): (Vec<Write>, Vec<_>) = queued.into_iter().unzip();
    let results = shared.log().append_writes(writes);
    for (result, reply) in results.into_iter().zip(replies) {
        let _ = reply.send(result);
    }
}
