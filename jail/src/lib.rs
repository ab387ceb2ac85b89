//! warren-jail: every raw syscall, `unsafe` block and credential change in warren. The rest of
//! the workspace asks this crate for a confined process, a dropped privilege or a handle opened
//! beneath a directory, and builds on the file descriptors it returns. The setup steps and their
//! reasons are `docs/confinement.md`.
