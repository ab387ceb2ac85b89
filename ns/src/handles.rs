//! Authority is a handle, not a name. Every host path that carries a namespace's authority —
//! its bind sources and its tools' roots — is opened once, when nsd takes the spec in, and what
//! is checked and built from then on is that handle: the namespace's binds, toolfs's grant and
//! the tool workers. nsd keeps the handles for as long as it lists the namespace (a clone's from
//! the read that accepted it until it is run and gone). A child cloned from inside is resolved
//! beneath its parent's handles (`crate::narrow`), never from the parent's names again.
//!
//! Why: a version that re-opened a cloned child's checked tool root by name when the child was
//! run let the parent swap that directory for a symlink to `/etc` in between, and the child's
//! `fs_read` read the host's `/etc/passwd`.
//!
//! The build spec names each handle `/proc/self/fd/N`: a magic link to the open file, which
//! the kernel does not walk again by name, valid in nsd while the handle lives.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use crate::confine::guard::Guard;
use crate::spec::{Access, Spec};
use warren_jail::{Dir, openat2};

/// One directory a tool's worker may touch, held open.
#[derive(Debug)]
pub struct ToolRoot {
    /// The tool whose authority it is.
    pub tool: String,
    /// Where the tool's worker sees it: the path as the spec named it (for a clone, in its
    /// parent's naming). Shown in grants, asks and receipts; never opened.
    pub path: String,
    pub access: Access,
    pub dir: OwnedFd,
}

impl ToolRoot {
    /// The same root on a new descriptor of the same open directory (nothing resolved again).
    pub fn try_clone(&self) -> io::Result<ToolRoot> {
        Ok(ToolRoot {
            tool: self.tool.clone(),
            path: self.path.clone(),
            access: self.access,
            dir: self.dir.try_clone()?,
        })
    }
}

/// The handles a namespace is built from, in the order of its build spec.
#[derive(Debug, Default)]
pub struct Handles {
    binds: Vec<OwnedFd>,
    tool_roots: Vec<ToolRoot>,
    /// Each handle's name in the build spec, with the words the spec used for it.
    words: Vec<(String, String)>,
}

/// A spec made buildable: `build` names every bind source and tool root by a handle in
/// `handles`.
#[derive(Debug)]
pub struct Built {
    pub build: Spec,
    pub handles: Handles,
}

/// The name a build spec gives an open handle.
pub fn handle_name(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

impl Handles {
    /// Holds a bind source; returns its name in the build spec.
    pub fn hold_bind(&mut self, fd: OwnedFd, words: &str) -> String {
        let name = handle_name(&fd);
        self.words.push((name.clone(), words.to_string()));
        self.binds.push(fd);
        name
    }

    /// Holds a tool root; returns its name in the build spec.
    pub fn hold_tool_root(&mut self, root: ToolRoot, words: &str) -> String {
        let name = handle_name(&root.dir);
        self.words.push((name.clone(), words.to_string()));
        self.tool_roots.push(root);
        name
    }

    /// The build spec's `binds[i]` source.
    pub fn bind(&self, i: usize) -> Option<&OwnedFd> {
        self.binds.get(i)
    }

    /// How many descriptors these are.
    pub fn count(&self) -> usize {
        self.binds.len() + self.tool_roots.len()
    }

    pub fn tool_roots(&self) -> &[ToolRoot] {
        &self.tool_roots
    }

    /// Copies of every root, for a server that outlives this borrow (new descriptors of the same open directories).
    pub fn all_roots(&self) -> io::Result<Vec<ToolRoot>> {
        self.tool_roots.iter().map(ToolRoot::try_clone).collect()
    }

    /// The words the spec used for the handle the build spec calls `name`.
    pub fn words_for(&self, name: &str) -> Option<String> {
        self.words
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, w)| w.clone())
    }

    /// `message` with each handle's build name put back into the words the spec used (a
    /// setup error names what the operator wrote, not a descriptor of nsd's).
    pub fn in_words(&self, message: &str) -> String {
        let mut out = message.to_string();
        for (name, words) in &self.words {
            out = out.replace(&format!("`{name}`"), &format!("`{words}`"));
        }
        out
    }
}

