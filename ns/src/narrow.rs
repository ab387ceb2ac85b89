//! Narrowing from inside: a child spec written to a namespace's own `/ns` names paths in the
//! PARENT's view. nsd resolves each of them beneath the parent's own handles — a bind beneath
//! the bind source it falls under, a tool authority beneath the parent's root for the same tool
//! (`crate::handles`) — with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)`, `RESOLVE_NO_XDEV` too under a non-recursive parent bind, so neither
//! `..`, a symlink planted in the parent's tree, nor a swap of a parent's path by name can reach
//! outside it. The child is built from the handles this opens, never from names, and
//! `covers(parent, child)` then checks the result, handle against handle (specs/namespace.md,
//! "Narrowing").
//!
//! Why one file: one function (`narrow`) and its helpers; over half the length is its tests.

use std::os::fd::{AsFd, OwnedFd};

use crate::covers::{Widened, Widening, covers};
use crate::handles::{Built, Handles, ToolRoot};
use crate::spec::{Access, Spec};
use warren_jail::inode::{ancestry, ident};
use warren_jail::{Dir, openat2};

const BENEATH: u64 =
    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

fn components(path: &str) -> Vec<&str> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

/// `path` as (root, rest) where root is one of `roots` (by whole components; the last of the
/// longest wins, as a later bind shadows an earlier one) and rest the components after it.
fn split_under<'a, T>(roots: &'a [(String, T)], path: &str) -> Option<(&'a T, String)> {
    let want = components(path);
    let mut best: Option<(usize, &T)> = None;
    for (root, item) in roots {
        let have = components(root);
        if want.len() >= have.len()
            && want[..have.len()] == have[..]
            && best.is_none_or(|(n, _)| have.len() >= n)
        {
            best = Some((have.len(), item));
        }
    }
    best.map(|(n, item)| (item, want[n..].join("/")))
}

