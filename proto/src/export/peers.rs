//! The peers file, `$WARREN_CONFIG_DIR/peers`: authorized_keys and known_hosts in one. One line
//! per peer:
//!
//! ```text
//! # NAME  KEY              GRANTS…
//! b       ed25519:BASE64   tool:echo,fs_read  root:fs_read:/srv/data  asks:local  addr:tcp!10.0.0.2!5640
//! ```
//!
//! - `tool:NAMES` — the peer may mount this host's `tool` tree, holding exactly these tools,
//!   and the tree `receipts`: its own session's receipts, read-only (receiptd's `<session>/…`
//!   and `keys`, nothing else), so that its host can check this host's signed checkpoint.
//! - `root:TOOL:/PATH` — a read-only root for a granted tool (as a spec's `tool NAME -r PATH`).
//! - `dir:NAME:/PATH` — the host directory PATH served read-only as the peer's tree NAME (what
//!   others may read of it: `warren_exportfs::dir`).
//! - `asks:local` (the default) or `asks:remote` — whether the peer's host may answer the asks
//!   its calls raise here. `remote` grants the tree `asks`: the gate's open asks of the peer's
//!   own session, answered on a capped channel named `peer:<fingerprint>` (`allow once` up to
//!   the write tier, or `deny`; docs/distribution.md).
//! - `addr:tcp!HOST!PORT` — where the peer serves its own trees (`warren run --import`).
//!
//! A line with no grant names a host this one only dials. The file is read at every connection,
//! so removing a line revokes that peer at its next connection.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::keys::PublicKey;

/// `$WARREN_CONFIG_DIR/peers` (default `/etc/warren/peers`).
pub fn peers_path() -> PathBuf {
    std::env::var_os("WARREN_CONFIG_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/etc/warren"), PathBuf::from)
        .join("peers")
}

/// The tree a peer with `asks:remote` mounts to answer its own asks.
pub const ASKS_TREE: &str = "asks";

/// The tree a peer with a `tool` grant mounts to read its own session's receipts here.
pub const RECEIPTS_TREE: &str = "receipts";

/// Whether a peer's host may answer the asks its calls raise here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Asks {
    #[default]
    Local,
    Remote,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub key: PublicKey,
    /// The tools of this host's `tool` tree the peer may mount (empty: no `tool` tree).
    pub tools: Vec<String>,
    /// Read-only roots: (tool, host path).
    pub roots: Vec<(String, String)>,
    /// Host directories served read-only: (tree name, host path).
    pub dirs: Vec<(String, String)>,
    pub asks: Asks,
    /// Where the peer serves its trees: `tcp!HOST!PORT`.
    pub addr: Option<String>,
}

impl Peer {
    /// The host directory served as tree `tree`, if the entry grants one.
    pub fn dir(&self, tree: &str) -> Option<&str> {
        self.dirs
            .iter()
            .find(|(name, _)| name == tree)
            .map(|(_, path)| path.as_str())
    }

    /// The gate channel this peer's answers come on, as its receipts name it.
    pub fn asks_channel(&self) -> String {
        format!("peer:{}", self.key.fingerprint())
    }

    /// Whether this entry lets the peer mount `tree`; the error says what it may mount.
    pub fn grants(&self, tree: &str) -> Result<(), String> {
        if ((tree == "tool" || tree == RECEIPTS_TREE) && !self.tools.is_empty())
            || (tree == ASKS_TREE && self.asks == Asks::Remote)
            || self.dir(tree).is_some()
        {
            return Ok(());
        }
        let trees: Vec<String> = (!self.tools.is_empty())
            .then(|| ["`tool`".to_owned(), format!("`{RECEIPTS_TREE}`")])
            .into_iter()
            .flatten()
            .chain((self.asks == Asks::Remote).then(|| format!("`{ASKS_TREE}`")))
            .chain(self.dirs.iter().map(|(name, _)| format!("`{name}`")))
            .collect();
        let granted = if trees.is_empty() {
            "nothing".to_owned()
        } else {
            trees.join(", ")
        };
        Err(format!(
            "peer {} ({}) is not granted tree `{tree}` (its entry grants {granted})",
            self.name,
            self.key.fingerprint()
        ))
    }
}

#[derive(Clone, Debug, Default)]
pub struct Peers(pub Vec<Peer>);

/// A peer or tree name: lowercase letters, digits, `.`, `_`, `-`, starting with a letter or
/// digit, at most 64 bytes.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric()
}

fn valid_tool(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
}

