//! The host features a test needs. Each check fails the test naming the feature: on a host
//! without it, `scripts/test` leaves the tests that need it out by a nextest filter, so they
//! are counted as skipped (with the reason printed), never as passed; run by hand there, they
//! fail, by name. A test never prints "skip" and returns.

use std::path::Path;

/// Root: the tests that build namespaces, mount FUSE or change uids.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (namespaces, FUSE mounts, uid changes): scripts/test runs as root"
    );
}

/// FUSE (`/dev/fuse`): every test of a binary that calls this is in scripts/test's FUSE filter.
pub fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "this kernel has no FUSE (/dev/fuse is missing): scripts/test skips this test on such a host"
    );
}
