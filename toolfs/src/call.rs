//! One open of a `call` file: one call. Writes append the arguments whatever their offset; the
//! first read runs the call; every read returns a slice of the one immutable result, at
//! `offset − o₀` where o₀ is the offset of the first read.

use std::sync::Arc;

use tokio::task::JoinHandle;
use warren_9p::{Errno, Result};

use crate::args;
use crate::dispatch::Dispatcher;
use crate::envelope::{Envelope, Status, Taint, content_digest};
use crate::grant::GrantedTool;
use crate::tree::CallSlot;

enum Phase {
    /// Collecting arguments; nothing has run.
    Writing,
    /// The first read is readying the call (finding the worker; later: asking the gate). If
    /// that read is flushed the call is withdrawn and this phase is what the next read finds.
    Preparing,
    /// Started: it runs to its end in its own task, whatever happens to the reads or the fid.
    Running(JoinHandle<Arc<Vec<u8>>>),
    Done(Arc<Vec<u8>>),
    /// Withdrawn before it started (its first read was flushed).
    Withdrawn,
}

pub struct CallOpen {
    tool: Arc<GrantedTool>,
    args: Vec<u8>,
    /// o₀: the offset of the first read.
    first_read_at: Option<u64>,
    phase: Phase,
    slot: Arc<CallSlot>,
}

/// Logs a withdrawal if the first read's future is dropped (Tflush) before the call started.
struct WithdrawOnDrop<'a> {
    conn: &'a str,
    tool: &'a str,
    args: &'a [u8],
    armed: bool,
}

impl Drop for WithdrawOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            tracing::info!(conn = self.conn, tool = self.tool, args = %content_digest(self.args), "call withdrawn: its read was flushed before it started");
        }
    }
}

impl CallOpen {
    pub(crate) fn new(tool: Arc<GrantedTool>, slot: CallSlot) -> CallOpen {
        CallOpen {
            tool,
            args: Vec::new(),
            first_read_at: None,
            phase: Phase::Writing,
            slot: Arc::new(slot),
        }
    }

    pub fn append(&mut self, data: &[u8], max_arg_bytes: usize) -> Result<u32> {
        if !matches!(self.phase, Phase::Writing) {
            // The result is immutable once the call has been read: a new call needs a new open.
            return Err(Errno::EBUSY);
        }
        if self.args.len() + data.len() > max_arg_bytes {
            return Err(Errno::EFBIG);
        }
        self.args.extend_from_slice(data);
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
    }

    pub async fn read(
        &mut self,
        dispatcher: &Arc<Dispatcher>,
        offset: u64,
        count: u32,
    ) -> Result<Vec<u8>> {
        loop {
            match &mut self.phase {
                Phase::Writing => {
                    self.first_read_at = Some(offset);
                    self.phase = Phase::Preparing;
                    self.phase = self.start(dispatcher).await;
                }
                Phase::Preparing => {
                    // The read that was readying this call was flushed: the call is withdrawn.
                    self.phase = Phase::Withdrawn;
                }
                Phase::Withdrawn => return Err(Errno::ECANCELED),
                Phase::Running(handle) => {
                    let result = match handle.await {
                        Ok(bytes) => bytes,
                        Err(e) => {
                            tracing::error!(tool = %self.tool.def.name, "call task failed: {e}");
                            let env = Envelope::new(
                                &self.tool.def.name,
                                Status::Error,
                                Taint::Trusted,
                                "the call failed inside toolfs".into(),
                            );
                            Arc::new(env.to_canonical())
                        }
                    };
                    self.phase = Phase::Done(result);
                }
                Phase::Done(result) => {
                    let o0 = self.first_read_at.expect("set by the first read");
                    let Some(rel) = offset.checked_sub(o0) else {
                        return Err(Errno::EINVAL);
                    };
                    let start = usize::try_from(rel).unwrap_or(usize::MAX).min(result.len());
                    let end = start.saturating_add(count as usize).min(result.len());
                    return Ok(result[start..end].to_vec());
                }
            }
        }
    }

    /// Parses and readies the call and, if that succeeds, starts it in a task of its own.
    async fn start(&self, dispatcher: &Arc<Dispatcher>) -> Phase {
        let name = self.tool.def.name.as_str();
        let prepared = match args::prepare(&self.args, &self.tool.def.validator) {
            Ok(a) => a,
            Err(e) => {
                let env = Envelope::new(
                    name,
                    Status::Error,
                    Taint::Untrusted,
                    format!("invalid arguments: {e}"),
                );
                return Phase::Done(Arc::new(env.to_canonical()));
            }
        };
        let mut guard = WithdrawOnDrop {
            conn: &dispatcher.grant().label,
            tool: name,
            args: &self.args,
            armed: true,
        };
        let runnable = match dispatcher.prepare(&self.tool).await {
            Ok(r) => r,
            Err(env) => {
                guard.armed = false;
                return Phase::Done(Arc::new(env.to_canonical()));
            }
        };
        guard.armed = false;
        let (dispatcher, tool, slot) = (dispatcher.clone(), self.tool.clone(), self.slot.clone());
        Phase::Running(tokio::spawn(async move {
            let env = dispatcher.run(&tool, runnable, &prepared).await;
            drop(slot);
            Arc::new(env.to_canonical())
        }))
    }

    /// The fid was clunked (or its connection ended).
    pub fn closed(self, conn: &str) {
        match self.phase {
            // Opened and closed without a byte either way (a probe, an editor's stat): no call.
            Phase::Writing if self.args.is_empty() => {}
            Phase::Writing => tracing::info!(
                conn,
                tool = %self.tool.def.name,
                args = %content_digest(&self.args),
                "call withdrawn: closed before its first read"
            ),
            Phase::Running(_) => {
                tracing::debug!(conn, tool = %self.tool.def.name, "closed while running; the call runs to its end")
            }
            Phase::Preparing | Phase::Withdrawn | Phase::Done(_) => {}
        }
    }
}
