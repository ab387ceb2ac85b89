//! Narrowing over handles: a namespace never holds more than its parent, whatever an adversary
//! does to the host's tree between a clone's check and its use.
//!
//! What is modelled (ns/src/narrow.rs, ns/src/covers.rs, nsd's `/ns/clone`, specs/namespace.md
//! "Narrowing"): a small host tree (directories, files, symlinks an adversary plants, renames);
//! namespaces whose binds are handles (an inode and an access), each bind shown at a target in
//! the namespace's view, a nested bind shadowing what lies beneath its mount point (a mount
//! follows its mount point's dentry through a rename made outside the namespace); clones at any
//! depth, each asking one directive in its parent's words, checked by nsd and then built; tools,
//! mounted servers, `net proxy` pins and a receipt budget per subtree; ending a namespace.
//!
//! The adversary holds write access to the project directory from outside the namespace (a
//! tool worker or a sibling with `-w` on it): between any two steps it may rename an entry or
//! plant a symlink there, a bounded number of times.
//!
//! nsd's check, as modelled: a bind path is split at the parent bind whose target is its
//! longest prefix, resolved beneath that bind's handle without following symlinks, refused when
//! it asks more than that bind's access, and refused when a nested bind of the parent lies
//! within what it would show with less access. Which nested binds lie within it is decided by
//! their handles, found along the resolved handle's subtree — not only by the nested binds'
//! target names, which a rename outside the namespace leaves stale (`Bug::NestedByTargetName`
//! is that mistake, and was the code's until this model found it: the real-nsd test
//! `warren-nsd::narrow::a_nested_read_bind_renamed_outside_stays_read_only_for_a_child`
//! replays its counterexample). The child is built from the handle the check resolved, never
//! by its name again.
//!
//! Left out: a nested bind whose source is not the directory at its own mount point (here each
//! is bound at its source's place, so its handle is its mount point; nsd does not yet hold the
//! mount point's own handle, docs/gaps.md), file contents, hard links (the kernel's protected_hardlinks and the EXDEV of a link
//! across mounts keep a namespace from linking what it cannot write), submounts and `-R`, the
//! parent's own view of symlinks (each is resolved inside the namespace, where it can name only
//! what the namespace holds), limits other than one receipt budget, time.

use std::collections::BTreeMap;

use stateright::{Model, Property};

/// A planted defect, to show the properties catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// nsd checks the handle, then builds the child by opening the same path again by name
    /// (following symlinks): the escape a swap wins.
    ReopenByName,
    /// A child's `-w` bind over a place where the parent's view has a nested `-r` bind is not
    /// refused at all.
    WriteBeneathNestedRead,
    /// Nested binds found by their target names in the parent's view instead of by their mount
    /// points' inodes: a rename outside the namespace moves the mount point from under the name.
    NestedByTargetName,
    /// A child's `mount` resolved by the server's name in nsd's registry, not among the
    /// connections its parent holds.
    MountByName,
    /// The child gets its own receipt budget instead of a share carved from its subtree's.
    LimitsNotCarved,
    /// A child's `net proxy` pin is checked only against the parent's list of names, not by
    /// the address rules the root's pins pass.
    PinNotRechecked,
    /// The child's tools are its parent's plus those it asked for (grant inflation).
    GrantInflation,
    /// Ending a namespace ends it alone, not its subtree.
    EndRootOnly,
}

pub type Node = u8;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Read,
    Write,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    /// A symlink to this absolute host path.
    Symlink(&'static str),
}

/// The host's file tree: each node's kind and the directory entries `(dir, name, node)`.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Host {
    pub kinds: Vec<Kind>,
    pub entries: Vec<(Node, &'static str, Node)>,
}

pub const ROOT: Node = 0;
pub const PROJ: Node = 1;
pub const PROJ_A: Node = 2;
pub const RO: Node = 4;
pub const SECRET: Node = 6;
pub const WARREN: Node = 8;

impl Host {
    /// `/proj/a/f`, `/ro/x`, `/secret/key` and warren's own directory `/warren`.
    fn new() -> Host {
        use Kind::*;
        Host {
            kinds: vec![Dir, Dir, Dir, File, Dir, File, Dir, File, Dir],
            entries: vec![
                (ROOT, "proj", PROJ),
                (PROJ, "a", PROJ_A),
                (PROJ_A, "f", 3),
                (ROOT, "ro", RO),
                (RO, "x", 5),
                (ROOT, "secret", SECRET),
                (SECRET, "key", 7),
                (ROOT, "warren", WARREN),
            ],
        }
    }

