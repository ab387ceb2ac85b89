//! Narrowing: `covers(parent, child)` holds when the child spec asks for nothing the parent
//! lacks (`specs/namespace.md`). A request that widens anything is refused whole.
//!
//! Host paths are compared by what they resolve to — (st_dev, st_ino) along the kernel's `..`
//! walk, and the mount id where a non-recursive bind must not cross into a submount — never by
//! their strings. A clone made from inside (`narrow`) names paths in the parent's view, resolved
//! from the parent's bind fds with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`.
//!
//! Why one file: the narrowing rules are ≈ 340 lines; the rest are their tests, one per rule, kept
//! beside the rule they check.

use std::fmt;
use std::os::fd::AsFd;
use std::path::Path;

use crate::spec::{Access, Net, Spec};
use warren_jail::inode::{Ident, ancestry, ident, open_path};

/// One way in which a child asks for more than its parent has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Widened {
    /// A child path that is under no parent bind (or tool authority) at all.
    PathNotUnderParent {
        what: String,
        host: String,
    },
    /// Under a parent bind, but `-w` where the parent has `-r`.
    WriteWhereParentReads {
        what: String,
        host: String,
    },
    /// `-R` (or a path in another mount) under a non-recursive parent bind: shows submounts
    /// the parent cannot see.
    CrossesSubmount {
        what: String,
        host: String,
    },
    /// A host path that cannot be resolved cannot be shown to be covered.
    Unresolvable {
        what: String,
        host: String,
        error: String,
    },
    ToolNotGranted {
        name: String,
    },
    MountNotInParent {
        server: String,
        path: String,
    },
    Net {
        parent: Net,
        child: Net,
    },
    /// A `net proxy` destination the parent's list does not allow (or allows on narrower terms).
    NetProxy {
        why: String,
    },
    Limit {
        key: &'static str,
        parent: u64,
        child: Option<u64>,
    },
    Env {
        name: String,
    },
    /// The child's path holds, beneath it, a place where the parent's view shows something
    /// else (a narrower or different bind, or a mount): the child would see what the parent's
    /// view there does not.
    Uncovers {
        what: String,
        host: String,
        nested: String,
    },
}

impl fmt::Display for Widened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Widened::PathNotUnderParent { what, host } => {
                write!(f, "{what} `{host}` is not under any of the parent's")
            }
            Widened::WriteWhereParentReads { what, host } => {
                write!(f, "{what} `{host}` asks -w where the parent has only -r")
            }
            Widened::CrossesSubmount { what, host } => write!(
                f,
                "{what} `{host}` reaches a submount the parent's non-recursive bind does not show"
            ),
            Widened::Unresolvable { what, host, error } => {
                write!(f, "{what} `{host}` cannot be resolved: {error}")
            }
            Widened::ToolNotGranted { name } => {
                write!(f, "tool `{name}` is not granted to the parent")
            }
            Widened::MountNotInParent { server, path } => write!(
                f,
                "mount of `{server}` at {path} is not one of the parent's (same server, same key, a subset of its spec)"
            ),
            Widened::Net { parent, child } => {
                write!(f, "net {child:?} is wider than the parent's net {parent:?}")
            }
            Widened::NetProxy { why } => write!(f, "net proxy {why}"),
            Widened::Limit { key, parent, child } => match child {
                Some(c) => write!(f, "limit {key}={c} is above the parent's {parent}"),
                None => write!(f, "limit {key} is unset but the parent has {key}={parent}"),
            },
            Widened::Env { name } => write!(f, "env {name} is not passed to the parent"),
            Widened::Uncovers { what, host, nested } => write!(
                f,
                "{what} `{host}` would show beneath it, at `{nested}`, what the parent's view there does not (a narrower or different bind, or a mount)"
            ),
        }
    }
}

/// Every widening found, in spec order. Never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Widening(pub Vec<Widened>);

impl fmt::Display for Widening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the child spec widens its parent's:")?;
        for w in &self.0 {
            write!(f, "\n  - {w}")?;
        }
        Ok(())
    }
}

impl Widening {
    /// Every widening on one line, `widens: A; B; …` (what a refused `/ns/clone` answers).
    pub fn line(&self) -> String {
        let each: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        format!("widens: {}", each.join("; "))
    }
}

impl std::error::Error for Widening {}

struct Grant {
    id: Ident,
    access: Access,
    recursive: bool,
}

