use super::*;
use warren_ns::spec::Spec;

#[test]
fn operators_namespaces_run_under_their_uid_and_roots_never_as_0() {
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    assert_eq!(nsd.run_options().uid, None, "root: a per-namespace uid");
    assert_eq!(nsd.for_operator(0).run_options().uid, None);
    assert_eq!(nsd.for_operator(1234).run_options().uid, Some(1234));
    // One set of namespaces, whoever looks.
    assert!(Arc::ptr_eq(&nsd.shared, &nsd.for_operator(1234).shared));
}

async fn clone_in(view: &Nsd, text: &str) -> Result<u64> {
    let (_, root) = view.attach("", "", 0).await?;
    let (_, fid) = view.walk(&root, &["clone".into()]).await?;
    let mut fid = fid.ok_or(Errno::ENOENT)?;
    view.open(&mut fid, 2).await?;
    view.write(&mut fid, 0, text.as_bytes()).await?;
    let id = view.read(&mut fid, 0, 64).await?;
    Ok(String::from_utf8(id).unwrap().trim().parse().unwrap())
}

/// Writes `text` to a fresh `clone` fid and reads twice at the write's end, as a shell on
/// one fd does: the first read's outcome, then the second's text.
async fn clone_twice(view: &Nsd, text: &str) -> (Result<Vec<u8>>, String) {
    let (_, root) = view.attach("", "", 0).await.unwrap();
    let (_, fid) = view.walk(&root, &["clone".into()]).await.unwrap();
    let mut fid = fid.unwrap();
    view.open(&mut fid, 2).await.unwrap();
    view.write(&mut fid, 0, text.as_bytes()).await.unwrap();
    let at = text.len() as u64;
    let first = view.read(&mut fid, at, 4096).await;
    let then = view.read(&mut fid, at, 4096).await.unwrap();
    (first, String::from_utf8(then).unwrap())
}

async fn listing(view: &Nsd) -> Vec<String> {
    let (_, root) = view.attach("", "", 0).await.unwrap();
    let (_, fid) = view.walk(&root, &[]).await.unwrap();
    let mut fid = fid.unwrap();
    view.readdir(&mut fid, 0, 4096)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect()
}

/// A namespace's own /ns: its `clone` narrows (2 tools cannot make 3, refused whole with
/// EPERM), and it lists only its descendants, grandchildren included; the operator lists all.
#[tokio::test]
async fn a_namespaces_own_view_narrows_and_shows_its_subtree_only() {
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let parent = spec::parse("<t>", "mount tool /tool echo fs_read\nmount ns /ns\n").unwrap();
    let (pid, _) = nsd.add_space(parent, Info::default()).unwrap();
    let (other, _) = nsd.add_space(Spec::default(), Info::default()).unwrap();
    let view = nsd.scoped(pid).unwrap();
    assert_eq!(
        clone_in(&view, "mount tool /tool echo fs_read shell\n").await,
        Err(Errno::EPERM)
    );
    let child = clone_in(&view, "mount tool /tool echo\nmount ns /ns\n")
        .await
        .unwrap();
    let grand = clone_in(&nsd.scoped(child).unwrap(), "mount tool /tool echo\n")
        .await
        .unwrap();
    // The grandchild may not regain what its parent dropped.
    assert_eq!(
        clone_in(&nsd.scoped(child).unwrap(), "mount tool /tool fs_read\n").await,
        Err(Errno::EPERM)
    );
    assert_eq!(
        listing(&view).await,
        vec!["clone".to_string(), child.to_string(), grand.to_string()]
    );
    let (_, root) = view.attach("", "", 0).await.unwrap();
    for hidden in [pid, other] {
        assert!(view.walk(&root, &[hidden.to_string()]).await.is_err());
    }
    let all = listing(&nsd).await;
    for id in [pid, other, child, grand] {
        assert!(all.contains(&id.to_string()), "{all:?}");
    }
}