impl Peers {
    /// Reads the peers file: it and its directory must belong to root (or to whoever runs this)
    /// and be writable by their owner only, since it says who may call this host's tools. The
    /// directory is checked as warren checks its own (`warren_daemon::dirs::open_checked_dir`:
    /// no symlink, no ancestor another user could rename), the file is opened from that
    /// directory's fd without following a symlink, and its text is read from the handle whose
    /// owner and mode were checked, never from the path a second time.
    pub fn load(path: &Path) -> io::Result<Peers> {
        let named =
            |e: io::Error| io::Error::new(e.kind(), format!("read {}: {e}", path.display()));
        let me = nix::unistd::geteuid().as_raw();
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(named(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a file's path",
            )));
        };
        let dir = warren_daemon::dirs::open_checked_dir(dir, me).map_err(named)?;
        let flags = nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC
            | nix::fcntl::OFlag::O_NONBLOCK;
        let mut file = nix::fcntl::openat(&dir, name, flags, nix::sys::stat::Mode::empty())
            .map(std::fs::File::from)
            .map_err(|e| match e {
                nix::errno::Errno::ELOOP => io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is a symlink: the peers file is never read through one",
                        path.display()
                    ),
                ),
                e => named(e.into()),
            })?;
        let meta = file.metadata().map_err(named)?;
        if !meta.is_file() || (meta.uid() != 0 && meta.uid() != me) || meta.mode() & 0o022 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: the peers file must belong to root and be writable by its owner only \
                     (uid {}, mode {:o})",
                    path.display(),
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
            ));
        }
        let mut text = String::new();
        io::Read::read_to_string(&mut file, &mut text).map_err(named)?;
        Peers::parse(&text).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
    }

    pub fn parse(text: &str) -> Result<Peers, String> {
        let mut peers: Vec<Peer> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let at = |m: String| format!("line {}: {m}", n + 1);
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let name = words.next().unwrap_or_default();
            if !valid_name(name) {
                return Err(at(format!("`{name}` is not a peer name")));
            }
            let key = words
                .next()
                .ok_or_else(|| at(format!("peer {name} has no key")))?;
            let key = PublicKey::parse(key).map_err(at)?;
            if let Some(other) = peers.iter().find(|p| p.name == name || p.key == key) {
                return Err(at(format!(
                    "peer {name} repeats the name or key of peer {}",
                    other.name
                )));
            }
            let mut peer = Peer {
                name: name.to_owned(),
                key,
                tools: Vec::new(),
                roots: Vec::new(),
                dirs: Vec::new(),
                asks: Asks::Local,
                addr: None,
            };
            for word in words {
                let (kind, value) = word
                    .split_once(':')
                    .ok_or_else(|| at(format!("`{word}` is not a grant (KIND:VALUE)")))?;
                match kind {
                    "tool" => {
                        for tool in value.split(',') {
                            if !valid_tool(tool) {
                                return Err(at(format!("`{tool}` is not a tool name")));
                            }
                            if peer.tools.iter().any(|t| t == tool) {
                                return Err(at(format!("tool {tool} granted twice")));
                            }
                            peer.tools.push(tool.to_owned());
                        }
                    }
                    "root" => {
                        let (tool, path) = value
                            .split_once(':')
                            .ok_or_else(|| at(format!("`{word}`: root:TOOL:/PATH")))?;
                        if !valid_tool(tool) || !clean_path(path) {
                            return Err(at(format!("`{word}`: root:TOOL:/PATH")));
                        }
                        peer.roots.push((tool.to_owned(), path.to_owned()));
                    }
                    "dir" => {
                        let (tree, path) = value
                            .split_once(':')
                            .ok_or_else(|| at(format!("`{word}`: dir:NAME:/PATH")))?;
                        if !valid_name(tree)
                            || tree == "tool"
                            || tree == ASKS_TREE
                            || tree == RECEIPTS_TREE
                            || !clean_path(path)
                        {
                            return Err(at(format!(
                                "`{word}`: dir:NAME:/PATH (NAME a tree name other than `tool`, \
                                 `{ASKS_TREE}` and `{RECEIPTS_TREE}`, PATH absolute without `.` \
                                 or `..`)"
                            )));
                        }
                        if peer.dirs.iter().any(|(t, _)| t == tree) {
                            return Err(at(format!("tree {tree} granted twice")));
                        }
                        peer.dirs.push((tree.to_owned(), path.to_owned()));
                    }
                    "asks" => {
                        peer.asks = match value {
                            "local" => Asks::Local,
                            "remote" => Asks::Remote,
                            _ => return Err(at(format!("`{word}`: asks:local or asks:remote"))),
                        }
                    }
                    "addr" => {
                        parse_addr(value).map_err(at)?;
                        peer.addr = Some(value.to_owned());
                    }
                    _ => return Err(at(format!("unknown grant `{kind}` in `{word}`"))),
                }
            }
            let tools: BTreeSet<&str> = peer.tools.iter().map(String::as_str).collect();
            if let Some((tool, _)) = peer.roots.iter().find(|(t, _)| !tools.contains(t.as_str())) {
                return Err(at(format!("a root for tool {tool}, which is not granted")));
            }
            peers.push(peer);
        }
        Ok(Peers(peers))
    }

    pub fn by_name(&self, name: &str) -> Option<&Peer> {
        self.0.iter().find(|p| p.name == name)
    }

    pub fn by_key(&self, key: &PublicKey) -> Option<&Peer> {
        self.0.iter().find(|p| &p.key == key)
    }

    /// The peer whose X25519 handshake key is `x25519`.
    pub fn by_x25519(&self, x25519: &[u8]) -> Option<&Peer> {
        self.0.iter().find(|p| p.key.x25519() == x25519)
    }
}