#[cfg(test)]
thread_local! {
    /// Planted violation: resolve child paths following symlinks and `..` and skip `covers`,
    /// so the property test can be shown to fail.
    static UNCHECKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn unchecked() -> bool {
    UNCHECKED.with(|u| u.get())
}
#[cfg(not(test))]
fn unchecked() -> bool {
    false
}

/// Opens `rest` beneath `root` without following any symlink or leaving it.
fn open_beneath(root: &OwnedFd, rest: &str, same_mount: bool) -> std::io::Result<OwnedFd> {
    let path = if rest.is_empty() { "." } else { rest };
    if unchecked() {
        return openat2(Dir::Fd(root.as_fd()), path, libc::O_PATH, 0, 0);
    }
    let mut resolve = BENEATH;
    if same_mount {
        resolve |= libc::RESOLVE_NO_XDEV;
    }
    openat2(Dir::Fd(root.as_fd()), path, libc::O_PATH, 0, resolve)
}

/// A directory beneath `root`: a tool root must be one.
fn open_dir_beneath(root: &OwnedFd, rest: &str) -> std::io::Result<OwnedFd> {
    let fd = open_beneath(root, rest, true)?;
    let meta = nix::sys::stat::fstat(fd.as_fd())?;
    if meta.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    Ok(fd)
}

/// `root` joined with the components of `rest` (a child's root, in its parent's naming).
fn joined(root: &str, rest: &str) -> String {
    if rest.is_empty() {
        root.to_string()
    } else {
        format!("{}/{rest}", root.trim_end_matches('/'))
    }
}

/// Resolves `child` (paths in the parent's view) beneath `parent_handles`, the handles `parent`
/// (the parent's build spec) was built from, and checks that it widens nothing. Refused whole:
/// every widening is named, in the child's words.
pub fn narrow(parent: &Spec, parent_handles: &Handles, child: &Spec) -> Result<Built, Widening> {
    let mut out = Vec::new();
    let mut handles = Handles::default();
    let mut build = child.clone();
    if let Err(error) = crate::handles::check_count(child) {
        return Err(Widening(vec![Widened::Unresolvable {
            what: "spec".into(),
            host: "its paths".into(),
            error,
        }]));
    }

    // The parent's view: each bind target with the handle nsd built it from.
    let parent_binds: Vec<(String, ViewBind<'_>)> = parent
        .binds
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let bind = ViewBind {
                handle: parent_handles.bind(i),
                access: b.access,
                recursive: b.recursive,
            };
            (b.path.clone(), bind)
        })
        .collect();
    let mount_targets: Vec<&str> = parent.mounts.iter().map(|m| m.path.as_str()).collect();
    for b in &mut build.binds {
        let asked = b.host.clone();
        let what = "bind";
        let resolved = match split_under(&parent_binds, &asked) {
            None => Err(Widened::PathNotUnderParent {
                what: what.into(),
                host: asked.clone(),
            }),
            Some((ViewBind { handle: None, .. }, _)) => Err(Widened::Unresolvable {
                what: what.into(),
                host: asked.clone(),
                error: "the parent holds no handle for its own bind".into(),
            }),
            Some((ViewBind { access, .. }, _)) if b.access > *access => {
                Err(Widened::WriteWhereParentReads {
                    what: what.into(),
                    host: asked.clone(),
                })
            }
            Some((ViewBind { recursive, .. }, _)) if b.recursive && !recursive => {
                Err(Widened::CrossesSubmount {
                    what: what.into(),
                    host: asked.clone(),
                })
            }
            Some((
                ViewBind {
                    handle: Some(root),
                    recursive,
                    ..
                },
                rest,
            )) => open_beneath(root, &rest, !recursive)
                .map_err(|e| Widened::Unresolvable {
                    what: what.into(),
                    host: asked.clone(),
                    error: beneath_error(&e),
                })
                .and_then(|fd| {
                    let nested = parent_binds.iter().filter_map(|(target, v)| {
                        Some(Nested {
                            target,
                            access: v.access,
                            handle: v.handle?,
                        })
                    });
                    let outer = outer_target(&asked, &rest);
                    match uncovered(&fd, &asked, &outer, b.access, nested, &mount_targets) {
                        Some(nested) => Err(Widened::Uncovers {
                            what: what.into(),
                            host: asked.clone(),
                            nested,
                        }),
                        None => Ok(fd),
                    }
                }),
        };
        match resolved {
            Ok(fd) => b.host = handles.hold_bind(fd, &asked),
            Err(w) => out.push(w),
        }
    }

    for t in &mut build.tools {
        let roots: Vec<(String, &ToolRoot)> = parent_handles
            .tool_roots()
            .iter()
            .filter(|r| r.tool == t.name)
            .map(|r| (r.path.clone(), r))
            .collect();
        let what = format!("tool {} authority", t.name);
        for h in &mut t.host_paths {
            let asked = h.clone();
            let resolved = match split_under(&roots, &asked) {
                None => Err(Widened::PathNotUnderParent {
                    what: what.clone(),
                    host: asked.clone(),
                }),
                Some((root, _)) if t.access > root.access => Err(Widened::WriteWhereParentReads {
                    what: what.clone(),
                    host: asked.clone(),
                }),
                Some((root, rest)) => open_dir_beneath(&root.dir, &rest)
                    .map_err(|e| Widened::Unresolvable {
                        what: what.clone(),
                        host: asked.clone(),
                        error: beneath_error(&e),
                    })
                    .and_then(|dir| {
                        let nested = roots.iter().map(|(path, r)| Nested {
                            target: path,
                            access: r.access,
                            handle: &r.dir,
                        });
                        let outer = outer_target(&asked, &rest);
                        match uncovered(&dir, &asked, &outer, t.access, nested, &[]) {
                            Some(nested) => Err(Widened::Uncovers {
                                what: what.clone(),
                                host: asked.clone(),
                                nested,
                            }),
                            None => Ok(ToolRoot {
                                tool: t.name.clone(),
                                path: joined(&root.path, &rest),
                                access: t.access,
                                dir,
                            }),
                        }
                    }),
            };
            match resolved {
                Ok(root) => *h = handles.hold_tool_root(root, &asked),
                Err(w) => out.push(w),
            }
        }
    }

    if !out.is_empty() {
        // Unresolved paths are already named; the rest of the spec is checked too.
        build.binds.retain(|b| b.host.starts_with("/proc/self/fd/"));
        for t in &mut build.tools {
            t.host_paths.retain(|h| h.starts_with("/proc/self/fd/"));
        }
    }
    if let Err(Widening(more)) = covers(parent, &build)
        && !unchecked()
    {
        out.extend(more.into_iter().map(|w| in_child_words(w, &handles)));
    }
    if out.is_empty() {
        Ok(Built { build, handles })
    } else {
        Err(Widening(out))
    }
}