/// `cat /ns/clone`: a read-only open makes no namespace (nothing is listed after it) and its
/// read fails with EBADF, then says why; the read-write control makes one.
#[tokio::test]
async fn a_read_only_clone_makes_nothing() {
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let (_, root) = nsd.attach("", "", 0).await.unwrap();
    let (_, fid) = nsd.walk(&root, &["clone".into()]).await.unwrap();
    let mut fid = fid.unwrap();
    nsd.open(&mut fid, warren_9p::oflags::RDONLY).await.unwrap();
    assert_eq!(nsd.read(&mut fid, 0, 4096).await, Err(Errno::EBADF));
    let why = String::from_utf8(nsd.read(&mut fid, 0, 4096).await.unwrap()).unwrap();
    assert!(
        why.starts_with("error: clone was opened read-only"),
        "{why}"
    );
    nsd.clunk(fid).await;
    assert_eq!(listing(&nsd).await, vec!["clone".to_string()]);
    let id = clone_in(&nsd, "").await.unwrap();
    assert_eq!(
        listing(&nsd).await,
        vec!["clone".to_string(), id.to_string()]
    );
}

/// A refused clone fails its first read with the errno and then answers why, on one line,
/// from o₀ (a shell reads on at its write's end); a parse error too. An accepted one answers
/// its id from the write's end as well.
#[tokio::test]
async fn a_refused_clone_says_why_on_the_next_read() {
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let parent = spec::parse("<t>", "mount tool /tool echo\nmount ns /ns\n").unwrap();
    let (pid, _) = nsd.add_space(parent, Info::default()).unwrap();
    let view = nsd.scoped(pid).unwrap();
    let (first, why) = clone_twice(&view, "mount tool /tool echo shell\nnet loopback\n").await;
    assert_eq!(first, Err(Errno::EPERM));
    assert_eq!(
        why,
        "error: refused: widens: tool `shell` is not granted to the parent; \
         mount of `tool` at /tool is not one of the parent's (same server, same key, a \
         subset of its spec); net Loopback is wider than the parent's net None\n"
    );
    let (first, why) = clone_twice(&view, "bind -q /x /y\n").await;
    assert_eq!(first, Err(Errno::EINVAL));
    assert!(why.starts_with("error: invalid spec: line 1:"), "{why}");
    assert_eq!(why.lines().count(), 1, "{why}");
    let (first, id) = clone_twice(&view, "mount tool /tool echo\n").await;
    let first = String::from_utf8(first.unwrap()).unwrap();
    assert_eq!(first, id, "later reads from o₀ answer the same");
    assert!(
        first.trim().parse::<u64>().is_ok_and(|n| n > pid),
        "{first}"
    );
    assert!(first.ends_with('\n'));
}

/// `limit clones=N` counts the live namespaces of a subtree, grandchildren included, at every
/// ancestor: one more is refused with EAGAIN and a `budget:clones` reason; a child may not
/// ask for more than its parent has; an ended clone frees its place.
#[tokio::test]
async fn live_clones_are_counted_per_subtree() {
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let text = "mount tool /tool echo\nmount ns /ns\nlimit clones=2\n";
    let (pid, _) = nsd
        .add_space(spec::parse("<t>", text).unwrap(), Info::default())
        .unwrap();
    let view = nsd.scoped(pid).unwrap();
    let child = clone_in(&view, "mount tool /tool echo\nmount ns /ns\n")
        .await
        .unwrap();
    let grand = clone_in(&nsd.scoped(child).unwrap(), "mount tool /tool echo\n")
        .await
        .unwrap();
    let (first, why) = clone_twice(&view, "mount tool /tool echo\n").await;
    assert_eq!(first, Err(Errno(libc::EAGAIN as u32)));
    assert_eq!(
        why,
        format!(
            "error: refused: budget:clones: namespace {pid} has 2 live clone(s) in its \
             subtree (limit clones=2)\n"
        )
    );
    // The grandchild's clone counts against the grandparent's budget too.
    assert_eq!(
        clone_in(&nsd.scoped(child).unwrap(), "mount tool /tool echo\n").await,
        Err(Errno(libc::EAGAIN as u32))
    );
    assert_eq!(
        clone_in(&view, "mount tool /tool echo\nlimit clones=3\n").await,
        Err(Errno::EPERM),
        "more than the parent's is widening"
    );
    nsd.space(grand).unwrap().set_ended(Status::Exited(0));
    assert!(clone_in(&view, "mount tool /tool echo\n").await.is_ok());
}

