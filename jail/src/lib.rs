//! warren-jail: every raw syscall, `unsafe` block and credential change in warren. The rest of
//! the workspace asks this crate for a confined process, a dropped privilege or a handle opened
//! beneath a directory, and builds on the file descriptors it returns. The setup steps and their
//! reasons are `docs/confinement.md`.

pub mod binds;
pub mod fds;
pub mod fuse;
pub mod init;
pub mod inode;
pub mod landlock;
pub mod loopback;
pub mod mount_api;
pub mod mounts;
pub mod openat2;
pub mod plan;
pub mod process;
pub mod seccomp;
pub mod setup;
pub mod step;
mod syscall_ret;
pub mod tty;

pub use openat2::{Dir, openat2};
pub use setup::{SetupError, Step};
