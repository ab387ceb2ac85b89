//! Terminals: the namespace's own pty pair, its controlling terminal, window sizes.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::syscall_ret::{check, owned};

/// Opens the namespace's own pty pair: the master from `ptmx` (a path in the current root),
/// unlocked, and the slave straight from it with TIOCGPTPEER (no path lookup, no race).
pub fn open_pty(ptmx: &CStr) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: NUL-terminated path and flags; returns a new fd.
    let master = owned(unsafe {
        libc::open(
            ptmx.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ) as libc::c_long
    })?;
    // SAFETY: valid master fd; unlockpt only issues TIOCSPTLCK on it.
    check(unsafe { libc::unlockpt(master.as_raw_fd()) } as libc::c_long)?;
    // SAFETY: valid master fd, TIOCGPTPEER takes open flags by value; returns a new fd.
    let slave = owned(unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ) as libc::c_long
    })?;
    Ok((master, slave))
}

/// In the payload: a new session whose controlling terminal is `tty`.
pub fn take_controlling_tty(tty: BorrowedFd<'_>) -> io::Result<()> {
    nix::unistd::setsid()?;
    // SAFETY: valid tty fd; TIOCSCTTY takes an int argument (0: do not steal).
    check(unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSCTTY, 0) } as libc::c_long)?;
    Ok(())
}

/// A terminal's window size (TIOCGWINSZ): rows, columns, x pixels, y pixels.
pub fn get_winsize(tty: BorrowedFd<'_>) -> io::Result<[u16; 4]> {
    // SAFETY: winsize is plain data.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a pointer to a winsize, as TIOCGWINSZ expects.
    check(unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) } as libc::c_long)?;
    Ok([ws.ws_row, ws.ws_col, ws.ws_xpixel, ws.ws_ypixel])
}

/// Sets a terminal's window size (TIOCSWINSZ).
pub fn set_winsize(tty: BorrowedFd<'_>, size: [u16; 4]) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: size[0],
        ws_col: size[1],
        ws_xpixel: size[2],
        ws_ypixel: size[3],
    };
    // SAFETY: valid fd and a pointer to an initialised winsize, as TIOCSWINSZ expects.
    check(unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSWINSZ, &ws) } as libc::c_long)?;
    Ok(())
}