/// When a namespace ends, its subtree ends: a clone not yet run (and its own clone) fails
/// and can never be run, and the ended namespace's `/ns/clone` makes nothing (ESRCH).
#[tokio::test]
async fn a_namespaces_subtree_ends_with_it() {
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let text = "mount tool /tool echo\nmount ns /ns\n";
    let (pid, parent) = nsd
        .add_space(spec::parse("<t>", text).unwrap(), Info::default())
        .unwrap();
    let view = nsd.scoped(pid).unwrap();
    let child = clone_in(&view, text).await.unwrap();
    let grand = clone_in(&nsd.scoped(child).unwrap(), "mount tool /tool echo\n")
        .await
        .unwrap();
    parent.set_ended(Status::Exited(0));
    for id in [child, grand] {
        assert_eq!(
            *nsd.space(id).unwrap().status.borrow(),
            Status::Failed("its parent namespace ended".into()),
            "namespace {id}"
        );
        assert_eq!(nsd.ctl(id, "run /bin/true").await, Err(Errno::EBUSY));
    }
    assert_eq!(
        clone_in(&view, "mount tool /tool echo\n").await,
        Err(Errno(libc::ESRCH as u32))
    );
}

/// A worker is placed by the namespace it works for: none for an id nsd does not have (the
/// operator's own connection), refused for one that does not run yet or names another
/// session.
#[test]
fn a_worker_is_placed_by_its_running_namespace_only() {
    use crate::worker::WorkerScopes;
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let (id, space) = nsd
        .add_space(
            spec::parse("<t>", "mount tool /tool shell\n").unwrap(),
            Info::default(),
        )
        .unwrap();
    let session = "0".repeat(32);
    assert_eq!(nsd.worker_scope("operator", &session, "shell"), Ok(None));
    assert_eq!(nsd.worker_scope("999", &session, "shell"), Ok(None));
    let not_running = nsd
        .worker_scope(&id.to_string(), &session, "shell")
        .unwrap_err();
    assert!(not_running.contains("not running"), "{not_running}");
    space.info().session = Some("1".repeat(32));
    let other = nsd
        .worker_scope(&id.to_string(), &session, "shell")
        .unwrap_err();
    assert!(other.contains("another session"), "{other}");
}

/// A non-root operator's `/ns/clone` may not bind what they cannot reach on the host (nsd
/// builds as root): EACCES, then the reason naming the path; the same spec from root is
/// accepted (the control).
#[tokio::test]
async fn an_operators_clone_binds_only_what_they_can_reach() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test builds as root and needs root (scripts/test runs as root)"
    );
    let fixture = crate::reach::Fixture::new();
    let inner = fixture.path("private/inner");
    let text = format!("bind -r {inner} /p\n");
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let (first, why) = clone_twice(&nsd.for_operator(65534), &text).await;
    assert_eq!(first, Err(Errno::EACCES));
    let expected = format!("error: uid 65534 cannot reach bind `{inner}`");
    assert!(why.starts_with(&expected), "{why}");
    assert!(clone_in(&nsd, &text).await.is_ok(), "root may");
}

/// Runs `/bin/sh -c 'test "$(id -u):$(SCRIPT)" = 65534:hidden'` in namespace `id`
/// through `view`, and returns its end (`exited 0` when uid 65534 read `hidden`).
async fn run_in(view: &Nsd, id: u64, script: &str) -> String {
    run_sh(
        view,
        id,
        &format!("test \"$(id -u):$({script})\" = 65534:hidden"),
    )
    .await
}

/// What a clone needs to run `/bin/sh` (a clone gets only what its spec binds).
const SYSTEM: &str =
    "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";

/// Writes `line` to namespace `id`'s `ctl` through `view`.
async fn write_ctl(view: &Nsd, id: u64, line: &str) -> Result<()> {
    let (_, root) = view.attach("", "", 0).await?;
    let (_, ctl) = view.walk(&root, &[id.to_string(), "ctl".into()]).await?;
    let mut ctl = ctl.ok_or(Errno::ENOENT)?;
    view.open(&mut ctl, 1).await?;
    view.write(&mut ctl, 0, line.as_bytes()).await.map(|_| ())
}

/// Namespace `id`'s end, as its `wait` file reads once it has ended.
async fn wait_end(view: &Nsd, id: u64) -> String {
    let (_, root) = view.attach("", "", 0).await.unwrap();
    let (_, wait) = view
        .walk(&root, &[id.to_string(), "wait".into()])
        .await
        .unwrap();
    let mut wait = wait.unwrap();
    view.open(&mut wait, 0).await.unwrap();
    String::from_utf8(view.read(&mut wait, 0, 64).await.unwrap()).unwrap()
}

