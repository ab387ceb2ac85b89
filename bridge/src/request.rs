//! Decoding one FUSE request (`fuse_in_header` + the opcode's arguments, linux/fuse.h 7.31).

use polyfuse_kernel as abi;
use warren_9p::Errno;
use zerocopy::FromBytes;

/// One decoded request.
pub(crate) struct Request {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub op: Op,
}

/// The operations the bridge understands; everything else is `Unsupported` (answered ENOSYS).
pub(crate) enum Op {
    Init(abi::fuse_init_in),
    Destroy,
    Lookup {
        name: Vec<u8>,
    },
    Forget {
        nlookup: u64,
    },
    BatchForget(Vec<(u64, u64)>),
    Getattr,
    Setattr(abi::fuse_setattr_in),
    Open {
        flags: u32,
    },
    Opendir,
    Read {
        fh: u64,
        offset: u64,
        size: u32,
        /// Sent for a read(2) of a direct-I/O file (FUSE_READ_LOCKOWNER: the kernel names the
        /// reader); a page-cache read (splice, sendfile, mmap, readahead) has none.
        direct: bool,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        data: Vec<u8>,
    },
    Release {
        fh: u64,
    },
    Flush,
    Fsync {
        fh: u64,
    },
    Statfs,
    Create {
        name: Vec<u8>,
        flags: u32,
        mode: u32,
    },
    Mkdir {
        name: Vec<u8>,
        mode: u32,
    },
    Unlink {
        name: Vec<u8>,
    },
    Rmdir {
        name: Vec<u8>,
    },
    Getxattr,
    Listxattr {
        size: u32,
    },
    Setxattr {
        name: Vec<u8>,
    },
    Removexattr,
    Interrupt {
        target: u64,
    },
    /// Anything else (the opcode is in `Request::opcode`).
    Unsupported,
}

/// Why a buffer could not be decoded.
#[derive(Debug)]
pub(crate) enum DecodeError {
    /// Not even a header: nothing to answer.
    Header,
    /// A header whose length disagrees with the read, or bad arguments: answer `unique` EINVAL.
    Args { unique: u64 },
}

/// Decodes the bytes of one read(2) of /dev/fuse.
pub(crate) fn decode(buf: &[u8]) -> Result<Request, DecodeError> {
    let (header, _) =
        abi::fuse_in_header::read_from_prefix(buf).map_err(|_| DecodeError::Header)?;
    if header.len as usize != buf.len() {
        return Err(DecodeError::Args {
            unique: header.unique,
        });
    }
    let body = &buf[size_of::<abi::fuse_in_header>()..];
    let op = decode_op(header.opcode, body).map_err(|_| DecodeError::Args {
        unique: header.unique,
    })?;
    Ok(Request {
        opcode: header.opcode,
        unique: header.unique,
        nodeid: header.nodeid,
        op,
    })
}

fn decode_op(opcode: u32, body: &[u8]) -> Result<Op, Errno> {
    let mut args = Args(body);
    let op = match opcode {
        abi::FUSE_INIT => Op::Init(args.take()?),
        abi::FUSE_DESTROY => Op::Destroy,
        abi::FUSE_LOOKUP => Op::Lookup { name: args.name()? },
        abi::FUSE_FORGET => Op::Forget {
            nlookup: args.take::<abi::fuse_forget_in>()?.nlookup,
        },
        abi::FUSE_BATCH_FORGET => {
            let head: abi::fuse_batch_forget_in = args.take()?;
            let mut forgets = Vec::with_capacity(head.count.min(4096) as usize);
            for _ in 0..head.count {
                let one: abi::fuse_forget_one = args.take()?;
                forgets.push((one.nodeid, one.nlookup));
            }
            Op::BatchForget(forgets)
        }
        abi::FUSE_GETATTR => Op::Getattr,
        abi::FUSE_SETATTR => Op::Setattr(args.take()?),
        abi::FUSE_OPEN => Op::Open {
            flags: args.take::<abi::fuse_open_in>()?.flags,
        },
        abi::FUSE_OPENDIR => Op::Opendir,
        abi::FUSE_READ => {
            let r: abi::fuse_read_in = args.take()?;
            Op::Read {
                fh: r.fh,
                offset: r.offset,
                size: r.size,
                direct: r.read_flags & abi::FUSE_READ_LOCKOWNER != 0,
            }
        }
        abi::FUSE_READDIR => {
            let r: abi::fuse_read_in = args.take()?;
            Op::Readdir {
                fh: r.fh,
                offset: r.offset,
                size: r.size,
            }
        }
        abi::FUSE_WRITE => {
            let w: abi::fuse_write_in = args.take()?;
            let data = args.bytes(w.size as usize)?.to_vec();
            Op::Write {
                fh: w.fh,
                offset: w.offset,
                data,
            }
        }
        abi::FUSE_RELEASE | abi::FUSE_RELEASEDIR => Op::Release {
            fh: args.take::<abi::fuse_release_in>()?.fh,
        },
        abi::FUSE_FLUSH => Op::Flush,
        abi::FUSE_FSYNC | abi::FUSE_FSYNCDIR => Op::Fsync {
            fh: args.take::<abi::fuse_fsync_in>()?.fh,
        },
        abi::FUSE_STATFS => Op::Statfs,
        abi::FUSE_CREATE => {
            let c: abi::fuse_create_in = args.take()?;
            Op::Create {
                name: args.name()?,
                flags: c.flags,
                mode: c.mode,
            }
        }
        abi::FUSE_MKDIR => {
            let m: abi::fuse_mkdir_in = args.take()?;
            Op::Mkdir {
                name: args.name()?,
                mode: m.mode,
            }
        }
        abi::FUSE_UNLINK => Op::Unlink { name: args.name()? },
        abi::FUSE_RMDIR => Op::Rmdir { name: args.name()? },
        abi::FUSE_GETXATTR => Op::Getxattr,
        abi::FUSE_LISTXATTR => Op::Listxattr {
            size: args.take::<abi::fuse_getxattr_in>()?.size,
        },
        abi::FUSE_SETXATTR => {
            let _: abi::fuse_setxattr_in = args.take()?;
            Op::Setxattr { name: args.name()? }
        }
        abi::FUSE_REMOVEXATTR => Op::Removexattr,
        abi::FUSE_INTERRUPT => Op::Interrupt {
            target: args.take::<abi::fuse_interrupt_in>()?.unique,
        },
        _ => Op::Unsupported,
    };
    Ok(op)
}

