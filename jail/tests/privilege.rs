//! The one privilege drop, in a real child: started by a root process that holds supplementary
//! groups and every capability, the child must come out with exactly the target's ids and
//! groups, no capability in any set, no_new_privs, and no way back.

use std::process::Command;

use nix::unistd::{Gid, setgroups};
use warren_jail::child::BeforeExec;
use warren_jail::privilege::{DropStep, Identity, drop_to};

/// `field:` of a `/proc/<pid>/status` text, whitespace-normalised.
fn field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `/proc/self/status` of `cat`, run as `who` from this process.
fn status_after_drop(who: Identity) -> String {
    // The parent holds groups the child must not keep (this test process is its own under
    // nextest; under `cargo test` the other tests only gain groups they never look at).
    setgroups(&[Gid::from_raw(4), Gid::from_raw(27)]).expect("setgroups: the test runs as root");
    let mut cmd = Command::new("/bin/cat");
    cmd.arg("/proc/self/status");
    BeforeExec::new().drop_to(who).install(&mut cmd);
    let out = cmd.output().expect("spawn cat with the drop");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_dropped_child_holds_exactly_the_targets_ids_and_groups_and_nothing_else() {
    let status = status_after_drop(Identity::new(65534, 65533));
    assert_eq!(field(&status, "Uid"), "65534 65534 65534 65534");
    assert_eq!(field(&status, "Gid"), "65533 65533 65533 65533");
    assert_eq!(
        field(&status, "Groups"),
        "",
        "supplementary groups survived the drop"
    );
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(&status, set), "0000000000000000", "{set}");
    }
    assert_eq!(field(&status, "NoNewPrivs"), "1");
}

#[test]
fn a_dropped_child_holds_the_groups_it_was_given() {
    let status = status_after_drop(Identity::new(65534, 65534).with_groups([100, 65533]));
    assert_eq!(field(&status, "Groups"), "100 65533");
}

#[test]
fn uid_or_gid_zero_is_refused_before_anything_changes() {
    for who in [Identity::new(0, 5), Identity::new(5, 0)] {
        let e = drop_to(&who).unwrap_err();
        assert_eq!(e.step, DropStep::Target, "{e}");
    }
    assert!(nix::unistd::geteuid().is_root());
}

/// A process still at uid 0 that cannot set its groups (no CAP_SETGID in its effective set, say
/// a unit's capability bounding set without it) must not come out of the drop with root's
/// supplementary groups: either the drop fails, or the groups are gone. Only a process that is
/// not root any more may keep the groups it cannot change (it cannot gain any either).
#[test]
fn root_without_cap_setgid_does_not_keep_its_groups_through_the_drop() {
    setgroups(&[Gid::from_raw(0), Gid::from_raw(4)]).expect("setgroups: the test runs as root");
    let mut cmd = Command::new("/bin/cat");
    cmd.arg("/proc/self/status");
    // SAFETY: runs in the forked child before exec and makes syscalls only (setresgid,
    // capget/capset): the state a root process without CAP_SETGID starts the drop in (its gid
    // already the target's, so setresgid itself needs no capability).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let g = Gid::from_raw(65533);
            nix::unistd::setresgid(g, g, g)?;
            caps::drop(None, caps::CapSet::Effective, caps::Capability::CAP_SETGID)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            Ok(())
        });
    }
    BeforeExec::new()
        .drop_to(Identity::new(65534, 65533))
        .install(&mut cmd);
    match cmd.output() {
        // Refused at setgroups (the errno is all a failed pre_exec carries back): fail closed.
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
        Ok(out) => {
            assert!(out.status.success(), "{out:?}");
            let status = String::from_utf8(out.stdout).unwrap();
            assert_eq!(field(&status, "Uid"), "65534 65534 65534 65534");
            assert_eq!(
                field(&status, "Groups"),
                "",
                "root's supplementary groups survived a drop that reported success"
            );
        }
    }
}