/// Runs `/bin/sh -c SCRIPT` (no `'` in it) in namespace `id` through `view`; its end.
async fn run_sh(view: &Nsd, id: u64, script: &str) -> String {
    write_ctl(view, id, &format!("run /bin/sh -c '{script}'"))
        .await
        .unwrap();
    wait_end(view, id).await
}

/// Found by an attack (another operator's handles): root clones a namespace through its `/ns/clone`
/// binding a directory under a 0700 root directory; nsd opens it as root and holds the
/// handle while the namespace is listed. Every operator's `/ns` lists every namespace and
/// `ctl` checks no owner, so uid 65534 (a `warren` group member) writes `run …` to its
/// `ctl`: the payload runs as uid 65534 and reads through root's handle what uid 65534
/// cannot reach by name (the control). `warren attach` refuses the same (owner check).
/// Held: the non-owner's `run` refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_runs_and_kills_only_their_own_namespaces() {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let fixture = crate::reach::Fixture::new();
    let inner = fixture.path("private/inner");
    std::fs::write(fixture.path("private/inner/secret"), "hidden").unwrap();
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let text = format!("{SYSTEM}bind -r {inner} /p\n");
    let operator = nsd.for_operator(65534);
    // The control: uid 65534 may not bind it itself.
    let (first, why) = clone_twice(&operator, &text).await;
    assert_eq!(first, Err(Errno::EACCES), "{why}");
    let roots = clone_in(&nsd, &text).await.unwrap();
    let run = "run /bin/sh -c 'test \"$(id -u):$(cat /p/secret)\" = 65534:hidden'";
    let end = match write_ctl(&operator, roots, run).await {
        Ok(()) => wait_end(&operator, roots).await,
        Err(e) => format!("refused: {e:?}"),
    };
    assert!(
        end.starts_with("refused"),
        "uid 65534 ran root's namespace {roots}: {end:?} (exited 0: it read root's handle)"
    );
}

/// Found by an attack (another namespace's view through /proc): `open_as` opens a non-root operator's
/// words on a thread with their fsuid, but the thread keeps nsd's CAP_SYS_PTRACE, so
/// `/proc/PID/root` of any process — a running namespace's holder, whose pid `info` shows —
/// is theirs to follow. Inside that namespace root's bind of a directory under a 0700 root
/// directory sits at `/p`, with no 0700 directory above it: the guard's walk up from the
/// handle passes, and uid 65534's spec is accepted as reachable. (Its build then fails only
/// because that mount is not in nsd's own mountinfo, when the bind's filesystem type is
/// looked up: an accident, not the check.) The same path by its host name is refused (the
/// control). Held: refused (EACCES) when the spec is taken in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_root_operator_never_binds_through_proc() {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let fixture = crate::reach::Fixture::new();
    let inner = fixture.path("private/inner");
    std::fs::write(fixture.path("private/inner/secret"), "hidden").unwrap();
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let operator = nsd.for_operator(65534);
    // The control: uid 65534 may not bind it by name.
    let (first, why) = clone_twice(&operator, &format!("{SYSTEM}bind -r {inner} /p\n")).await;
    assert_eq!(first, Err(Errno::EACCES), "{why}");
    // Root's namespace, running.
    let roots = clone_in(&nsd, &format!("{SYSTEM}bind -r {inner} /p\n"))
        .await
        .unwrap();
    write_ctl(&nsd, roots, "run /bin/sleep 60").await.unwrap();
    let holder = match *nsd.find_space(roots).unwrap().status.borrow() {
        Status::Running { holder } => holder,
        ref other => panic!("{other:?}"),
    };
    let via = format!("/proc/{holder}/root/p");
    let (first, why) = clone_twice(&operator, &format!("{SYSTEM}bind -r {via} /x\n")).await;
    let end = match first {
        Ok(id) => {
            let id: u64 = String::from_utf8_lossy(&id).trim().parse().unwrap();
            let run = "run /bin/sh -c 'test \"$(id -u):$(cat /x/secret)\" = 65534:hidden'";
            match write_ctl(&operator, id, run).await {
                Ok(()) => {
                    let mut rx = nsd.find_space(id).unwrap().status.subscribe();
                    rx.wait_for(Status::is_final).await.unwrap().line()
                }
                Err(_) => format!(
                    "accepted (uid 65534 reached it), then failed to build: {:?}",
                    nsd.find_space(id).unwrap().status.borrow().line()
                ),
            }
        }
        Err(_) => why,
    };
    let _ = nsd.find_space(roots).unwrap().running().unwrap().kill();
    assert!(
        end.starts_with("error: uid 65534 cannot reach"),
        "uid 65534 reached root's {inner} as {via}: {end:?}"
    );
}