fn resolve(host: &str) -> Result<(Ident, Vec<Ident>), String> {
    let fd = open_path(Path::new(host)).map_err(|e| e.to_string())?;
    let id = ident(fd.as_fd()).map_err(|e| e.to_string())?;
    let chain = ancestry(fd.as_fd()).map_err(|e| e.to_string())?;
    Ok((id, chain))
}

/// Is the child path (resolved to `chain`) covered by one of `grants`?
fn check_path(
    what: &str,
    host: &str,
    access: Access,
    recursive: bool,
    grants: &[Grant],
) -> Option<Widened> {
    let chain = match resolve(host) {
        Ok((_, chain)) => chain,
        Err(error) => {
            return Some(Widened::Unresolvable {
                what: what.into(),
                host: host.into(),
                error,
            });
        }
    };
    let mut best: Option<Widened> = None;
    for g in grants {
        let Some(depth) = chain.iter().position(|c| c.same_file(&g.id)) else {
            continue;
        };
        if access == Access::Write && g.access == Access::Read {
            best.get_or_insert(Widened::WriteWhereParentReads {
                what: what.into(),
                host: host.into(),
            });
            continue;
        }
        // A non-recursive grant shows only its own mount: the child must be reached without
        // crossing into another one, and may not itself ask for submounts.
        let crosses =
            !g.recursive && (recursive || chain[..=depth].iter().any(|c| c.mnt_id != g.id.mnt_id));
        if crosses {
            best = Some(Widened::CrossesSubmount {
                what: what.into(),
                host: host.into(),
            });
            continue;
        }
        return None;
    }
    Some(best.unwrap_or(Widened::PathNotUnderParent {
        what: what.into(),
        host: host.into(),
    }))
}

/// The parent's paths as grants. A parent path that does not resolve grants nothing (a child
/// needing it is then reported as not covered).
fn grants_of<'a>(items: impl Iterator<Item = (&'a str, Access, bool)>) -> Vec<Grant> {
    items
        .filter_map(|(host, access, recursive)| {
            resolve(host).ok().map(|(id, _)| Grant {
                id,
                access,
                recursive,
            })
        })
        .collect()
}

/// Whether a parent mount's words cover a child's mount of the same server: a subset of them.
/// `mount mcp:NAME PATH` with no tool names grants every tool the operator allowed on NAME, so
/// it covers any child mount of NAME, and a child's mount with no names (every tool) is covered
/// only by such a parent mount. (An empty `mount tool` is refused by the parser.)
fn spec_covered(parent: &crate::spec::Mount, child: &crate::spec::Mount) -> bool {
    if matches!(parent.server, crate::spec::Server::Mcp(_)) {
        return parent.spec.is_empty()
            || (!child.spec.is_empty() && child.spec.iter().all(|s| parent.spec.contains(s)));
    }
    child.spec.iter().all(|s| parent.spec.contains(s))
}

