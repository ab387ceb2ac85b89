//! The 9P-mount hook: a `mount` line becomes a kernel FUSE mount made inside the namespace,
//! whose /dev/fuse fd reaches the launcher's MountServer (the bridge, when wired). Here the
//! server only records what it got and drops the fd, which aborts the connection: inside, the
//! mount is there and answers ENOTCONN at once (never a hang).

mod common;

use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use common::*;
use warren_ns::spec::Mount;
use warren_ns::{MountServer, RunOptions, parse, run};

#[derive(Default)]
struct Recorder {
    got: Mutex<Vec<(String, String)>>,
}

impl MountServer for Recorder {
    fn serve(&self, mount: &Mount, fuse: OwnedFd) -> io::Result<()> {
        let st = nix::sys::stat::fstat(&fuse)?;
        let what =
            if st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == libc::makedev(10, 229) {
                "/dev/fuse"
            } else {
                "something else"
            };
        self.got
            .lock()
            .unwrap()
            .push((mount.path.clone(), what.to_string()));
        Ok(())
    }
}

/// A world-writable output directory (the command runs unprivileged) and a spec that binds it
/// at /out, with the system directories and one `mount tool /tool TOOL` line.
fn out_dir_and_spec(prefix: &str, tool: &str) -> (tempfile::TempDir, warren_ns::Spec) {
    let out = tempdir(prefix);
    std::fs::set_permissions(
        out.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let o = out.path().display().to_string();
    let spec = parse(
        "fuse.ns",
        &format!(
            "bind -r /usr /usr\nbind -r /lib /lib\nbind -r /lib64 /lib64\nbind -r /bin /bin\n\
             bind -w {o} /out\nmount tool /tool {tool}\n"
        ),
    )
    .unwrap();
    (out, spec)
}

#[test]
fn mount_line_becomes_a_fuse_mount_handed_to_the_server() {
    need_root();
    warren_test_support::kernel::require_fuse();
    let (out, spec) = out_dir_and_spec("wfuse", "echo fs_read");
    let script = "grep ' /tool ' /proc/self/mountinfo > /out/mountinfo; ls /tool 2> /out/ls; echo done > /out/done";
    let recorder = Arc::new(Recorder::default());
    let opts = RunOptions {
        mount_server: Some(recorder.clone()),
        ..RunOptions::default()
    };
    let code = run(
        &spec,
        &["/bin/sh".into(), "-c".into(), script.into()],
        &opts,
    )
    .unwrap();
    assert_eq!(code, 0);
    let got = recorder.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "/tool");
    assert_eq!(got[0].1, "/dev/fuse", "the server got the /dev/fuse fd");
    let mi = std::fs::read_to_string(out.path().join("mountinfo")).unwrap();
    assert!(mi.contains(" - fuse "), "{mi}");
    assert!(mi.contains("nosuid,nodev"), "{mi}");
    let ls = std::fs::read_to_string(out.path().join("ls")).unwrap();
    assert!(ls.contains("Transport endpoint is not connected"), "{ls}");

    // Without a server, a mount line is refused up front.
    let err = run(&spec, &["/bin/true".into()], &RunOptions::default()).unwrap_err();
    assert!(err.to_string().contains("needs the FUSE bridge"), "{err}");
}

/// A server that cannot serve a mount refuses it.
struct Refuser;

impl MountServer for Refuser {
    fn serve(&self, mount: &Mount, _fuse: OwnedFd) -> io::Result<()> {
        Err(io::Error::other(format!("cannot serve {}", mount.path)))
    }
}

/// When a mount cannot be served the command never starts: pid 1 waits for the launcher's word
/// that every mount is served (before it waited for nothing, and the command ran while the
/// launcher was already reporting the failure).
#[test]
fn an_unserved_mount_means_the_command_never_runs() {
    need_root();
    warren_test_support::kernel::require_fuse();
    let (out, spec) = out_dir_and_spec("wfusr", "echo");
    let opts = RunOptions {
        mount_server: Some(Arc::new(Refuser)),
        ..RunOptions::default()
    };
    let err = run(
        &spec,
        &["/bin/sh".into(), "-c".into(), "echo ran > /out/ran".into()],
        &opts,
    )
    .unwrap_err();
    assert!(err.to_string().contains("cannot serve /tool"), "{err}");
    assert!(
        !out.path().join("ran").exists(),
        "the command ran although its mount was not served"
    );
}
