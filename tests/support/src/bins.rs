//! The workspace's built binaries, found one way.
//!
//! A test finds a binary of the workspace in the profile directory it was itself built into
//! (`target/<profile>/`; a test binary runs from its `deps/`). Cargo's `CARGO_BIN_EXE_<name>`
//! names only the binaries of the test's own package, and nextest builds only those; the
//! daemons a test starts are mostly other packages', so `scripts/test` runs `cargo build
//! --workspace --bins` first, and a missing binary fails the test saying that. No test runs
//! cargo itself (docs/decisions.md D34 "One way for tests to find the workspace's binaries").

use std::path::{Path, PathBuf};

/// The directory holding the workspace's binaries in the running test's profile.
fn dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the running test's path");
    let parent = exe.parent().expect("the test binary has a directory");
    if parent.file_name().is_some_and(|n| n == "deps") {
        parent.parent().unwrap_or(parent).to_path_buf()
    } else {
        parent.to_path_buf()
    }
}

/// The workspace's binary `name`; fails, saying how to build it, when it is missing.
pub fn bin(name: &str) -> PathBuf {
    let path = dir().join(name);
    require(&path);
    path
}

fn require(path: &Path) {
    assert!(
        path.is_file(),
        "{} is missing: build the workspace's binaries first (`cargo build --workspace --bins`; \
         scripts/test does)",
        path.display()
    );
}