    fn lookup(&self, dir: Node, name: &str) -> Option<Node> {
        self.entries
            .iter()
            .find(|(d, n, _)| *d == dir && *n == name)
            .map(|e| e.2)
    }

    fn unlink(&mut self, dir: Node, name: &str) -> Option<Node> {
        let i = self
            .entries
            .iter()
            .position(|(d, n, _)| *d == dir && *n == name)?;
        Some(self.entries.remove(i).2)
    }

    /// `rest` beneath `start`, never through a symlink (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`).
    fn beneath(&self, start: Node, rest: &str) -> Option<Node> {
        let mut at = start;
        for c in rest.split('/').filter(|c| !c.is_empty()) {
            if self.kinds[at as usize] != Kind::Dir {
                return None;
            }
            at = self.lookup(at, c)?;
            if matches!(self.kinds[at as usize], Kind::Symlink(_)) {
                return None;
            }
        }
        Some(at)
    }

    /// An absolute host path by name, following symlinks (what an open by name does).
    fn by_name(&self, path: &str, depth: u8) -> Option<Node> {
        let mut at = ROOT;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            at = self.lookup(at, c)?;
            if let Kind::Symlink(target) = self.kinds[at as usize] {
                at = if depth < 4 {
                    self.by_name(target, depth + 1)?
                } else {
                    return None;
                };
            }
        }
        Some(at)
    }

    /// `node` and every node beneath it through directory entries (symlinks are not followed:
    /// inside a namespace one names only what the namespace holds).
    fn subtree(&self, node: Node) -> Vec<Node> {
        let mut out = vec![node];
        let mut i = 0;
        while i < out.len() {
            let d = out[i];
            for (p, _, c) in &self.entries {
                if *p == d && !out.contains(c) {
                    out.push(*c);
                }
            }
            i += 1;
        }
        out
    }
}

/// A bind in a namespace's view: `target` shows the inode `node` with `access`. `mount_point`
/// is the inode whose dentry the mount sits on (the place it shadows); `host` is the path the
/// spec named, kept only for the planted re-open by name.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Bind {
    pub target: &'static str,
    pub node: Node,
    pub access: Access,
    pub mount_point: Option<Node>,
    pub host: String,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Addr {
    Public,
    /// An address of this host.
    ThisHost,
    /// An IANA special-purpose address.
    Special,
}

impl Addr {
    /// The rule every pin passes, the root's as a clone's.
    fn allowed(self) -> bool {
        self == Addr::Public
    }
}

pub const FS_READ: u8 = 1;
pub const SHELL: u8 = 2;
pub const SERVER_ONE: u8 = 1;
pub const SERVER_TWO: u8 = 2;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Namespace {
    pub parent: Option<usize>,
    pub live: bool,
    pub binds: Vec<Bind>,
    /// Tools granted (a bit set of `FS_READ`, `SHELL`).
    pub tools: u8,
    /// Servers mounted (the connections nsd made for it).
    pub servers: u8,
    /// `net proxy` pins of the one listed name.
    pub pins: Vec<Addr>,
    /// The receipt budget this namespace may spend (its `limit`).
    pub limit: u8,
    /// Which budget it draws on.
    pub pool: usize,
    pub spent: u8,
}

/// One directive a clone asks, in its parent's words.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Ask {
    Bind(&'static str, Access),
    Tools(u8),
    Mount(u8),
    Limit(u8),
    Pin(Addr),
}

/// What the clones may ask: some within the parent, some wider.
pub const ASKS: &[Ask] = &[
    Ask::Bind("/p/a", Access::Read),
    Ask::Bind("/p/a", Access::Write),
    Ask::Bind("/p", Access::Write),
    Ask::Bind("/p/b", Access::Write),
    Ask::Bind("/r", Access::Write),
    Ask::Tools(FS_READ),
    Ask::Tools(FS_READ | SHELL),
    Ask::Mount(SERVER_ONE),
    Ask::Mount(SERVER_TWO),
    Ask::Limit(2),
    Ask::Limit(5),
    Ask::Pin(Addr::Public),
    Ask::Pin(Addr::ThisHost),
    Ask::Pin(Addr::Special),
];

/// The adversary's moves in `/proj`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Move {
    Rename(&'static str, &'static str),
    Symlink(&'static str, &'static str),
}