/// One bind of the parent's view.
struct ViewBind<'a> {
    handle: Option<&'a OwnedFd>,
    access: Access,
    recursive: bool,
}

/// A place of the parent's view that may lie beneath a child's path.
struct Nested<'a> {
    target: &'a str,
    access: Access,
    handle: &'a OwnedFd,
}

/// Whether the child's `opened` (asked as `asked`, with `access`) holds, strictly beneath it, a
/// place where the parent's view shows something narrower or other than what the child would
/// see there: a nested bind with less access, or whose source is not the file at that place
/// beneath the child's handle, or a mount. Names that place.
///
/// A nested bind is found by its target's name beneath `asked`, and also by its handle: one
/// nested under the same parent bind (`outer`) whose source lies within the child's handle.
/// The second is what a rename made outside the namespace cannot fool: the nested mount
/// follows its mount point's dentry to a new name, so the parent's view still shows it with
/// its own access there while no target name lies beneath `asked` any more.
fn uncovered<'a>(
    opened: &OwnedFd,
    asked: &str,
    outer: &str,
    access: Access,
    nested: impl Iterator<Item = Nested<'a>>,
    mounts: &[&str],
) -> Option<String> {
    let beneath = |above: &str, target: &str| -> Option<String> {
        let (want, have) = (components(above), components(target));
        (have.len() > want.len() && have[..want.len()] == want[..])
            .then(|| have[want.len()..].join("/"))
    };
    if let Some(m) = mounts.iter().find(|m| beneath(asked, m).is_some()) {
        return Some(m.to_string());
    }
    let Ok(opened_id) = ident(opened.as_fd()) else {
        return Some(asked.to_string());
    };
    for n in nested {
        if n.access < access
            && beneath(outer, n.target).is_some()
            && lies_within(n.handle, &opened_id)
        {
            return Some(n.target.to_string());
        }
        let Some(rel) = beneath(asked, n.target) else {
            continue;
        };
        if n.access < access {
            return Some(n.target.to_string());
        }
        let same = open_beneath(opened, &rel, false)
            .and_then(|here| {
                let (a, b) = (ident(here.as_fd())?, ident(n.handle.as_fd())?);
                Ok(a.same_file(&b))
            })
            .unwrap_or(false);
        if !same {
            return Some(n.target.to_string());
        }
    }
    None
}

/// Whether `handle` is the directory `within` or lies beneath it (by (st_dev, st_ino) along
/// the kernel's `..` walk). A handle whose walk fails is taken to lie within: refusing is the
/// safe answer.
fn lies_within(handle: &OwnedFd, within: &warren_jail::inode::Ident) -> bool {
    ancestry(handle.as_fd()).map_or(true, |chain| chain.iter().any(|c| c.same_file(within)))
}

/// The parent's target under which `asked` was resolved: `asked` less its last `rest`
/// components.
fn outer_target(asked: &str, rest: &str) -> String {
    let want = components(asked);
    let keep = want.len() - components(rest).len();
    format!("/{}", want[..keep].join("/"))
}

