//! The kernel's inodes (FUSE nodeids) and the 9P fids behind them, with lookup counts.
//!
//! A node is keyed by (parent nodeid, name), not by qid path: a server that reuses a qid path
//! for two files (a bug, or a hostile third-party server) must not make one name open another's
//! fid. A fresh LOOKUP of a known name whose qid path changed makes a new node (the file was
//! replaced); the old node lives on until the kernel forgets it.

use std::collections::HashMap;
use std::sync::Arc;

use warren_9p::{Fid, QId};

/// The root's nodeid (FUSE_ROOT_ID in linux/fuse.h).
pub(crate) const FUSE_ROOT_ID: u64 = 1;

pub(crate) struct Node {
    parent: u64,
    name: String,
    /// An unopened fid for the file, walked on the attachment of `generation`.
    fid: Arc<Fid>,
    generation: u64,
    qid: QId,
    /// The size the server last reported: 0 marks a synthetic file (see `session::open_flags`).
    size: u64,
    /// LOOKUP/CREATE/MKDIR replies the kernel holds for this node, less its FORGETs.
    nlookup: u64,
    /// A clone of `fid`, walked ahead of the next OPEN (see `take_spare`).
    spare: Option<Fid>,
}

/// What a caller needs from a node outside the table's lock.
pub(crate) struct NodeRef {
    pub fid: Arc<Fid>,
    pub generation: u64,
    pub size: u64,
}

pub(crate) struct Nodes {
    nodes: HashMap<u64, Node>,
    by_name: HashMap<(u64, String), u64>,
    next_id: u64,
}

impl Nodes {
    pub(crate) fn new(root: Arc<Fid>, generation: u64) -> Nodes {
        let qid = root.qid();
        let root = Node {
            parent: 0,
            name: String::new(),
            fid: root,
            generation,
            qid,
            size: 0,
            nlookup: 1,
            spare: None,
        };
        Nodes {
            nodes: HashMap::from([(FUSE_ROOT_ID, root)]),
            by_name: HashMap::new(),
            next_id: FUSE_ROOT_ID + 1,
        }
    }

    pub(crate) fn get(&self, nodeid: u64) -> Option<NodeRef> {
        self.nodes.get(&nodeid).map(|n| NodeRef {
            fid: n.fid.clone(),
            generation: n.generation,
            size: n.size,
        })
    }

    /// The names from the root to `nodeid` (empty for the root), for re-walking after a
    /// re-attach. `None` if the node or one of its ancestors is gone.
    pub(crate) fn path(&self, nodeid: u64) -> Option<Vec<String>> {
        let mut names = Vec::new();
        let mut at = nodeid;
        while at != FUSE_ROOT_ID {
            let node = self.nodes.get(&at)?;
            names.push(node.name.clone());
            at = node.parent;
        }
        names.reverse();
        Some(names)
    }

    /// The node the kernel knows as `name` in `parent`, if any.
    pub(crate) fn child(&self, parent: u64, name: &str) -> Option<u64> {
        self.by_name.get(&(parent, name.to_owned())).copied()
    }

    /// Gives a node a fid on a newer attachment.
    pub(crate) fn refresh(&mut self, nodeid: u64, fid: Arc<Fid>, generation: u64) {
        if let Some(node) = self
            .nodes
            .get_mut(&nodeid)
            .filter(|n| n.generation < generation)
        {
            node.fid = fid;
            node.generation = generation;
            node.spare = None;
        }
    }

    /// The node's pre-walked clone, if it has one on attachment `generation`. OPEN then costs
    /// one 9P round trip (Tlopen) instead of two; the next spare is walked off the caller's path.
    pub(crate) fn take_spare(&mut self, nodeid: u64, generation: u64) -> Option<Fid> {
        let node = self.nodes.get_mut(&nodeid)?;
        let spare = node.spare.take()?;
        (node.generation == generation).then_some(spare)
    }

    /// Keeps `spare` for the next OPEN of `nodeid`, unless the node is gone, has moved to another
    /// attachment or already has one (then `spare` is dropped, so clunked).
    pub(crate) fn put_spare(&mut self, nodeid: u64, generation: u64, spare: Fid) {
        if let Some(node) = self.nodes.get_mut(&nodeid)
            && node.generation == generation
            && node.spare.is_none()
        {
            node.spare = Some(spare);
        }
    }

    pub(crate) fn set_size(&mut self, nodeid: u64, size: u64) {
        if let Some(node) = self.nodes.get_mut(&nodeid) {
            node.size = size;
        }
    }

    /// Records one more kernel reference to `name` in `parent`, just walked to `fid`. Reuses the
    /// node already known under that name when it is the same file (the new fid is dropped, so
    /// clunked), else makes a new one. Returns the nodeid.
    pub(crate) fn add_lookup(
        &mut self,
        parent: u64,
        name: &str,
        fid: Fid,
        generation: u64,
        size: u64,
    ) -> u64 {
        let qid = fid.qid();
        let key = (parent, name.to_owned());
        if let Some(&id) = self.by_name.get(&key)
            && let Some(node) = self.nodes.get_mut(&id)
            && node.qid.path == qid.path
            && node.qid.typ == qid.typ
        {
            node.nlookup += 1;
            node.size = size;
            if node.generation < generation {
                node.fid = Arc::new(fid);
                node.generation = generation;
                node.spare = None;
            }
            return id;
        }
        let id = self.next_id;
        self.next_id += 1;
        let node = Node {
            parent,
            name: name.to_owned(),
            fid: Arc::new(fid),
            generation,
            qid,
            size,
            nlookup: 1,
            spare: None,
        };
        self.nodes.insert(id, node);
        self.by_name.insert(key, id);
        id
    }

    /// The kernel dropped `n` references (FORGET, or a reply it never saw). At zero the node
    /// goes, and with it (once no request still holds it) its fid.
    pub(crate) fn forget(&mut self, nodeid: u64, n: u64) {
        if nodeid == FUSE_ROOT_ID {
            return;
        }
        let Some(node) = self.nodes.get_mut(&nodeid) else {
            return;
        };
        node.nlookup = node.nlookup.saturating_sub(n);
        if node.nlookup > 0 {
            return;
        }
        let node = self.nodes.remove(&nodeid).expect("node present");
        let key = (node.parent, node.name);
        if self.by_name.get(&key) == Some(&nodeid) {
            self.by_name.remove(&key);
        }
    }

    /// A name was unlinked: later lookups must walk again and make a new node.
    pub(crate) fn unlink_name(&mut self, parent: u64, name: &str) {
        self.by_name.remove(&(parent, name.to_owned()));
    }
}