pub const MOVES: &[Move] = &[
    Move::Rename("a", "b"),
    Move::Rename("b", "a"),
    Move::Symlink("a", "/secret"),
    Move::Symlink("b", "/warren"),
];

/// A clone between nsd's check and its build: the handle the check resolved (for a bind).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Pending {
    pub parent: usize,
    pub ask: Ask,
    pub checked: Option<Node>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    pub host: Host,
    pub namespaces: Vec<Namespace>,
    /// Receipt budgets: (cap, spent).
    pub pools: Vec<(u8, u8)>,
    pub pending: Option<Pending>,
    pub moves: u8,
    pub spends: u8,
    /// Ghost: receipts spent by each root's whole subtree.
    pub subtree_spent: BTreeMap<usize, u8>,
    /// Ghost: a clone was refused / built.
    pub refused: bool,
    pub built_after_move: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A namespace writes a child spec to its `/ns/clone`.
    Clone(usize, Ask),
    /// nsd checks the pending clone.
    Check,
    /// nsd builds the checked clone.
    Build,
    Adversary(Move),
    Spend(usize),
    End(usize),
}

/// Clones of `clones` at most, `moves` adversary moves and `spends` receipts at most.
#[derive(Clone, Debug)]
pub struct Narrowing {
    pub clones: usize,
    pub moves: u8,
    pub spends: u8,
    pub bug: Option<Bug>,
}

/// The root namespace the operator granted: the project `-w` at `/p` with its `a` nested `-r`
/// at `/p/a`, `/ro` `-r` at `/r`; `fs_read`; server one; a public pin; a budget of 3.
fn root() -> Namespace {
    let bind = |target, node, access, mount_point: Option<Node>, host: &str| Bind {
        target,
        node,
        access,
        mount_point,
        host: host.into(),
    };
    Namespace {
        parent: None,
        live: true,
        binds: vec![
            bind("/p", PROJ, Access::Write, None, "/proj"),
            bind("/p/a", PROJ_A, Access::Read, Some(PROJ_A), "/proj/a"),
            bind("/r", RO, Access::Read, None, "/ro"),
        ],
        tools: FS_READ,
        servers: SERVER_ONE,
        pins: vec![Addr::Public],
        limit: 3,
        pool: 0,
        spent: 0,
    }
}

fn components(path: &str) -> Vec<&str> {
    path.split('/').filter(|c| !c.is_empty()).collect()
}

/// Every inode a namespace reaches, with the most access it has there. A nested bind's mount
/// point shadows what lies beneath it in the enclosing bind (the mount follows its dentry).
pub fn reach(host: &Host, ns: &Namespace) -> BTreeMap<Node, Access> {
    let shadowed: Vec<Node> = ns.binds.iter().filter_map(|b| b.mount_point).collect();
    let mut out: BTreeMap<Node, Access> = BTreeMap::new();
    for b in &ns.binds {
        let mut stack = vec![b.node];
        let mut seen = Vec::new();
        while let Some(n) = stack.pop() {
            if seen.contains(&n) {
                continue;
            }
            seen.push(n);
            let e = out.entry(n).or_insert(b.access);
            *e = (*e).max(b.access);
            for (p, _, c) in &host.entries {
                if *p == n && !shadowed.contains(c) {
                    stack.push(*c);
                }
            }
        }
    }
    out
}

impl Narrowing {
    fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    /// nsd's check of a bind asked in the parent's words: the handle to build from, or refused.
    fn check_bind(
        &self,
        s: &State,
        parent: &Namespace,
        path: &str,
        access: Access,
    ) -> Option<Node> {
        let want = components(path);
        let outer = parent
            .binds
            .iter()
            .filter(|b| {
                let have = components(b.target);
                want.len() >= have.len() && want[..have.len()] == have[..]
            })
            .max_by_key(|b| components(b.target).len())?;
        if access > outer.access {
            return None;
        }
        let rest = want[components(outer.target).len()..].join("/");
        let node = s.host.beneath(outer.node, &rest)?;
        if self.has(Bug::WriteBeneathNestedRead) {
            return Some(node);
        }
        let within = s.host.subtree(node);
        let nested = parent.binds.iter().filter(|b| !std::ptr::eq(*b, outer));
        for n in nested {
            let lies_within = if self.has(Bug::NestedByTargetName) {
                let have = components(n.target);
                have.len() > want.len() && have[..want.len()] == want[..]
            } else {
                n.mount_point.is_some_and(|m| within.contains(&m))
            };
            if lies_within && n.access < access {
                return None;
            }
        }
        Some(node)
    }

