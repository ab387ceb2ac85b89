//! warren-jail: every raw syscall, `unsafe` block and credential change in warren. The rest of
//! the workspace asks this crate for a confined process, a dropped privilege or a handle opened
//! beneath a directory, and builds on the file descriptors it returns. The setup steps and their
//! reasons are `docs/confinement.md`.

pub mod child;
pub mod environment;
pub mod fd_passing;
pub mod inherited;
pub mod kernel_features;
pub mod pid1;
pub mod privilege;
pub mod reactor;
pub mod thread_creds;
