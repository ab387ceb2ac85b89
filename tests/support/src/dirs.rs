//! Temp directories: short ones for sockets, and ones with a given mode (the directory checks).

use std::os::unix::fs::PermissionsExt;

/// A temp directory with `mode`, as another user's world-writable /tmp would be (the tests
/// that use it run as root, as CI does, so they can hand parts of it to other uids).
pub fn with_mode(mode: u32) -> tempfile::TempDir {
    crate::kernel::require_root();
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    t
}

/// A temp directory under /tmp named `prefix…`, short enough for the sockets a test puts in it
/// (a socket path must fit in 108 bytes).
pub fn short(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("a temp dir under /tmp")
}