    fn build(&self, s: &mut State, p: &Pending) {
        let parent = s.namespaces[p.parent].clone();
        let mut child = Namespace {
            parent: Some(p.parent),
            live: true,
            binds: Vec::new(),
            tools: 0,
            servers: 0,
            pins: Vec::new(),
            limit: parent.limit,
            pool: parent.pool,
            spent: 0,
        };
        match p.ask {
            Ask::Bind(path, access) => {
                let Some(checked) = p.checked else { return };
                let node = if self.has(Bug::ReopenByName) {
                    let outer = parent
                        .binds
                        .iter()
                        .filter(|b| path.starts_with(b.target))
                        .max_by_key(|b| b.target.len())
                        .expect("checked under a bind");
                    let host = format!("{}{}", outer.host, &path[outer.target.len()..]);
                    match s.host.by_name(&host, 0) {
                        Some(n) => n,
                        None => return,
                    }
                } else {
                    checked
                };
                child.binds.push(Bind {
                    target: path,
                    node,
                    access,
                    mount_point: None,
                    host: String::new(),
                });
            }
            Ask::Tools(t) => {
                child.tools = if self.has(Bug::GrantInflation) {
                    parent.tools | t
                } else {
                    t
                }
            }
            Ask::Mount(server) => child.servers = server,
            Ask::Limit(l) => {
                child.limit = l;
                if self.has(Bug::LimitsNotCarved) {
                    s.pools.push((l, 0));
                    child.pool = s.pools.len() - 1;
                }
            }
            Ask::Pin(a) => child.pins = vec![a],
        }
        s.namespaces.push(child);
    }

    /// Whether nsd's check passes a directive that is not a bind.
    fn check_other(&self, parent: &Namespace, ask: Ask) -> bool {
        match ask {
            Ask::Bind(..) => unreachable!("binds are checked by check_bind"),
            Ask::Tools(t) => self.has(Bug::GrantInflation) || t & !parent.tools == 0,
            Ask::Mount(server) => self.has(Bug::MountByName) || server & !parent.servers == 0,
            Ask::Limit(l) => l <= parent.limit,
            Ask::Pin(a) => {
                !parent.pins.is_empty() && (self.has(Bug::PinNotRechecked) || a.allowed())
            }
        }
    }

    fn root_of(s: &State, mut i: usize) -> usize {
        while let Some(p) = s.namespaces[i].parent {
            i = p;
        }
        i
    }
}

