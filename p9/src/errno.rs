//! Errors as 9P2000.L carries them: a Linux errno in Rlerror.

use std::fmt;

/// A Linux errno, as sent in Rlerror and as the client returns it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub u32);

pub type Result<T> = std::result::Result<T, Errno>;

macro_rules! consts {
    ($($name:ident),* $(,)?) => {
        impl Errno {
            $(pub const $name: Errno = Errno(libc::$name as u32);)*
        }
    };
}

consts!(
    EPERM,
    ENOENT,
    EINTR,
    EIO,
    EBADF,
    EAGAIN,
    ENOMEM,
    EACCES,
    EEXIST,
    ENOTDIR,
    EISDIR,
    EINVAL,
    EMFILE,
    EFBIG,
    ENOSPC,
    ESPIPE,
    EROFS,
    ERANGE,
    ENAMETOOLONG,
    ENOSYS,
    ENOTEMPTY,
    ELOOP,
    ENODATA,
    EPROTO,
    EMSGSIZE,
    EOPNOTSUPP,
    ECONNRESET,
    ENOBUFS,
    ENOTCONN,
    ETIMEDOUT,
    ECONNABORTED,
    ECANCELED,
    E2BIG,
    EBUSY,
    ENXIO,
    EPIPE,
);

impl Errno {
    /// The connection is gone (the server exited or restarted): what the client answers every
    /// request waiting on it, or made after it.
    pub fn connection_lost(self) -> bool {
        [
            Errno::ECONNRESET,
            Errno::ENOTCONN,
            Errno::EPIPE,
            Errno::ECONNABORTED,
        ]
        .contains(&self)
    }

    /// The errno of an I/O error, EIO when it has none.
    pub fn from_io(err: &std::io::Error) -> Errno {
        Errno(err.raw_os_error().map_or(libc::EIO as u32, |e| e as u32))
    }
}

impl From<std::io::Error> for Errno {
    fn from(err: std::io::Error) -> Errno {
        Errno::from_io(&err)
    }
}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.0 as i32)
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({}: {})", self.0, self)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&std::io::Error::from_raw_os_error(self.0 as i32), f)
    }
}

impl std::error::Error for Errno {}
