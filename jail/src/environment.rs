//! This process's environment, changed only while nothing can read it concurrently.

use std::ffi::OsStr;
use std::io;

/// Sets `name=value` in this process's environment, refused unless the process has a single
/// thread (counted in `/proc/self/task`): another thread reading the environment while it
/// changes is undefined behaviour, and with one thread there is none to start one meanwhile.
pub fn set_var_single_threaded(name: &str, value: impl AsRef<OsStr>) -> io::Result<()> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(io::Error::other(format!(
            "refusing to set {name} in the environment of a process with {threads} threads"
        )));
    }
    // SAFETY: this process has one thread (checked above), the caller's: no other thread
    // exists to read or write the environment meanwhile.
    unsafe { std::env::set_var(name, value) };
    Ok(())
}