/// A cursor over a request's argument bytes.
struct Args<'a>(&'a [u8]);

impl Args<'_> {
    fn take<T: FromBytes>(&mut self) -> Result<T, Errno> {
        let (value, rest) = T::read_from_prefix(self.0).map_err(|_| Errno::EINVAL)?;
        self.0 = rest;
        Ok(value)
    }

    fn bytes(&mut self, n: usize) -> Result<&[u8], Errno> {
        if self.0.len() < n {
            return Err(Errno::EINVAL);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    /// A NUL-terminated name (without its NUL).
    fn name(&mut self) -> Result<Vec<u8>, Errno> {
        let end = self.0.iter().position(|&b| b == 0).ok_or(Errno::EINVAL)?;
        let name = self.0[..end].to_vec();
        self.0 = &self.0[end + 1..];
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    fn frame(opcode: u32, unique: u64, body: &[u8]) -> Vec<u8> {
        let header = abi::fuse_in_header {
            len: (size_of::<abi::fuse_in_header>() + body.len()) as u32,
            opcode,
            unique,
            nodeid: 7,
            ..Default::default()
        };
        let mut buf = header.as_bytes().to_vec();
        buf.extend_from_slice(body);
        buf
    }

    #[test]
    fn lookup_name_is_cut_at_its_nul() {
        let req = decode(&frame(abi::FUSE_LOOKUP, 3, b"call\0")).unwrap();
        assert_eq!(req.unique, 3);
        assert_eq!(req.nodeid, 7);
        assert!(matches!(req.op, Op::Lookup { ref name } if name == b"call"));
    }

    #[test]
    fn write_data_must_be_all_there() {
        let w = abi::fuse_write_in {
            fh: 9,
            offset: 4,
            size: 5,
            ..Default::default()
        };
        let mut body = w.as_bytes().to_vec();
        body.extend_from_slice(b"hello");
        let req = decode(&frame(abi::FUSE_WRITE, 1, &body)).unwrap();
        assert!(matches!(req.op, Op::Write { fh: 9, offset: 4, ref data } if data == b"hello"));
        body.truncate(body.len() - 1);
        assert!(matches!(
            decode(&frame(abi::FUSE_WRITE, 2, &body)),
            Err(DecodeError::Args { unique: 2 })
        ));
    }

    #[test]
    fn a_header_that_lies_about_its_length_is_refused() {
        let mut buf = frame(abi::FUSE_GETATTR, 1, &[]);
        buf.push(0);
        assert!(matches!(decode(&buf), Err(DecodeError::Args { unique: 1 })));
        assert!(matches!(decode(&buf[..10]), Err(DecodeError::Header)));
    }

    #[test]
    fn unknown_opcodes_decode_as_unsupported() {
        let req = decode(&frame(4242, 5, &[])).unwrap();
        assert!(matches!(req.op, Op::Unsupported));
        assert_eq!(req.opcode, 4242);
    }

    #[test]
    fn interrupt_names_its_target() {
        let body = abi::fuse_interrupt_in { unique: 40 };
        let req = decode(&frame(abi::FUSE_INTERRUPT, 41, body.as_bytes())).unwrap();
        assert!(matches!(req.op, Op::Interrupt { target: 40 }));
    }
}