/// Found by an attack (descriptor exhaustion): every accepted clone holds one descriptor per bind
/// source and tool root for as long as it is listed, clones stay listed, a spec may repeat
/// a bind (64 KiB of `bind -r /d /x` lines is thousands), and nothing bounds how many a
/// namespace makes. A confined namespace with `mount ns` clones a few such children and nsd
/// runs out of descriptors: root's own `/ns/clone` then fails (EMFILE), as would every
/// operator's `warren run`. Held: the namespace's clones refused past a bound, and the
/// operator still served.
/// (Before the bounds it exhausted the test process's own descriptors; with them it holds
/// at most a subtree's budget.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaces_clones_cannot_exhaust_nsds_descriptors() {
    let fixture = crate::reach::Fixture::new();
    let open = fixture.path("open");
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let parent = clone_in(&nsd, &format!("bind -r {open} /d\n"))
        .await
        .unwrap();
    let inside = nsd.scoped(parent).unwrap();
    // `bind -r /d /xN` for as many N as fit in one spec, then fewer, until none fits.
    let spec_of = |n: usize| -> String { (0..n).map(|i| format!("bind -r /d /x{i}\n")).collect() };
    let mut binds = 0;
    while spec_of(binds + 1).len() <= MAX_SPEC {
        binds += 1;
    }
    let (mut made, mut held) = (0, 0);
    let mut size = binds;
    while size > 0 {
        if clone_in(&inside, &spec_of(size)).await.is_ok() {
            made += 1;
            held += size;
        } else {
            size /= 2;
        }
    }
    // An operator's everyday spec (four binds).
    let operator = clone_twice(&nsd, SYSTEM).await;
    assert!(
        operator.0.is_ok(),
        "after the namespace made {made} clones holding {held} descriptors (up to {binds} each), root's /ns/clone failed: {operator:?}"
    );
}