/// An absolute path without `.` or `..` components.
fn clean_path(path: &str) -> bool {
    path.starts_with('/') && !path.split('/').any(|c| c == "." || c == "..")
}

/// `tcp!HOST!PORT` → (host, port).
pub fn parse_addr(text: &str) -> Result<(String, u16), String> {
    split_addr(text, false)
}

/// As [`parse_addr`]; with `any_port`, port 0 (a listener's "any free port") too.
pub fn split_addr(text: &str, any_port: bool) -> Result<(String, u16), String> {
    let bad = || format!("`{text}` is not tcp!HOST!PORT");
    let rest = text.strip_prefix("tcp!").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once('!').ok_or_else(bad)?;
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:_".contains(&b))
    {
        return Err(bad());
    }
    let port: u16 = port.parse().map_err(|_| bad())?;
    if port == 0 && !any_port {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_a() -> String {
        PublicKey(ed25519_dalek::SigningKey::from_bytes(&[7; 32]).verifying_key()).to_string()
    }

    #[test]
    fn an_entry_parses_with_its_grants() {
        let key_a = key_a();
        let p = Peers::parse(&format!(
            "# comment\na {key_a} tool:echo,fs_read root:fs_read:/srv asks:remote addr:tcp!h!5640\n"
        ))
        .unwrap();
        let a = p.by_name("a").unwrap();
        assert_eq!(a.tools, ["echo", "fs_read"]);
        assert_eq!(a.roots, [("fs_read".to_owned(), "/srv".to_owned())]);
        assert_eq!(a.asks, Asks::Remote);
        assert!(a.grants("tool").is_ok() && a.grants(ASKS_TREE).is_ok());
        assert!(
            a.grants(RECEIPTS_TREE).is_ok(),
            "a tool grant brings its receipts"
        );
        let refused = a.grants("dir").unwrap_err();
        assert!(refused.contains("not granted tree `dir`"), "{refused}");
        let p = Peers::parse(&format!("a {key_a} dir:docs:/srv/docs")).unwrap();
        let a = p.by_name("a").unwrap();
        assert_eq!(a.dir("docs"), Some("/srv/docs"));
        assert!(a.grants("docs").is_ok() && a.grants("tool").is_err());
        assert!(
            a.grants(RECEIPTS_TREE).is_err(),
            "no tool grant, no receipts"
        );
        let refused = a.grants(ASKS_TREE).unwrap_err();
        assert!(refused.contains("not granted tree `asks`"), "{refused}");
    }

    #[test]
    fn bad_entries_are_refused_with_their_line() {
        let key_a = key_a();
        for bad in [
            format!("A {key_a}"),
            "a".to_owned(),
            format!("a {key_a} tool:e/cho"),
            format!("a {key_a} root:fs_read:/srv"),
            format!("a {key_a} tool:x bogus:1"),
            format!("a {key_a}\nb {key_a}"),
            format!("a {key_a} addr:tcp!h!0"),
            format!("a {key_a} root:fs_read:/srv/../etc tool:fs_read"),
            format!("a {key_a} dir:tool:/srv"),
            format!("a {key_a} dir:asks:/srv"),
            format!("a {key_a} dir:receipts:/srv"),
            format!("a {key_a} dir:docs:srv"),
            format!("a {key_a} dir:docs:/a dir:docs:/b"),
        ] {
            let e = Peers::parse(&bad).unwrap_err();
            assert!(e.starts_with("line "), "{bad}: {e}");
        }
    }
}
