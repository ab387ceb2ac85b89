//! The export server: accepts TCP connections, authenticates each within a deadline, and
//! relays an authenticated peer's 9P stream to the tree its peers entry grants.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv6Addr, Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
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

/// How many failed attempts from one source are allowed per [`FAILURE_WINDOW`] before its
/// connections get [`PRESSED_DEADLINE`]. Failures never close a source's connections before
/// the handshake: the next one that proves a key in the peers file is served, and clears them.
pub const MAX_FAILURES: u32 = 5;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Connections still authenticating, at most (each holds a thread until its deadline).
pub const MAX_PENDING: usize = 64;
/// Of those, at most this many from one source ([`source`]): a stranger needs many sources to
/// fill the table, and the newest connection always gets a slot (see [`Slots::admit`]).
pub const MAX_PENDING_PER_SOURCE: usize = 8;
/// The pre-auth deadline, at most, of a connection admitted while half the slots or more are
/// taken, or from a source over [`MAX_FAILURES`]: long enough for a handshake across a slow
/// link (two round trips), short enough that silent connections free their slots quickly.
pub const PRESSED_DEADLINE: Duration = Duration::from_secs(3);

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

/// Who a pre-auth share and a failure count belong to: an IPv4 address, or an IPv6 /64 (one
/// host's usual allocation, where another address costs it nothing).
pub fn source(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

/// Failed attempts per source, each count kept for [`FAILURE_WINDOW`] from its first.
#[derive(Default)]
struct Failures(Mutex<HashMap<IpAddr, (u32, Instant)>>);

impl Failures {
    fn suspect(&self, source: IpAddr) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (_, since)| since.elapsed() < FAILURE_WINDOW);
        map.get(&source).is_some_and(|(n, _)| *n >= MAX_FAILURES)
    }

    fn record(&self, source: IpAddr) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(source).or_insert((0, Instant::now()));
        entry.0 += 1;
    }

    /// A key in the peers file was proven from `source`: what failed there before was not it.
    fn clear(&self, source: IpAddr) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(&source);
    }
}

/// The pre-auth slots: which connection (by admission order) from which source holds each.
#[derive(Default)]
struct Slots(Mutex<SlotTable>);

#[derive(Default)]
struct SlotTable {
    next: u64,
    /// By id, so oldest first.
    held: BTreeMap<u64, (IpAddr, TcpStream)>,
}

/// One connection's pre-auth slot, given back when dropped (unless it was taken from it).
struct Slot {
    slots: Arc<Slots>,
    id: u64,
}

impl Slots {
    /// A slot for a new connection from `source` (`tcp`: a handle to shut it down with), and
    /// whether the table is under pressure (half full or more). The newest connection always
    /// gets one: when its source already holds its share, it takes that source's oldest
    /// connection's; when the table is full, it takes the oldest connection's of the source
    /// holding the most. So a stranger holding slots from a few sources cannot keep out a
    /// peer from another, and from the same source it must outpace the peer's handshake.
    fn admit(self: &Arc<Self>, source: IpAddr, tcp: TcpStream) -> (Slot, bool) {
        let mut table = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut counts: HashMap<IpAddr, usize> = HashMap::new();
        for (src, _) in table.held.values() {
            *counts.entry(*src).or_default() += 1;
        }
        let own = counts.get(&source).copied().unwrap_or(0);
        let victim_source = if own >= MAX_PENDING_PER_SOURCE {
            Some(source)
        } else if table.held.len() >= MAX_PENDING {
            let most = counts.values().copied().max().unwrap_or(0);
            table
                .held
                .values()
                .find(|(src, _)| counts.get(src) == Some(&most))
                .map(|(src, _)| *src)
        } else {
            None
        };
        if let Some(victim_source) = victim_source {
            let oldest = table
                .held
                .iter()
                .find(|(_, (src, _))| *src == victim_source)
                .map(|(id, _)| *id);
            if let Some((src, tcp)) = oldest.and_then(|id| table.held.remove(&id)) {
                tracing::info!(source = %src, "a pre-auth connection gave its slot to a newer one");
                let _ = tcp.shutdown(Shutdown::Both);
            }
        }
        let pressed = table.held.len() >= MAX_PENDING / 2;
        let id = table.next;
        table.next += 1;
        table.held.insert(id, (source, tcp));
        (
            Slot {
                slots: self.clone(),
                id,
            },
            pressed,
        )
    }
}

impl Slot {
    /// Whether this connection still holds its slot (it was not given to a newer one).
    fn held(&self) -> bool {
        let table = self.slots.0.lock().unwrap_or_else(|p| p.into_inner());
        table.held.contains_key(&self.id)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.slots.0.lock().unwrap_or_else(|p| p.into_inner());
        table.held.remove(&self.id);
    }
}