impl Model for Narrowing {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            host: Host::new(),
            namespaces: vec![root()],
            pools: vec![(3, 0)],
            pending: None,
            moves: 0,
            spends: 0,
            subtree_spent: BTreeMap::new(),
            refused: false,
            built_after_move: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        match &s.pending {
            None if s.namespaces.len() <= self.clones => {
                for (i, ns) in s.namespaces.iter().enumerate() {
                    if ns.live {
                        actions.extend(ASKS.iter().map(|a| Action::Clone(i, *a)));
                    }
                }
            }
            None => {}
            Some(p) if p.checked.is_none() => actions.push(Action::Check),
            Some(_) => actions.push(Action::Build),
        }
        if s.moves < self.moves {
            actions.extend(MOVES.iter().map(|m| Action::Adversary(*m)));
        }
        for (i, ns) in s.namespaces.iter().enumerate() {
            if ns.live {
                if s.spends < self.spends {
                    actions.push(Action::Spend(i));
                }
                if i > 0 {
                    actions.push(Action::End(i));
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Clone(parent, ask) => {
                s.pending = Some(Pending {
                    parent,
                    ask,
                    checked: None,
                })
            }
            Action::Check => {
                let mut p = s.pending.take()?;
                let parent = &s.namespaces[p.parent];
                let passed = match p.ask {
                    Ask::Bind(path, access) => {
                        p.checked = self.check_bind(&s, parent, path, access);
                        p.checked.is_some()
                    }
                    other => {
                        p.checked = Some(ROOT);
                        self.check_other(parent, other)
                    }
                };
                if passed && parent.live {
                    s.pending = Some(p);
                } else {
                    s.refused = true;
                }
            }
            Action::Build => {
                let p = s.pending.take()?;
                if s.namespaces[p.parent].live {
                    self.build(&mut s, &p);
                    s.built_after_move |= s.moves > 0;
                }
            }
            Action::Adversary(m) => {
                match m {
                    Move::Rename(from, to) => {
                        if s.host.lookup(PROJ, to).is_some() {
                            return None;
                        }
                        let n = s.host.unlink(PROJ, from)?;
                        s.host.entries.push((PROJ, to, n));
                    }
                    Move::Symlink(name, target) => {
                        if s.host.lookup(PROJ, name).is_some() {
                            return None;
                        }
                        s.host.kinds.push(Kind::Symlink(target));
                        let n = (s.host.kinds.len() - 1) as Node;
                        s.host.entries.push((PROJ, name, n));
                    }
                }
                s.moves += 1;
            }
            Action::Spend(i) => {
                let ns = &s.namespaces[i];
                let (cap, spent) = s.pools[ns.pool];
                if spent >= cap || ns.spent >= ns.limit {
                    return None;
                }
                s.pools[ns.pool].1 += 1;
                s.namespaces[i].spent += 1;
                s.spends += 1;
                *s.subtree_spent.entry(Self::root_of(&s, i)).or_default() += 1;
            }
            Action::End(i) => {
                s.namespaces[i].live = false;
                if !self.has(Bug::EndRootOnly) {
                    // Children come after their parents, so one pass ends the whole subtree.
                    for j in i + 1..s.namespaces.len() {
                        if let Some(p) = s.namespaces[j].parent
                            && !s.namespaces[p].live
                        {
                            s.namespaces[j].live = false;
                        }
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a namespace reaches nothing its parent does not, with no more access",
                |_, s: &State| {
                    s.namespaces.iter().all(|ns| {
                        let Some(p) = ns.parent else { return true };
                        let mine = reach(&s.host, ns);
                        let theirs = reach(&s.host, &s.namespaces[p]);
                        mine.iter()
                            .all(|(n, a)| theirs.get(n).is_some_and(|pa| pa >= a))
                    })
                },
            ),
            Property::always(
                "no namespace reaches the secret or warren's own directory",
                |_, s: &State| {
                    s.namespaces.iter().all(|ns| {
                        let r = reach(&s.host, ns);
                        !r.contains_key(&SECRET) && !r.contains_key(&WARREN)
                    })
                },
            ),
            Property::always(
                "a child's tools and servers are within its parent's",
                |_, s: &State| {
                    s.namespaces.iter().all(|ns| {
                        ns.parent.is_none_or(|p| {
                            let parent = &s.namespaces[p];
                            ns.tools & !parent.tools == 0 && ns.servers & !parent.servers == 0
                        })
                    })
                },
            ),
            Property::always(
                "every pin passes the root's address rules",
                |_, s: &State| {
                    s.namespaces
                        .iter()
                        .all(|ns| ns.pins.iter().all(|a| a.allowed()))
                },
            ),
            Property::always(
                "a subtree never spends more than its root's budget",
                |_, s: &State| {
                    s.subtree_spent
                        .iter()
                        .all(|(root, spent)| *spent <= s.namespaces[*root].limit)
                },
            ),
            Property::always("a subtree ends with its root", |_, s: &State| {
                s.namespaces
                    .iter()
                    .all(|ns| !ns.live || ns.parent.is_none_or(|p| s.namespaces[p].live))
            }),
            Property::sometimes(
                "a clone is built after the adversary moved",
                |_, s: &State| s.built_after_move && s.namespaces.len() > 1,
            ),
            Property::sometimes("a clone is refused", |_, s: &State| s.refused),
            Property::sometimes("a grandchild is built", |_, s: &State| {
                s.namespaces
                    .iter()
                    .any(|ns| ns.parent.is_some_and(|p| s.namespaces[p].parent.is_some()))
            }),
            Property::sometimes("a subtree spends its whole budget", |_, s: &State| {
                s.subtree_spent.values().any(|v| *v >= 3)
            }),
        ]
    }
}

/// The model's own `covers` on two namespaces over one host: the child reaches nothing more
/// and holds no tool, server or pin its parent lacks, with no higher limit. (`tests/` checks it
/// is a partial order over every namespace the model builds.)
pub fn covers(host: &Host, parent: &Namespace, child: &Namespace) -> bool {
    let theirs = reach(host, parent);
    reach(host, child)
        .iter()
        .all(|(n, a)| theirs.get(n).is_some_and(|pa| pa >= a))
        && child.tools & !parent.tools == 0
        && child.servers & !parent.servers == 0
        && child.pins.iter().all(|a| parent.pins.contains(a))
        && child.limit <= parent.limit
}
