//! The export server: accepts TCP connections, authenticates each within a deadline, and
//! relays an authenticated peer's 9P stream to the tree its peers entry grants.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::keys::HostKey;
use crate::peers::{Peer, Peers};
use crate::wire;

/// Where an authenticated peer's tree comes from.
pub trait Backend: Send + Sync {
    /// A 9P connection serving `tree` with exactly what `peer`'s entry grants.
    fn connect(&self, peer: &Peer, tree: &str) -> Result<UnixStream, String>;
}

/// How many failed attempts from one address are allowed per [`FAILURE_WINDOW`] before its
/// connections are closed unanswered for the rest of the window.
pub const MAX_FAILURES: u32 = 5;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Connections still authenticating, at most (each holds a thread until its deadline).
pub const MAX_PENDING: usize = 64;

pub struct Config {
    pub key: HostKey,
    pub peers: PathBuf,
    /// A connection that has not authenticated by then is dropped.
    pub auth_deadline: Duration,
    /// How often a live link's peer is looked up again: a link whose entry is gone, names
    /// another key or no longer grants its tree is cut.
    pub recheck: Duration,
    pub backend: Arc<dyn Backend>,
}

/// The default [`Config::recheck`].
pub const RECHECK: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Failures(Mutex<HashMap<IpAddr, (u32, Instant)>>);

impl Failures {
    fn blocked(&self, ip: IpAddr) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (_, since)| since.elapsed() < FAILURE_WINDOW);
        map.get(&ip).is_some_and(|(n, _)| *n >= MAX_FAILURES)
    }

    fn record(&self, ip: IpAddr) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(ip).or_insert((0, Instant::now()));
        entry.0 += 1;
    }
}

/// Serves `listener` for ever, a thread per connection.
pub fn serve(listener: TcpListener, config: Config) {
    let config = Arc::new(config);
    let failures = Arc::new(Failures::default());
    let pending = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let tcp = match conn {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Ok(addr) = tcp.peer_addr() else {
            continue;
        };
        if failures.blocked(addr.ip()) {
            tracing::warn!(%addr, "refused: too many failed attempts from this address");
            let _ = tcp.shutdown(Shutdown::Both);
            continue;
        }
        if pending.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING {
            pending.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(%addr, "refused: {MAX_PENDING} connections are authenticating");
            let _ = tcp.shutdown(Shutdown::Both);
            continue;
        }
        let (config, failures, slots) = (config.clone(), failures.clone(), pending.clone());
        let spawned = std::thread::Builder::new()
            .name("exportfs-conn".into())
            .spawn(move || {
                let ip = addr.ip();
                let outcome = authenticate(tcp, &config, &|| failures.record(ip));
                slots.fetch_sub(1, Ordering::SeqCst);
                match outcome {
                    Ok((link, backend, peer, tree)) => {
                        tracing::info!(%addr, peer = %peer.name, "serving");
                        let watch = watch_revocation(&config, &link, peer.clone(), tree);
                        if let Err(e) = link.relay(backend) {
                            tracing::info!(%addr, peer = %peer.name, "link ended: {e}");
                        }
                        drop(watch);
                    }
                    Err(why) => {
                        tracing::warn!(%addr, "refused: {why}");
                    }
                }
            });
        if let Err(e) = spawned {
            // The closure (and its connection) was dropped unrun: give its slot back.
            pending.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("spawn: {e}");
        }
    }
}

/// The handshake and the grant check, under the deadline: a watchdog shuts the socket down if
/// it is not done by then, whatever the peer trickles.
/// `failed` is called before the dialler is told (so its next attempt already counts it).
fn authenticate(
    tcp: TcpStream,
    config: &Config,
    failed: &dyn Fn(),
) -> Result<(wire::Link, UnixStream, Peer, String), String> {
    let (done, watch) = mpsc::channel::<()>();
    let watched = tcp.try_clone().map_err(|e| e.to_string())?;
    let deadline = config.auth_deadline;
    std::thread::Builder::new()
        .name("exportfs-deadline".into())
        .spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = watch.recv_timeout(deadline) {
                let _ = watched.shutdown(Shutdown::Both);
            }
        })
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let result = (|| {
        let refuse = |accepted: wire::Accepted, told: &str| {
            failed();
            accepted.refuse(told);
        };
        let accepted = wire::accept(tcp, &config.key).map_err(|e| {
            failed();
            if started.elapsed() >= deadline {
                format!("not authenticated within {deadline:?}")
            } else {
                format!("handshake: {e}")
            }
        })?;
        let peers = match Peers::load(&config.peers) {
            Ok(p) => p,
            Err(e) => {
                let why = format!("the peers file cannot be read: {e}");
                refuse(accepted, "this host's peers file cannot be read");
                return Err(why);
            }
        };
        let Some(peer) = peers.by_key(&accepted.key).cloned() else {
            let why = format!("unknown key {}", accepted.key.fingerprint());
            refuse(accepted, &format!("{why}: not in this host's peers file"));
            return Err(why);
        };
        if !crate::peers::valid_name(&accepted.tree) {
            let why = format!("peer {} asked for a tree with a bad name", peer.name);
            refuse(accepted, &why);
            return Err(why);
        }
        if let Err(why) = peer.grants(&accepted.tree) {
            refuse(accepted, &why);
            return Err(why);
        }
        let backend = match config.backend.connect(&peer, &accepted.tree) {
            Ok(b) => b,
            Err(e) => {
                let why = format!("tree {} for peer {}: {e}", accepted.tree, peer.name);
                refuse(accepted, &why);
                return Err(why);
            }
        };
        let tree = accepted.tree.clone();
        let link = accepted.welcome().map_err(|e| e.to_string())?;
        Ok((link, backend, peer, tree))
    })();
    let _ = done.send(());
    result
}

/// Cuts `link` when its peer's entry stops granting it or changes at all: checked every
/// [`Config::recheck`] until the returned sender is dropped (the link ended).
fn watch_revocation(
    config: &Config,
    link: &wire::Link,
    peer: Peer,
    tree: String,
) -> Option<mpsc::Sender<()>> {
    let tcp = link.tcp().try_clone().ok()?;
    let (ended, watch) = mpsc::channel::<()>();
    let (peers, every) = (config.peers.clone(), config.recheck);
    std::thread::Builder::new()
        .name("exportfs-recheck".into())
        .spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = watch.recv_timeout(every) {
                // The live link's backend holds the grant made from `peer` (a toolfs grant of
                // its tools, a directory's handle): any change to the entry, a narrowed grant
                // included, cuts it, and the peer's next link is made from the entry as it is.
                let still = Peers::load(&peers)
                    .map_err(|e| e.to_string())
                    .and_then(|p| {
                        let now = p
                            .by_key(&peer.key)
                            .ok_or_else(|| "its key is no longer in the peers file".to_owned())?;
                        now.grants(&tree)?;
                        if *now != peer {
                            return Err("its entry changed".to_owned());
                        }
                        Ok(())
                    });
                if let Err(why) = still {
                    tracing::warn!(peer = %peer.name, "link cut: {why}");
                    let _ = tcp.shutdown(Shutdown::Both);
                    return;
                }
            }
        })
        .ok()?;
    Some(ended)
}

/// A listening address: `tcp!HOST!PORT` (port 0: any free port).
pub fn listen(addr: &str) -> io::Result<TcpListener> {
    let (host, port) = crate::peers::split_addr(addr, true)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    TcpListener::bind((host.as_str(), port))
}
