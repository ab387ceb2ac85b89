//! Encoding replies: `fuse_out_header` + body, and `fuse_dirent` packing for READDIR.

use polyfuse_kernel as abi;
use warren_9p::Errno;
use zerocopy::{Immutable, IntoBytes};

/// The body of a successful reply.
pub(crate) type Body = Vec<u8>;

/// The bytes of a struct reply body.
pub(crate) fn body<T: IntoBytes + Immutable>(value: &T) -> Body {
    value.as_bytes().to_vec()
}

/// The errno the kernel will take: it refuses anything outside 1..512 (the reply write fails
/// with EINVAL and the caller would hang until the request is aborted), and ENOSYS would make
/// the kernel turn the operation off for the whole connection, so a server's ENOSYS becomes
/// EOPNOTSUPP. The bridge's own ENOSYS answers (unsupported opcodes) bypass this.
pub(crate) fn wire_errno(e: Errno) -> i32 {
    match e.0 as i32 {
        libc::ENOSYS => libc::EOPNOTSUPP,
        n if (1..512).contains(&n) => n,
        _ => libc::EIO,
    }
}

/// One whole reply: header (len, -errno, unique) followed by the body.
pub(crate) fn frame(unique: u64, result: Result<&[u8], i32>) -> Vec<u8> {
    let (error, body): (i32, &[u8]) = match result {
        Ok(body) => (0, body),
        Err(errno) => (-errno, &[]),
    };
    let header = abi::fuse_out_header {
        len: (size_of::<abi::fuse_out_header>() + body.len()) as u32,
        error,
        unique,
    };
    let mut out = Vec::with_capacity(header.len as usize);
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(body);
    out
}

/// A notification to the kernel: unique 0, and the notify code where a reply has its error.
pub(crate) fn notification(code: u32, body: &[u8]) -> Vec<u8> {
    let mut out = frame(0, Ok(body));
    out[4..8].copy_from_slice(&(code as i32).to_ne_bytes());
    out
}

/// Packs `fuse_dirent`s (8-byte aligned records) into at most `limit` bytes.
pub(crate) struct DirentBuf {
    buf: Vec<u8>,
    limit: usize,
}

impl DirentBuf {
    pub(crate) fn new(limit: usize) -> DirentBuf {
        DirentBuf {
            buf: Vec::with_capacity(limit.min(64 * 1024)),
            limit,
        }
    }

    /// Adds one entry; false (and nothing added) when it does not fit. `off` is the cookie the
    /// kernel sends back to continue after this entry.
    pub(crate) fn push(&mut self, ino: u64, off: u64, typ: u32, name: &[u8]) -> bool {
        let head = abi::fuse_dirent {
            ino,
            off,
            namelen: name.len() as u32,
            typ,
            name: [],
        };
        let unpadded = size_of::<abi::fuse_dirent>() + name.len();
        let padded = unpadded.next_multiple_of(8);
        if self.buf.len() + padded > self.limit {
            return false;
        }
        self.buf.extend_from_slice(head.as_bytes());
        self.buf.extend_from_slice(name);
        self.buf.resize(self.buf.len() + padded - unpadded, 0);
        true
    }

    pub(crate) fn into_body(self) -> Body {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_replies_are_a_bare_header_with_a_negative_errno() {
        let bytes = frame(77, Err(libc::EINTR));
        assert_eq!(bytes.len(), 16);
        assert_eq!(u32::from_ne_bytes(bytes[0..4].try_into().unwrap()), 16);
        assert_eq!(
            i32::from_ne_bytes(bytes[4..8].try_into().unwrap()),
            -libc::EINTR
        );
        assert_eq!(u64::from_ne_bytes(bytes[8..16].try_into().unwrap()), 77);
    }

    #[test]
    fn server_errnos_the_kernel_would_refuse_become_eio() {
        assert_eq!(wire_errno(Errno(0)), libc::EIO);
        assert_eq!(wire_errno(Errno(600)), libc::EIO);
        assert_eq!(wire_errno(Errno::ENOSYS), libc::EOPNOTSUPP);
        assert_eq!(wire_errno(Errno::ENOENT), libc::ENOENT);
    }

    #[test]
    fn dirents_are_padded_to_eight_bytes_and_capped() {
        let mut d = DirentBuf::new(64);
        assert!(d.push(1, 1, 8, b"call")); // 24 + 4 -> 32
        assert!(d.push(2, 2, 4, b"tools")); // 24 + 5 -> 32
        assert!(!d.push(3, 3, 8, b"x"));
        let body = d.into_body();
        assert_eq!(body.len(), 64);
        assert_eq!(&body[24..28], b"call");
        assert_eq!(&body[28..32], &[0, 0, 0, 0]);
    }
}