/// Serves `listener` for ever, a thread per connection.
pub fn serve(listener: TcpListener, config: Config) {
    let config = Arc::new(config);
    let failures = Arc::new(Failures::default());
    let slots = Arc::new(Slots::default());
    for conn in listener.incoming() {
        let tcp = match conn {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let (Ok(addr), Ok(handle)) = (tcp.peer_addr(), tcp.try_clone()) else {
            continue;
        };
        let source = source(addr.ip());
        let (slot, pressed) = slots.admit(source, handle);
        let deadline = if pressed || failures.suspect(source) {
            config.auth_deadline.min(PRESSED_DEADLINE)
        } else {
            config.auth_deadline
        };
        let (config, failures) = (config.clone(), failures.clone());
        let spawned = std::thread::Builder::new()
            .name("exportfs-conn".into())
            .spawn(move || {
                let pending = Pending {
                    slot,
                    failures: &failures,
                    source,
                    deadline,
                };
                match authenticate(tcp, &config, pending) {
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
            // The closure (its connection and its slot) was dropped unrun.
            tracing::warn!("spawn: {e}");
        }
    }
}

/// A connection not yet authenticated: its slot, its deadline, and where its failures count.
struct Pending<'a> {
    slot: Slot,
    failures: &'a Failures,
    source: IpAddr,
    deadline: Duration,
}

impl Pending<'_> {
    /// A stranger's failure (a handshake that failed or ran out of time, an unknown key):
    /// counted against its source, unless the connection failed because a newer one took its
    /// slot.
    fn failed(&self) {
        if self.slot.held() {
            self.failures.record(self.source);
        }
    }
}

/// What the deadline watchdog hears.
enum Step {
    /// The dialler proved a key in the peers file: the rest (its grant, its tree from nsd)
    /// gets the full [`Config::auth_deadline`], counted from the connection's start.
    Proven,
    Done,
}

/// The handshake and the grant check, under the deadline: a watchdog shuts the socket down if
/// it is not done by then, whatever the peer trickles. The pre-auth slot is given back once the
/// dialler proved a key in the peers file.
/// Failures are recorded before the dialler is told (so its next attempt already counts them).
fn authenticate(
    tcp: TcpStream,
    config: &Config,
    pending: Pending<'_>,
) -> Result<(wire::Link, UnixStream, Peer, String), String> {
    let (step, watch) = mpsc::channel::<Step>();
    let watched = tcp.try_clone().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let (deadline, full) = (pending.deadline, config.auth_deadline);
    std::thread::Builder::new()
        .name("exportfs-deadline".into())
        .spawn(move || {
            let mut until = started + deadline;
            loop {
                match watch.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    Ok(Step::Proven) => until = started + full,
                    Ok(Step::Done) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let _ = watched.shutdown(Shutdown::Both);
                        return;
                    }
                }
            }
        })
        .map_err(|e| e.to_string())?;
    let result = (|| {
        let accepted = wire::accept(tcp, &config.key).map_err(|e| {
            pending.failed();
            if !pending.slot.held() {
                "a newer connection took its pre-auth slot".to_owned()
            } else if started.elapsed() >= deadline {
                format!("not authenticated within {deadline:?}")
            } else {
                format!("handshake: {e}")
            }
        })?;
        let peers = match Peers::load(&config.peers) {
            Ok(p) => p,
            Err(e) => {
                let why = format!("the peers file cannot be read: {e}");
                accepted.refuse("this host's peers file cannot be read");
                return Err(why);
            }
        };
        let Some(peer) = peers.by_key(&accepted.key).cloned() else {
            pending.failed();
            let why = format!("unknown key {}", accepted.key.fingerprint());
            accepted.refuse(&format!("{why}: not in this host's peers file"));
            return Err(why);
        };
        // A peer, not a stranger: its source's failures were not its, and its slot is free.
        pending.failures.clear(pending.source);
        drop(pending.slot);
        let _ = step.send(Step::Proven);
        if !crate::peers::valid_name(&accepted.tree) {
            let why = format!("peer {} asked for a tree with a bad name", peer.name);
            accepted.refuse(&why);
            return Err(why);
        }
        if let Err(why) = peer.grants(&accepted.tree) {
            accepted.refuse(&why);
            return Err(why);
        }
        let backend = match config.backend.connect(&peer, &accepted.tree) {
            Ok(b) => b,
            Err(e) => {
                let why = format!("tree {} for peer {}: {e}", accepted.tree, peer.name);
                accepted.refuse(&why);
                return Err(why);
            }
        };
        let tree = accepted.tree.clone();
        let link = accepted.welcome().map_err(|e| e.to_string())?;
        Ok((link, backend, peer, tree))
    })();
    let _ = step.send(Step::Done);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_slash_64() {
        let v4: IpAddr = "10.0.0.7".parse().unwrap();
        assert_eq!(source(v4), v4);
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(source(mapped), v4, "an IPv4 peer on a dual-stack socket");
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(source(a), source(b));
        assert_eq!(source(a), "2001:db8:1:2::".parse::<IpAddr>().unwrap());
        assert_ne!(source(a), source(other));
    }
}