fn beneath_error(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EXDEV) => "it leaves the parent's bind (`..` or a submount)".into(),
        Some(libc::ELOOP) => "it goes through a symlink (never followed in a child spec)".into(),
        _ => e.to_string(),
    }
}

fn in_child_words(w: Widened, handles: &Handles) -> Widened {
    let word = |host: String| handles.words_for(&host).unwrap_or(host);
    match w {
        Widened::PathNotUnderParent { what, host } => Widened::PathNotUnderParent {
            what,
            host: word(host),
        },
        Widened::WriteWhereParentReads { what, host } => Widened::WriteWhereParentReads {
            what,
            host: word(host),
        },
        Widened::CrossesSubmount { what, host } => Widened::CrossesSubmount {
            what,
            host: word(host),
        },
        Widened::Unresolvable { what, host, error } => Widened::Unresolvable {
            what,
            host: word(host),
            error,
        },
        Widened::Uncovers { what, host, nested } => Widened::Uncovers {
            what,
            host: word(host),
            nested,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handles::handle_name;
    use crate::spec::{Access, Bind, parse};
    use std::os::unix::fs::symlink;
    use std::path::Path;
    use warren_jail::inode::{ancestry, ident, open_path};

    fn spec(text: &str) -> Spec {
        parse("t.ns", text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    /// data/{a/b,c}, etc, tools/w/x, outside; data/out -> outside, data/in -> data/c.
    fn tree() -> (tempfile::TempDir, impl Fn(&str) -> String) {
        let t = tempfile::Builder::new()
            .prefix("wnar")
            .tempdir_in("/tmp")
            .unwrap();
        let base = t.path().to_path_buf();
        for d in ["data/a/b", "data/c", "etc", "tools/w/x", "outside"] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        symlink(base.join("outside"), base.join("data/out")).unwrap();
        symlink(base.join("data/c"), base.join("data/in")).unwrap();
        (t, move |rel: &str| {
            base.join(rel).to_str().unwrap().to_string()
        })
    }

    /// `parent` as nsd takes an operator's spec in (its paths opened once, as handles), then
    /// `child` narrowed from those handles.
    fn narrow_from(parent: &Spec, child: &Spec) -> Result<Built, Widening> {
        let p = opened(parent);
        narrow(&p.build, &p.handles, child)
    }

    fn opened(spec: &Spec) -> Built {
        let nowhere = crate::ProtectedDirs {
            runtime: "/nonexistent/warren/run".into(),
            data: "/nonexistent/warren/data".into(),
            secrets: "/nonexistent/warren/secrets".into(),
        };
        let guard = crate::confine::guard::Guard::new(&nowhere).unwrap();
        crate::handles::open_spec(spec, &guard).unwrap()
    }

    fn refused(parent: &Spec, child: &Spec) -> Vec<Widened> {
        match narrow_from(parent, child) {
            Ok(n) => panic!("not refused: {:?}", n.build),
            Err(e) => e.0,
        }
    }

    #[test]
    fn a_child_names_paths_in_the_parents_view_and_is_built_from_handles() {
        let (_t, p) = tree();
        let parent = spec(&format!("bind -w {} /data\nnet loopback", p("data")));
        let child = spec("bind -r /data/a /a\nbind -w /data/c /c\nnet none");
        let n = narrow_from(&parent, &child).unwrap();
        let want = ident(open_path(Path::new(&p("data/a"))).unwrap().as_fd()).unwrap();
        let held = n.handles.bind(0).unwrap();
        assert!(ident(held.as_fd()).unwrap().same_file(&want));
        assert!(n.handles.bind(1).is_some() && n.handles.bind(2).is_none());
        assert_eq!(n.build.binds[0].host, handle_name(held));
        assert_eq!(n.build.binds[0].path, "/a");
        // The same spec is refused when the parent's bind sits elsewhere: a view path is not a
        // host path.
        let elsewhere = spec(&format!("bind -w {} /data", p("etc")));
        let got = refused(&elsewhere, &child);
        assert!(
            matches!(&got[0], Widened::Unresolvable { host, .. } if host == "/data/a"),
            "{got:?}"
        );
    }

    /// InferNode's escape: `..` inside a bind never reaches past the parent's view. The parser
    /// refuses a `..` component already; nsd's resolution refuses it again (built by hand here).
    #[test]
    fn dotdot_never_leaves_the_parents_bind() {
        let (_t, p) = tree();
        let parent = spec(&format!("bind -r {} /data", p("data")));
        assert!(parse("t", "bind -r /data/../etc /e").is_err());
        let mut child = Spec::default();
        for host in ["/data/../etc", "/data/a/../../etc", "/data/a/../../../../"] {
            child.binds = vec![Bind {
                access: Access::Read,
                recursive: false,
                host: host.into(),
                path: "/e".into(),
            }];
            let got = refused(&parent, &child);
            assert!(
                matches!(&got[..], [Widened::Unresolvable { error, .. }] if error.contains("leaves")),
                "{host}: {got:?}"
            );
        }
        // `..` that stays beneath is the same directory as its plain spelling.
        child.binds[0].host = "/data/a/../c".into();
        narrow_from(&parent, &child).unwrap();
    }

    /// A symlink planted in the parent's bind is never followed, whether it points out or in.
    #[test]
    fn symlinks_in_the_parents_bind_are_never_followed() {
        let (_t, p) = tree();
        let parent = spec(&format!("bind -w {} /data", p("data")));
        for link in ["/data/out", "/data/in"] {
            let got = refused(&parent, &spec(&format!("bind -r {link} /x")));
            assert!(
                matches!(&got[..], [Widened::Unresolvable { error, host, .. }] if error.contains("symlink") && host == link),
                "{link}: {got:?}"
            );
        }
    }

    /// InferNode's other escape: a parent holding 2 tools cannot create a child holding 3.
    #[test]
    fn a_parent_with_two_tools_cannot_make_a_child_with_three() {
        let parent = spec("mount tool /tool echo fs_read");
        narrow_from(&parent, &spec("mount tool /tool echo")).unwrap();
        narrow_from(&parent, &spec("mount tool /t fs_read echo")).unwrap();
        let got = refused(&parent, &spec("mount tool /tool echo fs_read shell"));
        assert!(got.contains(&Widened::ToolNotGranted {
            name: "shell".into()
        }));
        // Two mount lines adding up to three tools are refused the same way.
        let got = refused(
            &parent,
            &spec("mount tool /tool echo fs_read\nmount tool /more shell"),
        );
        assert!(got.contains(&Widened::ToolNotGranted {
            name: "shell".into()
        }));
    }

    #[test]
    fn tool_authority_is_resolved_beneath_the_parents_authority_for_that_tool() {
        let (_t, p) = tree();
        let parent = spec(&format!(
            "mount tool /tool fs_read fs_write\ntool fs_read -w {w}\ntool fs_write -r {w}",
            w = p("tools/w")
        ));
        let ok = narrow_from(
            &parent,
            &spec(&format!(
                "mount tool /tool fs_read\ntool fs_read -r {}",
                p("tools/w/x")
            )),
        )
        .unwrap();
        // Built from a handle beneath the parent's root; shown to the worker at the path the
        // child named.
        let root = &ok.handles.tool_roots()[0];
        assert_eq!(root.path, p("tools/w/x"));
        assert_eq!(ok.build.tools[0].host_paths, vec![handle_name(&root.dir)]);
        let want = ident(open_path(Path::new(&p("tools/w/x"))).unwrap().as_fd()).unwrap();
        assert!(ident(root.dir.as_fd()).unwrap().same_file(&want));
        let asks = [
            // a path the tool lacks
            (format!("tool fs_read -r {}", p("outside")), "not under"),
            // -w where the parent's authority for that tool is -r
            (format!("tool fs_write -w {}", p("tools/w")), "-w where"),
        ];
        for (line, says) in asks {
            let text = format!("mount tool /tool fs_read fs_write\n{line}");
            let e = narrow_from(&parent, &spec(&text)).unwrap_err();
            assert!(e.to_string().contains(says), "{line}: {e}");
        }
        // Another tool's authority is not this one's.
        let e = narrow_from(
            &parent,
            &spec(&format!(
                "mount tool /tool fs_read fs_write\ntool fs_read -r {}\ntool fs_write -r {}",
                p("tools/w"),
                p("outside")
            )),
        )
        .unwrap_err();
        assert!(e.to_string().contains("tool fs_write authority"), "{e}");
    }

    /// The escape a review found: a parent swaps the directory of a tool root it can write for
    /// a symlink, before the clone and again after it was accepted. The child's authority is
    /// the directory that was checked, beneath the handle nsd holds; no name is walked again.
    #[test]
    fn a_swapped_name_never_moves_an_authority() {
        let (_t, p) = tree();
        std::fs::write(p("tools/w/x/f"), "inside").unwrap();
        std::fs::write(p("etc/f"), "the host's").unwrap();
        let parent = opened(&spec(&format!(
            "mount tool /tool fs_read\ntool fs_read -r {}",
            p("tools/w")
        )));
        // Swapped by name after nsd took the parent in.
        std::fs::rename(p("tools/w"), p("tools/w.real")).unwrap();
        symlink(p("etc"), p("tools/w")).unwrap();
        let child = narrow(
            &parent.build,
            &parent.handles,
            &spec(&format!(
                "mount tool /tool fs_read\ntool fs_read -r {}",
                p("tools/w/x")
            )),
        )
        .unwrap();
        let root = &child.handles.tool_roots()[0];
        assert_eq!(root.path, p("tools/w/x"), "shown where the child named it");
        // Swapped again after the child was accepted (a rename over the checked directory).
        std::fs::rename(p("tools/w.real/x"), p("tools/x.moved")).unwrap();
        symlink(p("etc"), p("tools/w.real/x")).unwrap();
        let f = openat2(Dir::Fd(root.dir.as_fd()), "f", libc::O_RDONLY, 0, BENEATH).unwrap();
        let got = std::io::read_to_string(std::fs::File::from(f)).unwrap();
        assert_eq!(got, "inside");
    }

    /// Found by an attack (nested read-only bind in a writable one): an operator makes part of a writable
    /// bind read-only with a second bind at a nested target (`bind -w PROJ /p`, `bind -r
    /// PROJ/.git /p/.git`), so the parent cannot write `/p/.git`. A child asks `-w` for a path
    /// under `/p/.git`: `narrow` resolves it beneath the `-r` bind (the longest target), but
    /// `covers` accepts it because the `-w` bind's source is an ancestor of the handle by inode.
    /// The child is built writable where its parent only reads. The same for a tool's roots.
    #[test]
    fn a_child_is_never_writable_beneath_a_nested_read_only_bind() {
        let (_t, p) = tree();
        let parent = spec(&format!(
            "bind -w {d} /data\nbind -r {d}/a /data/a\nmount tool /tool fs_write\ntool fs_write -w {d}\ntool fs_write -r {d}/a",
            d = p("data")
        ));
        let mut widened = Vec::new();
        for child in [
            "bind -w /data/a /x".to_string(),
            "bind -w /data/a/b /x".to_string(),
            format!(
                "mount tool /tool fs_write\ntool fs_write -w {}",
                p("data/a/b")
            ),
        ] {
            if let Ok(n) = narrow_from(&parent, &spec(&child)) {
                widened.push(format!("{child:?} accepted as {:?}", n.build));
            }
        }
        assert!(
            widened.is_empty(),
            "children writable where the parent's view is read-only: {widened:#?}"
        );
    }

    /// Found by an attack (a child's words opened by name): N3c says a cloned child never causes an open by
    /// name, and specs/namespace.md that a child's `mount` lines are compared as written. But
    /// `covers` resolves a child's `mount unix!PATH` (and `-k /KEY`) by name, as nsd (root,
    /// following symlinks, in the host's mount namespace): a child may name a host path outside
    /// its parent's view — here a symlink in a directory the parent has no bind of — and learns
    /// from accept/refuse whether it is the parent's socket. Held: refused (not as written).
    #[test]
    fn a_childs_mount_is_compared_as_written_never_opened() {
        let (_t, p) = tree();
        let sock = p("data/srv.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        symlink(&sock, p("outside/elsewhere.sock")).unwrap();
        let parent = spec(&format!("mount unix!{sock} /srv"));
        let child = spec(&format!("mount unix!{} /srv", p("outside/elsewhere.sock")));
        let got = narrow_from(&parent, &child);
        assert!(
            got.is_err(),
            "a child's mount of unix!{} (a host path outside its parent's view, resolved by name) was accepted",
            p("outside/elsewhere.sock")
        );
    }

    /// Each kind of widening the issue names is refused whole, and named.
    #[test]
    fn every_widening_is_refused_by_name() {
        let (_t, p) = tree();
        let parent = spec(&format!(
            "bind -r {d} /data\nmount tool /tool echo\nmount ns /ns\nmount -k k1 tcp!h1!564 /srv\nnet none\nlimit pids=64 mem=1G",
            d = p("data")
        ));
        let base = "mount tool /tool echo\nlimit pids=64 mem=1G";
        let cases = [
            ("mount tool /more shell", "tool `shell`"),
            ("bind -r /etc /e", "not under any"),
            ("bind -w /data/a /a", "-w where"),
            ("net loopback", "net Loopback"),
            ("mount tcp!127.0.0.1!564 /t", "tcp!127.0.0.1!564"),
            ("mount unix!/run/x.sock /u", "unix!/run/x.sock"),
            ("mount gate /gate", "mount of `gate`"),
            ("mount -k k2 tcp!h1!564 /srv", "tcp!h1!564"),
            ("mount receipts /r", "mount of `receipts`"),
            ("limit pids=65 mem=1G", "pids=65"),
            ("env SECRET", "env SECRET"),
        ];
        for (line, says) in cases {
            let text = match line.strip_prefix("limit ") {
                Some(_) => format!("mount tool /tool echo\n{line}"),
                None => format!("{base}\n{line}"),
            };
            let e = narrow_from(&parent, &spec(&text)).unwrap_err();
            assert!(e.to_string().contains(says), "{line}: {e}");
        }
        // The same base with the parent's own key and mounts is fine.
        narrow_from(
            &parent,
            &spec(&format!(
                "{base}\nmount ns /ns\nmount -k k1 tcp!h1!564 /srv"
            )),
        )
        .unwrap();
    }

    /// Is every bind and authority of `child` (built) under one of `ancestor`'s (built), with no
    /// more access? Checked independently of `covers`: by the inode chain of each handle.
    fn within(ancestor: &Spec, child: &Spec) -> Result<(), String> {
        let chain = |host: &str| {
            let fd = open_path(Path::new(host)).map_err(|e| format!("{host}: {e}"))?;
            ancestry(fd.as_fd()).map_err(|e| format!("{host}: {e}"))
        };
        for b in &child.binds {
            let c = chain(&b.host)?;
            let ok = ancestor.binds.iter().any(|a| {
                (b.access <= a.access)
                    && chain(&a.host)
                        .ok()
                        .and_then(|ac| ac.first().cloned())
                        .is_some_and(|top| c.iter().any(|x| x.same_file(&top)))
            });
            if !ok {
                return Err(format!("bind {} → {} exceeds its ancestor", b.host, b.path));
            }
        }
        let granted = ancestor.tool_grants();
        if let Some(t) = child.tool_grants().iter().find(|t| !granted.contains(t)) {
            return Err(format!("tool {t} exceeds its ancestor"));
        }
        if child.net() > ancestor.net() {
            return Err("net exceeds its ancestor".into());
        }
        Ok(())
    }

    mod property {
        use super::*;
        use proptest::prelude::*;

        /// A child spec's words, drawn from names that exist, names that are planted symlinks
        /// (out of the tree and within it), `..` spellings and paths outside the parent's view.
        fn view_path() -> impl Strategy<Value = String> {
            prop::sample::select(vec![
                "/data",
                "/data/a",
                "/data/a/b",
                "/data/c",
                "/data/out",
                "/data/in",
                "/data/../etc",
                "/data/a/../../outside",
                "/data/a/..",
                "/etc",
                "/outside",
                "/a",
                "/a/b",
                "/a/../c",
                "/c",
                "/x",
                "/x/a",
                "/x/out",
            ])
            .prop_map(str::to_string)
        }

        fn target() -> impl Strategy<Value = String> {
            prop::sample::select(vec!["/data", "/a", "/c", "/x"]).prop_map(str::to_string)
        }

        fn child_spec() -> impl Strategy<Value = Spec> {
            let bind = (any::<bool>(), view_path(), target()).prop_map(|(w, host, path)| Bind {
                access: if w { Access::Write } else { Access::Read },
                recursive: false,
                host,
                path,
            });
            let tools = prop::sample::subsequence(vec!["echo", "fs_read", "shell"], 0..=3);
            (prop::collection::vec(bind, 0..4), tools, any::<bool>()).prop_map(
                |(binds, tools, loopback)| {
                    let mut text = String::new();
                    if !tools.is_empty() {
                        text.push_str(&format!("mount tool /tool {}\n", tools.join(" ")));
                    }
                    if loopback {
                        text.push_str("net loopback\n");
                    }
                    let mut s = parse("<prop>", &text).unwrap();
                    // Built by hand: the parser would refuse `..` before nsd ever saw it.
                    let mut seen = std::collections::BTreeSet::new();
                    s.binds = binds
                        .into_iter()
                        .filter(|b| seen.insert(b.path.clone()))
                        .collect();
                    s
                },
            )
        }

        /// The checker catches a descendant that exceeds: with the resolution and `covers`
        /// switched off (planted), a symlink out of the parent's bind gets through and
        /// `within` says so.
        #[test]
        fn the_checker_catches_a_planted_escape() {
            let (_t, p) = tree();
            let root = spec(&format!("bind -w {} /data", p("data")));
            let child = spec("bind -r /data/out /o");
            UNCHECKED.with(|u| u.set(true));
            let n = narrow_from(&root, &child);
            UNCHECKED.with(|u| u.set(false));
            let n = n.unwrap();
            assert!(within(&root, &n.build).is_err());
            assert!(narrow_from(&root, &child).is_err());
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

            /// Random spec trees three deep: whatever each level asks, no accepted descendant
            /// exceeds ANY of its ancestors (checked by inode, not by `covers`).
            #[test]
            fn no_descendant_exceeds_an_ancestor(levels in prop::collection::vec(child_spec(), 1..4)) {
                let (_t, p) = tree();
                let root = spec(&format!(
                    "bind -w {d} /data\nbind -r {d}/a /a\nmount tool /tool echo fs_read\nnet none",
                    d = p("data")
                ));
                // Every accepted level stays alive (its handles name its binds).
                let mut chain: Vec<Built> = vec![opened(&root)];
                for asked in levels {
                    let parent = chain.last().unwrap();
                    match narrow(&parent.build, &parent.handles, &asked) {
                        Ok(n) => {
                            for ancestor in &chain {
                                prop_assert_eq!(within(&ancestor.build, &n.build), Ok(()));
                            }
                            chain.push(n);
                        }
                        Err(e) => prop_assert!(!e.0.is_empty()),
                    }
                }
            }
        }
    }
}
