//! Owned descriptors registered with the tokio reactor.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// `fd` registered with the current tokio reactor for `interest` (call inside a runtime). The
/// `AsyncFd` owns it, so it stays open, and the same file, for the registration's life.
pub fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` owns one open descriptor and its `as_raw_fd` always returns that
    // descriptor; the `AsyncFd` owns the `OwnedFd` until it is dropped or taken back, so the fd
    // stays open and refers to the same file description for the registration's whole lifetime.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(io::Error::from)
}
