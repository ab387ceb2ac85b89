//! Directories for the tests of warren's own directory checks.

use std::os::unix::fs::PermissionsExt;

/// A temp directory with `mode`, as another user's world-writable /tmp would be (the tests
/// that use it run as root, as CI does, so they can hand parts of it to other uids).
pub fn with_mode(mode: u32) -> tempfile::TempDir {
    crate::kernel::require_root();
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    t
}