/// The most paths (bind sources and tool roots) one namespace may hold handles for: each is a
/// descriptor in nsd for as long as the namespace is listed.
pub const MAX_HANDLES: usize = 256;

/// Refuses a spec naming more than [`MAX_HANDLES`] bind sources and tool roots.
pub fn check_count(spec: &Spec) -> Result<(), String> {
    let n = spec.binds.len() + spec.tools.iter().map(|t| t.host_paths.len()).sum::<usize>();
    if n > MAX_HANDLES {
        return Err(format!(
            "the spec names {n} bind sources and tool roots; a namespace may hold at most {MAX_HANDLES}"
        ));
    }
    Ok(())
}

/// Why a spec's path could not be taken in.
#[derive(Debug)]
pub enum OpenError {
    /// A path the spec names did not open (`what`: `bind`, `tool NAME authority`).
    Unreachable {
        what: String,
        path: String,
        source: io::Error,
    },
    /// It opened, and warren's guard refused it (the message names it).
    Refused(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Unreachable { what, path, source } => {
                write!(f, "{what} `{path}`: {source}")
            }
            OpenError::Refused(m) => f.write_str(m),
        }
    }
}

impl From<OpenError> for io::Error {
    fn from(e: OpenError) -> io::Error {
        let kind = match &e {
            OpenError::Unreachable { source, .. } => source.kind(),
            OpenError::Refused(_) => io::ErrorKind::PermissionDenied,
        };
        io::Error::new(kind, e.to_string())
    }
}

/// Opens what `spec` names — each bind source and tool root, by the operator's own words, once —
/// and checks each handle against warren's protected directories.
pub fn open_spec(spec: &Spec, guard: &Guard) -> Result<Built, OpenError> {
    check_count(spec).map_err(OpenError::Refused)?;
    let mut build = spec.clone();
    let mut handles = Handles::default();
    for b in &mut build.binds {
        let fd = open_named(&b.host, 0).map_err(|source| OpenError::Unreachable {
            what: "bind".into(),
            path: b.host.clone(),
            source,
        })?;
        guard
            .check(fd.as_fd(), &b.host)
            .map_err(OpenError::Refused)?;
        let words = std::mem::take(&mut b.host);
        b.host = handles.hold_bind(fd, &words);
    }
    for t in &mut build.tools {
        let what = format!("tool {} authority", t.name);
        for h in &mut t.host_paths {
            let dir = open_dir(h).map_err(|source| OpenError::Unreachable {
                what: what.clone(),
                path: h.clone(),
                source,
            })?;
            guard
                .check_as(&what, dir.as_fd(), h)
                .map_err(OpenError::Refused)?;
            let root = ToolRoot {
                tool: t.name.clone(),
                path: h.clone(),
                access: t.access,
                dir,
            };
            let words = h.clone();
            *h = handles.hold_tool_root(root, &words);
        }
    }
    Ok(Built { build, handles })
}

/// A tool root, by the operator's name: a directory, held as an O_PATH handle.
pub fn open_dir(path: &str) -> io::Result<OwnedFd> {
    open_named(path, libc::O_DIRECTORY)
}

/// An O_PATH handle of an operator's path. Symlinks are followed (they are the operator's
/// words), but no magic link: `/proc/PID/root/…` or `/proc/self/fd/N` would reach through
/// another process's view or one of nsd's own descriptors, past the operator's credentials.
fn open_named(path: &str, flags: i32) -> io::Result<OwnedFd> {
    openat2(
        Dir::Cwd,
        path,
        libc::O_PATH | libc::O_CLOEXEC | flags,
        0,
        libc::RESOLVE_NO_MAGICLINKS,
    )
}