/// Found by an attack end to end (nested read-only bind): root's namespace has `bind -w PROJ /p` and
/// `bind -r PROJ/ro /p/ro` and `mount ns`; its payload cannot write `/p/ro` (the control),
/// but clones a child with `bind -w /p/ro /x` from its own `/ns`, runs it, and the child
/// writes the host's `PROJ/ro`. Held: the clone refused (EPERM, `-w where`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_never_writes_beneath_its_parents_read_only_bind() {
    use std::os::unix::fs::PermissionsExt;
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let fixture = crate::reach::Fixture::new();
    let proj = fixture.path("open");
    std::fs::create_dir_all(fixture.path("open/ro")).unwrap();
    for d in ["open", "open/ro"] {
        std::fs::set_permissions(fixture.path(d), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let parent_text = format!("{SYSTEM}bind -w {proj} /p\nbind -r {proj}/ro /p/ro\n");
    // The control: a namespace with that spec cannot write /p/ro, and can write /p.
    let control = clone_in(&nsd, &parent_text).await.unwrap();
    assert_eq!(
        run_sh(&nsd, control, "touch /p/ok && ! touch /p/ro/control").await,
        "exited 0\n"
    );
    assert!(!std::path::Path::new(&fixture.path("open/ro/control")).exists());
    let parent = clone_in(&nsd, &parent_text).await.unwrap();
    let inside = nsd.scoped(parent).unwrap();
    let child = format!("{SYSTEM}bind -w /p/ro /x\n");
    let (first, why) = clone_twice(&inside, &child).await;
    if let Ok(id) = &first {
        let id: u64 = String::from_utf8_lossy(id).trim().parse().unwrap();
        let end = run_sh(&inside, id, "touch /x/written-by-the-child").await;
        assert!(
            !std::path::Path::new(&fixture.path("open/ro/written-by-the-child")).exists(),
            "the child wrote beneath its parent's read-only bind ({end:?})"
        );
    }
    assert_eq!(first, Err(Errno::EPERM), "{why}");
}

/// Found by an attack (non-root operator, clone from inside): a namespace a non-root operator started
/// clones a child from its own `/ns`, naming a directory beneath its bind that the operator
/// cannot reach on the host (under a root-owned 0700 directory). `narrow` opens it beneath
/// the parent's handle with nsd's own (root) credentials, so the child is accepted, built
/// from a handle the operator could never have opened, and its payload (running as the
/// operator's uid) reads the file. The same path through the operator's own `/ns/clone` is
/// refused (the control). Held: the child refused (EACCES), as the operator's is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_root_operators_child_reaches_only_what_they_can() {
    use std::os::unix::fs::PermissionsExt;
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let fixture = crate::reach::Fixture::new();
    let open = fixture.path("open");
    std::fs::create_dir_all(fixture.path("open/locked/inner")).unwrap();
    std::fs::write(fixture.path("open/locked/inner/secret"), "hidden").unwrap();
    std::fs::set_permissions(
        fixture.path("open/locked"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let operator = nsd.for_operator(65534);
    // The control: the operator may not name it directly.
    let (first, why) = clone_twice(
        &operator,
        &format!("bind -r {} /p\n", fixture.path("open/locked/inner")),
    )
    .await;
    assert_eq!(first, Err(Errno::EACCES), "{why}");
    // The operator's namespace binds what they can reach, and clones from inside.
    let parent = clone_in(
        &operator,
        &format!("{SYSTEM}bind -r {open} /o\nmount tool /tool fs_read\ntool fs_read -r {open}\n"),
    )
    .await
    .unwrap();
    let inside = nsd.scoped(parent).unwrap();
    let mut accepted = Vec::new();
    let tool_child = format!("mount tool /tool fs_read\ntool fs_read -r {open}/locked/inner\n");
    if clone_twice(&inside, &tool_child).await.0.is_ok() {
        accepted.push(tool_child);
    }
    let bind_child = format!("{SYSTEM}bind -r /o/locked/inner /p\n");
    if let Ok(id) = clone_in(&inside, &bind_child).await {
        // Run it: its payload runs as uid 65534 and reads the file through the bind.
        let end = run_in(&inside, id, "cat /p/secret").await;
        accepted.push(format!(
            "{bind_child} (ran as uid 65534 and read the secret: {end:?})"
        ));
    }
    // The control: a namespace with the parent's bind (uid 65534) cannot read it there.
    let sibling = clone_in(&operator, &format!("{SYSTEM}bind -r {open} /o\n"))
        .await
        .unwrap();
    assert_eq!(
        run_in(&operator, sibling, "cat /o/locked/inner/secret").await,
        "exited 1\n"
    );
    assert!(
        accepted.is_empty(),
        "children of uid 65534's namespace built from paths uid 65534 cannot reach: {accepted:#?}"
    );
}

/// A file read in pieces is one version of it: the read at offset 0 takes the text, later
/// offsets continue that text even if the namespace changed in between.
#[tokio::test]
async fn a_file_read_in_pieces_is_one_version() {
    let nsd = Nsd::new(RunOptions::default()).unwrap();
    let spec = spec::parse("<t>", "mount tool /tool echo\n").unwrap();
    let info = Info {
        origin: "run",
        launcher_pid: Some(42),
        ..Info::default()
    };
    let (id, space) = nsd.add_space(spec, info).unwrap();
    let (_, root) = nsd.attach("", "", 0).await.unwrap();
    let (_, fid) = nsd
        .walk(&root, &[id.to_string(), "info".into()])
        .await
        .unwrap();
    let mut fid = fid.unwrap();
    let first = nsd.read(&mut fid, 0, 10).await.unwrap();
    space.info().argv = vec!["a-much-longer-command-line".into()];
    let mut whole = first;
    loop {
        let more = nsd.read(&mut fid, whole.len() as u64, 10).await.unwrap();
        if more.is_empty() {
            break;
        }
        whole.extend(more);
    }
    let text = String::from_utf8(whole).unwrap();
    assert_eq!(
        text,
        "origin run\noperator 0\nlauncher 42\nmount tool /tool\ntool echo\n"
    );
    // A new read from 0 sees the change.
    let again = nsd.read(&mut fid, 0, 4096).await.unwrap();
    assert!(
        String::from_utf8(again)
            .unwrap()
            .contains("argv a-much-longer")
    );
}
