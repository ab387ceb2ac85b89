//! Running calls for one connection: echo in-process, every other tool in that connection's
//! worker for the tool, built by nsd on first use and ended with the connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::args::Arguments;
use crate::catalog::{ExternalTool, Runner};
use crate::echo;
use crate::envelope::{Envelope, Status, Taint};
use crate::grant::{ConnGrant, GrantedTool};
use crate::services::{Services, SessionContext};
use crate::worker::Worker;

/// How long toolfs waits for a worker's answer. `shell` bounds its own commands (at most 600 s)
/// and gets a grace period on top; the file tools answer in far less.
pub fn call_timeout(tool: &str) -> Duration {
    if tool == "shell" {
        Duration::from_secs(615)
    } else {
        Duration::from_secs(60)
    }
}

/// What a call needs before it starts: nothing (echo), or its worker and its turn on it.
pub enum Runnable {
    Echo,
    External(Arc<dyn ExternalTool>),
    Worker(Arc<Worker>, OwnedSemaphorePermit),
}

/// A granted worker tool on this connection: its worker (spawned on first use) and whose turn
/// it is. A worker serves one call at a time; a call waiting for its turn has not started, so
/// flushing its read withdraws it.
struct WorkerSlot {
    worker: tokio::sync::Mutex<Option<Arc<Worker>>>,
    turn: Arc<Semaphore>,
}

pub struct Dispatcher {
    grant: Arc<ConnGrant>,
    workers: HashMap<String, WorkerSlot>,
    services: Arc<Services>,
    context: Arc<SessionContext>,
    /// The context of each namespace that cloned this one (parent first): a clone's calls are
    /// decided at least as tightly as its parent's, now and whenever the parent's tightens.
    inherited: Vec<Arc<SessionContext>>,
}

impl Dispatcher {
    pub fn new(grant: Arc<ConnGrant>, services: Arc<Services>) -> Dispatcher {
        let workers = grant
            .tools
            .iter()
            .filter(|t| t.def.runner.is_worker())
            .map(|t| {
                (
                    t.def.name.clone(),
                    WorkerSlot {
                        worker: tokio::sync::Mutex::new(None),
                        turn: Arc::new(Semaphore::new(1)),
                    },
                )
            })
            .collect();
        Dispatcher {
            context: services.context(&grant.session),
            inherited: grant
                .ancestors
                .iter()
                .map(|s| services.context(s))
                .collect(),
            grant,
            workers,
            services,
        }
    }

    pub fn grant(&self) -> &Arc<ConnGrant> {
        &self.grant
    }

    pub fn services(&self) -> &Arc<Services> {
        &self.services
    }

    /// The receipt scope and the gate's session: the grant's, or one minted for an operator
    /// connection.
    pub fn session(&self) -> &str {
        &self.grant.session
    }

    pub fn context(&self) -> &SessionContext {
        &self.context
    }

    /// The context states this connection's calls are decided with: its session's and every
    /// ancestor's, read at each call (so a parent tainted later taints its clones too).
    pub fn context_states(&self) -> Vec<warren_gate::ContextState> {
        let up: Vec<Vec<warren_gate::ContextState>> =
            self.inherited.iter().map(|c| c.states()).collect();
        warren_gate::policy::context::with_ancestors(
            &self.context.states(),
            up.iter().map(Vec::as_slice),
        )
    }

    /// Readies a call: waits for its turn on the tool's worker, finding (or spawning) the worker.
    /// Errors come back as the envelope the read returns. Dropping this future before it
    /// finishes withdraws the call.
    pub async fn prepare(&self, tool: &Arc<GrantedTool>) -> Result<Runnable, Envelope> {
        let name = tool.def.name.as_str();
        match &tool.def.runner {
            Runner::Echo => return Ok(Runnable::Echo),
            Runner::External(external) => return Ok(Runnable::External(external.clone())),
            Runner::Worker => {}
        }
        if tool.authority.roots.is_empty() {
            return Err(Envelope::new(
                name,
                Status::Error,
                Taint::Trusted,
                format!(
                    "this connection grants {name} no host path: a tool's authority comes with a grant record (nsd), not with the operator socket"
                ),
            ));
        }
        let slot = self
            .workers
            .get(name)
            .expect("a slot per granted worker tool");
        let turn = match slot.turn.clone().try_acquire_owned() {
            Ok(turn) => turn,
            Err(_) => {
                tracing::info!(conn = %self.grant.label, tool = name, "call waits for its turn on the worker");
                slot.turn
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed")
            }
        };
        let mut slot = slot.worker.lock().await;
        if let Some(worker) = slot.as_ref() {
            return Ok(Runnable::Worker(worker.clone(), turn));
        }
        let spawn_for = tool.clone();
        let builder = self.services.workers.clone();
        let (session, namespace) = (self.grant.session.clone(), self.grant.namespace.clone());
        // Only nsd builds workers: if it cannot, the call is refused (fail closed); toolfs
        // never starts one itself.
        let spawned = tokio::task::spawn_blocking(move || {
            let name = spawn_for.def.name.as_str();
            let launched = builder.build(&session, &namespace, name, &spawn_for.authority)?;
            Worker::start(name, &spawn_for.authority, launched)
        })
        .await;
        match spawned {
            Ok(Ok(worker)) => {
                let worker = Arc::new(worker);
                *slot = Some(worker.clone());
                tracing::info!(conn = %self.grant.label, tool = name, "worker built by nsd");
                Ok(Runnable::Worker(worker, turn))
            }
            Ok(Err(e)) => {
                tracing::warn!(conn = %self.grant.label, tool = name, "no worker: {e}");
                Err(Envelope::new(
                    name,
                    Status::Denied,
                    Taint::Trusted,
                    format!("no {name} worker, so the call is refused: {e}"),
                ))
            }
            Err(e) => Err(Envelope::new(
                name,
                Status::Denied,
                Taint::Trusted,
                format!("no {name} worker, so the call is refused: {e}"),
            )),
        }
    }

    /// Runs a readied call to its end (or its timeout).
    pub async fn run(&self, tool: &GrantedTool, runnable: Runnable, args: &Arguments) -> Envelope {
        let name = tool.def.name.as_str();
        match runnable {
            Runnable::Echo => {
                let content = echo::run(&args.value, &args.canonical, &self.services.journal).await;
                Envelope::new(name, Status::Ok, Taint::Untrusted, content)
            }
            Runnable::External(external) => external.call(&args.canonical, &args.value).await,
            Runnable::Worker(worker, _turn) => {
                match worker.call(&args.canonical, call_timeout(name)).await {
                    Ok(out) => {
                        let status = if out.ok { Status::Ok } else { Status::Error };
                        Envelope::new(name, status, Taint::Untrusted, out.content)
                    }
                    Err(e) => {
                        tracing::warn!(conn = %self.grant.label, tool = name, "worker call failed: {e}; the worker will be replaced");
                        self.forget_worker(name, &worker).await;
                        let what = if e.kind() == std::io::ErrorKind::TimedOut {
                            "timed out"
                        } else {
                            "failed"
                        };
                        Envelope::new(
                            name,
                            Status::Error,
                            Taint::Trusted,
                            format!("the {name} worker {what}: {e}"),
                        )
                    }
                }
            }
        }
    }

    async fn forget_worker(&self, name: &str, failed: &Arc<Worker>) {
        if let Some(slot) = self.workers.get(name) {
            let mut slot = slot.worker.lock().await;
            if slot.as_ref().is_some_and(|w| Arc::ptr_eq(w, failed)) {
                *slot = None;
            }
        }
    }
}