/// `Ok(())` when `child` asks for nothing `parent` lacks; otherwise every widening, by name.
pub fn covers(parent: &Spec, child: &Spec) -> Result<(), Widening> {
    let mut out = Vec::new();

    let bind_grants = grants_of(
        parent
            .binds
            .iter()
            .map(|b| (b.host.as_str(), b.access, b.recursive)),
    );
    for b in &child.binds {
        if let Some(w) = check_path("bind", &b.host, b.access, b.recursive, &bind_grants) {
            out.push(w);
        }
    }

    let parent_tools = parent.tool_grants();
    for name in child.tool_grants() {
        if !parent_tools.contains(&name) {
            out.push(Widened::ToolNotGranted { name });
        }
    }
    for t in &child.tools {
        let grants = grants_of(
            parent
                .tools
                .iter()
                .filter(|p| p.name == t.name)
                .flat_map(|p| {
                    p.host_paths
                        .iter()
                        .map(move |h| (h.as_str(), p.access, false))
                }),
        );
        for h in &t.host_paths {
            let what = format!("tool {} authority", t.name);
            if let Some(w) = check_path(&what, h, t.access, false, &grants) {
                out.push(w);
            }
        }
    }

    for m in &child.mounts {
        let found = parent.mounts.iter().any(|p| {
            // As written: a child names its parent's own server and key, and nothing is
            // resolved on its behalf (a path would be opened by name, as nsd).
            p.server == m.server
                && p.key == m.key
                && p.insecure_plain == m.insecure_plain
                && spec_covered(p, m)
        });
        if !found {
            out.push(Widened::MountNotInParent {
                server: m.server.to_string(),
                path: m.path.clone(),
            });
        }
    }

    if child.net() > parent.net() {
        out.push(Widened::Net {
            parent: parent.net(),
            child: child.net(),
        });
    } else if child.net() == Net::Proxy {
        // Both proxy: the child's destinations within the parent's, by the proxy's own lookup.
        let policy = |s: &Spec| warren_proto::net::Policy::new(s.proxy.clone());
        for why in policy(parent).widenings(&policy(child)) {
            out.push(Widened::NetProxy { why });
        }
    }

    // Every limit, the subtree budgets included: a clone's are carved out of its parent's,
    // never above them, and one the parent sets may not be unset in the child.
    let (p, c) = (&parent.limits, &child.limits);
    for (key, pl, cl) in [
        ("mem", p.mem, c.mem),
        ("pids", p.pids, c.pids),
        ("cpu", p.cpu, c.cpu),
        ("wall", p.wall, c.wall),
        ("receipts", p.receipts, c.receipts),
        ("receipt-bytes", p.receipt_bytes, c.receipt_bytes),
        ("asks", p.asks, c.asks),
        ("llm-bytes", p.llm_bytes, c.llm_bytes),
    ] {
        if let Some(pv) = pl
            && cl.is_none_or(|cv| cv > pv)
        {
            out.push(Widened::Limit {
                key,
                parent: pv,
                child: cl,
            });
        }
    }
    // `clones` unset is the default, never more than an ancestor allows: each ancestor's own
    // count is checked when a clone is made (`Nsd`), so only a higher value widens.
    if let Some(cv) = c.clones
        && cv > p.clones()
    {
        out.push(Widened::Limit {
            key: "clones",
            parent: p.clones(),
            child: Some(cv),
        });
    }

    for e in &child.env {
        if !parent.env.contains(e) {
            out.push(Widened::Env { name: e.clone() });
        }
    }

    if out.is_empty() {
        Ok(())
    } else {
        Err(Widening(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;
    use std::os::unix::fs::symlink;

    fn spec(text: &str) -> Spec {
        parse("t.ns", text).unwrap_or_else(|e| panic!("{e}"))
    }

    struct Tree(tempfile::TempDir);
    impl Tree {
        fn new() -> Tree {
            let t = tempfile::Builder::new()
                .prefix("wcov")
                .tempdir_in("/tmp")
                .unwrap();
            for d in ["repo/src", "repo/docs", "other", "sub"] {
                std::fs::create_dir_all(t.path().join(d)).unwrap();
            }
            Tree(t)
        }
        fn p(&self, rel: &str) -> String {
            self.0.path().join(rel).to_str().unwrap().to_string()
        }
    }

    #[test]
    fn a_net_proxy_child_never_widens_its_parents_list() {
        let parent = spec("net proxy api.test:8080=127.0.0.1 '*.pypi.org'\n");
        for narrower in [
            "net none\n",
            "net loopback\n",
            "",
            "net proxy api.test:8080=127.0.0.1\n",
            "net proxy files.pypi.org:443\n",
        ] {
            assert_eq!(covers(&parent, &spec(narrower)), Ok(()), "{narrower:?}");
        }
        for (wider, why) in [
            (
                "net proxy other.test\n",
                "other.test: other.test:80 is not in the parent's list",
            ),
            ("net proxy api.test:8080=127.0.0.2\n", "pinned to 127.0.0.2"),
            (
                "net proxy pypi.org\n",
                "pypi.org: pypi.org:80 is not in the parent's list",
            ),
            ("net proxy 127.0.0.1:8080\n", "not in the parent's list"),
        ] {
            let got = covers(&parent, &spec(wider)).unwrap_err().0;
            assert_eq!(got.len(), 1, "{wider:?}: {got:?}");
            assert!(got[0].to_string().contains(why), "{wider:?}: {}", got[0]);
        }
        for parent in ["net none\n", "net loopback\n", ""] {
            let got = covers(&spec(parent), &spec("net proxy api.test\n"))
                .unwrap_err()
                .0;
            assert_eq!(
                got.iter().map(ToString::to_string).collect::<Vec<_>>(),
                [format!(
                    "net Proxy is wider than the parent's net {:?}",
                    spec(parent).net()
                )],
            );
        }
    }

    #[test]
    fn narrower_child_is_covered() {
        let t = Tree::new();
        let parent = spec(&format!(
            "bind -w {r} /repo\nmount tool /tool fs_read fs_list\ntool fs_read -w {r}\nnet loopback\nenv TERM\nlimit pids=64 mem=1G",
            r = t.p("repo")
        ));
        let child = spec(&format!(
            "bind -r {s} /src\nmount tool /t fs_read\ntool fs_read -r {s}\nnet none\nenv TERM\nlimit pids=10 mem=512M",
            s = t.p("repo/src")
        ));
        covers(&parent, &child).unwrap();
        covers(&parent, &parent).unwrap();
    }

    #[test]
    fn each_widening_is_named() {
        let t = Tree::new();
        let parent = spec(&format!(
            "bind -r {r} /repo\nmount tool /tool fs_read\ntool fs_read -r {r}\nnet none\nlimit pids=64",
            r = t.p("repo")
        ));
        let child = spec(&format!(
            "bind -w {s} /src\nbind -r {o} /o\nmount tool /tool fs_read shell\ntool fs_read -w {s}\nmount gate /gate\nnet loopback\nenv SECRET\nlimit pids=65",
            s = t.p("repo/src"),
            o = t.p("other")
        ));
        let err = covers(&parent, &child).unwrap_err();
        let got = &err.0;
        assert!(got.contains(&Widened::WriteWhereParentReads {
            what: "bind".into(),
            host: t.p("repo/src")
        }));
        assert!(got.contains(&Widened::PathNotUnderParent {
            what: "bind".into(),
            host: t.p("other")
        }));
        assert!(got.contains(&Widened::ToolNotGranted {
            name: "shell".into()
        }));
        assert!(got.contains(&Widened::WriteWhereParentReads {
            what: "tool fs_read authority".into(),
            host: t.p("repo/src")
        }));
        assert!(
            got.iter()
                .any(|w| matches!(w, Widened::MountNotInParent { server, .. } if server == "gate"))
        );
        assert!(got.contains(&Widened::Net {
            parent: Net::None,
            child: Net::Loopback
        }));
        assert!(got.contains(&Widened::Env {
            name: "SECRET".into()
        }));
        assert!(got.contains(&Widened::Limit {
            key: "pids",
            parent: 64,
            child: Some(65)
        }));
        // The `mount tool` line itself also widens (its spec is not a subset).
        assert!(
            got.iter()
                .any(|w| matches!(w, Widened::MountNotInParent { server, .. } if server == "tool"))
        );
        assert_eq!(got.len(), 9, "{err}");
        // More live clones than the parent's (set or default) widens; unset does not.
        let e = covers(&parent, &spec("limit pids=64 mem=1G clones=17")).unwrap_err();
        assert_eq!(
            e.0,
            vec![Widened::Limit {
                key: "clones",
                parent: crate::spec::DEFAULT_CLONES,
                child: Some(17)
            }]
        );
        assert!(covers(&parent, &spec("limit pids=64 mem=1G clones=16")).is_ok());
        // Dropping a parent limit is widening too.
        let e = covers(&parent, &spec("")).unwrap_err();
        assert_eq!(
            e.0,
            vec![Widened::Limit {
                key: "pids",
                parent: 64,
                child: None
            }]
        );
    }

    /// A child never gets an MCP server or a tool of one its parent lacks; a parent's mount of
    /// a server with no names (every tool the operator allowed) covers any mount of it.
    #[test]
    fn an_mcp_mount_narrows_like_a_tool_mount() {
        let every = spec("mount mcp:e /m");
        let echo = spec("mount mcp:e /m echo");
        assert!(covers(&every, &echo).is_ok());
        assert!(covers(&every, &every).is_ok());
        assert!(covers(&echo, &echo).is_ok());
        assert!(covers(&spec("mount mcp:e /m echo add"), &echo).is_ok());
        for (parent, child) in [
            (&echo, &every),
            (&echo, &spec("mount mcp:e /m add")),
            (&every, &spec("mount mcp:other /m")),
            (&spec(""), &echo),
        ] {
            let e = covers(parent, child).unwrap_err();
            assert!(
                matches!(&e.0[0], Widened::MountNotInParent { server, .. } if server.starts_with("mcp:")),
                "{e}"
            );
        }
    }

    /// `mount llm`: a child may mount the model only if its parent does (any path).
    #[test]
    fn a_child_mounts_llm_only_if_its_parent_does() {
        let with = spec("mount llm /mnt/llm");
        assert!(covers(&with, &with).is_ok());
        assert!(covers(&with, &spec("mount llm /m")).is_ok());
        let e = covers(&spec(""), &with).unwrap_err();
        assert!(
            matches!(&e.0[0], Widened::MountNotInParent { server, .. } if server == "llm"),
            "{e}"
        );
    }

    /// A clone's budgets are carved out of its parent's: above them, or dropped, is widening.
    #[test]
    fn a_clone_budget_is_never_above_its_parents() {
        let parent = spec("limit receipts=100 asks=4 receipt-bytes=1M");
        assert!(
            covers(
                &parent,
                &spec("limit receipts=50 asks=4 receipt-bytes=512K")
            )
            .is_ok()
        );
        let e = covers(&parent, &spec("limit receipts=200 asks=4 receipt-bytes=1M")).unwrap_err();
        assert_eq!(
            e.0,
            vec![Widened::Limit {
                key: "receipts",
                parent: 100,
                child: Some(200)
            }]
        );
        let e = covers(&parent, &spec("limit receipts=100 receipt-bytes=1M")).unwrap_err();
        assert_eq!(
            e.0,
            vec![Widened::Limit {
                key: "asks",
                parent: 4,
                child: None
            }]
        );
        // llmfs's memory budget is carved the same way.
        let parent = spec("limit llm-bytes=8M");
        assert!(covers(&parent, &spec("limit llm-bytes=4M")).is_ok());
        let e = covers(&parent, &spec("")).unwrap_err();
        assert_eq!(
            e.0,
            vec![Widened::Limit {
                key: "llm-bytes",
                parent: 8 << 20,
                child: None
            }]
        );
        // A parent with no budget of its own leaves the clone free to set one.
        assert!(covers(&spec(""), &spec("limit asks=2")).is_ok());
    }

    /// The comparison is by inode, not by string: a symlink that *names* a path under the
    /// parent's bind but points elsewhere is not covered, and a differently spelled path to a
    /// covered directory is.
    #[test]
    fn paths_compare_by_inode_not_string() {
        let t = Tree::new();
        symlink(t.p("other"), t.p("repo/escape")).unwrap();
        symlink(t.p("repo/src"), t.p("sub/alias")).unwrap();
        let parent = spec(&format!("bind -r {} /repo", t.p("repo")));
        let child = spec(&format!("bind -r {} /x", t.p("repo/escape")));
        let e = covers(&parent, &child).unwrap_err();
        assert!(matches!(e.0[0], Widened::PathNotUnderParent { .. }), "{e}");
        let child = spec(&format!("bind -r {} /x", t.p("sub/alias")));
        covers(&parent, &child).unwrap();
    }

    #[test]
    fn unresolvable_child_path_is_refused() {
        let t = Tree::new();
        let parent = spec(&format!("bind -r {} /repo", t.p("repo")));
        let child = spec(&format!("bind -r {} /x", t.p("repo/missing")));
        let e = covers(&parent, &child).unwrap_err();
        assert!(matches!(e.0[0], Widened::Unresolvable { .. }), "{e}");
    }

    /// A non-recursive parent bind does not show the submounts under it; a child may not reach
    /// one, nor ask `-R`. Uses a real tmpfs mount (we run as root) in a private mount namespace
    /// of a child process so the host never sees it.
    #[test]
    fn non_recursive_parent_does_not_cover_submounts() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts and needs root (scripts/test runs as root)"
        );
        let t = Tree::new();
        let status = crate::testutil::in_private_mount_ns(|| {
            nix::mount::mount(
                Some("tmpfs"),
                t.p("repo/docs").as_str(),
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .map_err(|e| format!("mount: {e}"))?;
            std::fs::create_dir(t.p("repo/docs/inner")).map_err(|e| e.to_string())?;
            let flat = spec(&format!("bind -r {} /repo", t.p("repo")));
            let deep = spec(&format!("bind -r -R {} /repo", t.p("repo")));
            let child = spec(&format!("bind -r {} /d", t.p("repo/docs/inner")));
            match covers(&flat, &child) {
                Err(e) if matches!(e.0[0], Widened::CrossesSubmount { .. }) => {}
                other => return Err(format!("flat parent: {other:?}")),
            }
            covers(&deep, &child).map_err(|e| format!("recursive parent: {e}"))?;
            let child_r = spec(&format!("bind -r -R {} /s", t.p("repo/src")));
            match covers(&flat, &child_r) {
                Err(e) if matches!(e.0[0], Widened::CrossesSubmount { .. }) => {}
                other => return Err(format!("-R under flat parent: {other:?}")),
            }
            covers(&flat, &spec(&format!("bind -r {} /s", t.p("repo/src"))))
                .map_err(|e| format!("same-mount child: {e}"))?;
            Ok(())
        });
        assert_eq!(status, Ok(()));
    }
}
