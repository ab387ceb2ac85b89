//! A spec's binds, checked against warren's own directories and prepared by warren-jail
//! (`jail/src/binds.rs`: the clone, its attributes, the kernel-interface refusals).

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

pub use warren_jail::binds::PreparedBind;
use warren_jail::binds::{BindSource, prepare as prepare_source};
use warren_jail::inode::open_path;

use super::guard::Guard;
use crate::spec::{Access, Bind};

/// Opens, checks and clones one bind source.
pub fn prepare(bind: &Bind, guard: &Guard) -> Result<PreparedBind, String> {
    let shown = bind.host.as_str();
    let fd = open_path(Path::new(shown)).map_err(|e| format!("bind source `{shown}`: {e}"))?;
    prepare_handle(fd.as_fd(), bind, guard)
}

/// Checks and clones a bind source that is already open (`bind.host` only names it in
/// messages): what is checked is what gets bound, never re-resolved by name.
pub fn prepare_handle(
    fd: BorrowedFd<'_>,
    bind: &Bind,
    guard: &Guard,
) -> Result<PreparedBind, String> {
    guard.check(fd, &bind.host)?;
    prepare_source(
        fd,
        &BindSource {
            shown: &bind.host,
            path: &bind.path,
            writable: bind.access == Access::Write,
            recursive: bind.recursive,
        },
    )
}
