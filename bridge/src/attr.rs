//! Attributes between 9P2000.L and FUSE, and the privilege bits the bridge never lets through.

use std::time::Duration;

use polyfuse_kernel as abi;
use warren_9p::{Errno, QId, QIdType, SetAttr, SetAttrMask, Stat, StatFs, Time};

/// Set-user-ID and set-group-ID: a 9P server lends its own authority to whoever mounts it, so
/// these bits are stripped from every mode the bridge sends (creates, chmod) and shows.
pub(crate) const SETID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;

/// The inode number shown for a qid (`st_ino`, `d_ino`). Shifted by one so a server's qid path 0
/// (common for a root) does not become inode 0, which some programs skip as a deleted entry.
pub(crate) fn ino(qid: &QId) -> u64 {
    qid.path.wrapping_add(1)
}

/// `d_type` for a directory entry: the server's, or derived from the qid when it sent 0.
pub(crate) fn dirent_type(typ: u8, qid: &QId) -> u32 {
    if typ != 0 {
        return u32::from(typ);
    }
    if qid.typ.contains(QIdType::DIR) {
        libc::DT_DIR.into()
    } else if qid.typ.contains(QIdType::SYMLINK) {
        libc::DT_LNK.into()
    } else {
        libc::DT_REG.into()
    }
}

/// The owner the bridge shows for every file (the server's uids mean nothing in the namespace).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// The size shown for a call or rpc file (a writable file of a synthetic tree reporting 9P size
/// 0): larger than any request written to one (toolfs takes 1 MiB of arguments by default), so
/// the kernel never ends a `sendfile`/`splice` (busybox `cat`) at its idea of the size without
/// asking; the bridge refuses that page-cache read (`Session::read`) and the reader falls back to
/// read(2), which goes to the server at the descriptor's offset. Size 0 made it a silent empty
/// read.
pub(crate) const RPC_FILE_SIZE: u64 = 16 << 20;

/// A 9P `Stat` as FUSE's `fuse_attr`: setid bits stripped, owner replaced; on a synthetic tree
/// (`synthetic`), a call or rpc file's size shown as [`RPC_FILE_SIZE`].
pub(crate) fn fuse_attr(qid: &QId, stat: &Stat, owner: Owner, synthetic: bool) -> abi::fuse_attr {
    let rpc_file = synthetic
        && stat.size == 0
        && stat.mode & libc::S_IFMT == libc::S_IFREG
        && stat.mode & 0o222 != 0;
    abi::fuse_attr {
        ino: ino(qid),
        size: if rpc_file { RPC_FILE_SIZE } else { stat.size },
        blocks: stat.blocks,
        atime: stat.atime.sec,
        mtime: stat.mtime.sec,
        ctime: stat.ctime.sec,
        atimensec: nsec(&stat.atime),
        mtimensec: nsec(&stat.mtime),
        ctimensec: nsec(&stat.ctime),
        mode: stat.mode & !SETID_BITS,
        nlink: u32::try_from(stat.nlink).unwrap_or(u32::MAX).max(1),
        uid: owner.uid,
        gid: owner.gid,
        rdev: 0,
        blksize: u32::try_from(stat.blksize)
            .ok()
            .filter(|&b| b > 0)
            .unwrap_or(4096),
        padding: 0,
    }
}

fn nsec(t: &Time) -> u32 {
    u32::try_from(t.nsec)
        .ok()
        .filter(|&n| n < 1_000_000_000)
        .unwrap_or(0)
}

/// A cache lifetime as FUSE's (seconds, nanoseconds).
pub(crate) fn valid(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

/// `fuse_attr_out` for GETATTR and SETATTR replies.
pub(crate) fn attr_out(attr: abi::fuse_attr, ttl: Duration) -> abi::fuse_attr_out {
    let (attr_valid, attr_valid_nsec) = valid(ttl);
    abi::fuse_attr_out {
        attr_valid,
        attr_valid_nsec,
        dummy: 0,
        attr,
    }
}

/// `fuse_entry_out` for LOOKUP, CREATE and MKDIR replies.
pub(crate) fn entry_out(nodeid: u64, attr: abi::fuse_attr, ttl: Duration) -> abi::fuse_entry_out {
    let (secs, nsecs) = valid(ttl);
    abi::fuse_entry_out {
        nodeid,
        generation: 0,
        entry_valid: secs,
        attr_valid: secs,
        entry_valid_nsec: nsecs,
        attr_valid_nsec: nsecs,
        attr,
    }
}

/// A mode for a create or mkdir: permission bits and sticky only, setid stripped. (Without
/// FUSE_DONT_MASK the kernel has already applied the caller's umask.)
pub(crate) fn create_mode(mode: u32) -> u32 {
    mode & 0o7777 & !SETID_BITS
}

/// FUSE SETATTR as 9P Tsetattr. chown is refused (EPERM); setid bits are stripped from chmod;
/// "now" times are left for the server's clock. Returns `None` when nothing is left to send.
pub(crate) fn setattr(
    input: &abi::fuse_setattr_in,
) -> Result<Option<(SetAttrMask, SetAttr)>, Errno> {
    if input.valid & (abi::FATTR_UID | abi::FATTR_GID) != 0 {
        return Err(Errno::EPERM);
    }
    let zero = Time { sec: 0, nsec: 0 };
    let mut mask = SetAttrMask::empty();
    let mut attr = SetAttr {
        mode: 0,
        uid: 0,
        gid: 0,
        size: 0,
        atime: zero,
        mtime: zero,
    };
    if input.valid & abi::FATTR_MODE != 0 {
        mask |= SetAttrMask::MODE;
        attr.mode = create_mode(input.mode);
    }
    if input.valid & abi::FATTR_SIZE != 0 {
        mask |= SetAttrMask::SIZE;
        attr.size = input.size;
    }
    if input.valid & abi::FATTR_ATIME_NOW != 0 {
        mask |= SetAttrMask::ATIME;
    } else if input.valid & abi::FATTR_ATIME != 0 {
        mask |= SetAttrMask::ATIME | SetAttrMask::ATIME_SET;
        attr.atime = Time {
            sec: input.atime,
            nsec: input.atimensec.into(),
        };
    }
    if input.valid & abi::FATTR_MTIME_NOW != 0 {
        mask |= SetAttrMask::MTIME;
    } else if input.valid & abi::FATTR_MTIME != 0 {
        mask |= SetAttrMask::MTIME | SetAttrMask::MTIME_SET;
        attr.mtime = Time {
            sec: input.mtime,
            nsec: input.mtimensec.into(),
        };
    }
    if input.valid & abi::FATTR_CTIME != 0 {
        mask |= SetAttrMask::CTIME;
    }
    Ok((!mask.is_empty()).then_some((mask, attr)))
}

/// 9P Rstatfs as FUSE's `fuse_statfs_out`.
pub(crate) fn statfs_out(s: &StatFs) -> abi::fuse_statfs_out {
    abi::fuse_statfs_out {
        st: abi::fuse_kstatfs {
            blocks: s.blocks,
            bfree: s.bfree,
            bavail: s.bavail,
            files: s.files,
            ffree: s.ffree,
            bsize: s.bsize,
            namelen: s.namelen,
            frsize: s.bsize,
            padding: 0,
            spare: [0; 6],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chmod_setid_bits_are_stripped_and_sticky_kept() {
        let input = abi::fuse_setattr_in {
            valid: abi::FATTR_MODE,
            mode: 0o106_755 | 0o7000,
            ..Default::default()
        };
        let (mask, attr) = setattr(&input).unwrap().unwrap();
        assert_eq!(mask, SetAttrMask::MODE);
        assert_eq!(attr.mode, 0o1755);
    }

    #[test]
    fn chown_is_refused_even_with_other_changes() {
        for bit in [abi::FATTR_UID, abi::FATTR_GID] {
            let input = abi::fuse_setattr_in {
                valid: bit | abi::FATTR_SIZE,
                ..Default::default()
            };
            assert_eq!(setattr(&input).unwrap_err(), Errno::EPERM);
        }
    }

    #[test]
    fn truncate_and_times_translate() {
        let input = abi::fuse_setattr_in {
            valid: abi::FATTR_SIZE
                | abi::FATTR_MTIME
                | abi::FATTR_ATIME
                | abi::FATTR_ATIME_NOW
                | abi::FATTR_FH,
            mtime: 5,
            mtimensec: 6,
            ..Default::default()
        };
        let (mask, attr) = setattr(&input).unwrap().unwrap();
        assert_eq!(
            mask,
            SetAttrMask::SIZE | SetAttrMask::ATIME | SetAttrMask::MTIME | SetAttrMask::MTIME_SET
        );
        assert_eq!(attr.size, 0);
        assert_eq!(attr.mtime, Time { sec: 5, nsec: 6 });
        let only_fh = abi::fuse_setattr_in {
            valid: abi::FATTR_FH | abi::FATTR_LOCKOWNER,
            ..Default::default()
        };
        assert!(setattr(&only_fh).unwrap().is_none());
    }

    #[test]
    fn shown_modes_never_carry_setid_bits() {
        let stat = Stat {
            mode: libc::S_IFREG | 0o6755,
            uid: 0,
            gid: 0,
            nlink: 1,
            rdev: 0,
            size: 0,
            blksize: 0,
            blocks: 0,
            atime: Time { sec: 0, nsec: 0 },
            mtime: Time { sec: 0, nsec: 0 },
            ctime: Time { sec: 0, nsec: 0 },
        };
        let attr = fuse_attr(
            &QId::default(),
            &stat,
            Owner {
                uid: 1000,
                gid: 1000,
            },
            false,
        );
        assert_eq!(attr.mode, libc::S_IFREG | 0o755);
        assert_eq!(
            (attr.uid, attr.gid, attr.ino, attr.blksize),
            (1000, 1000, 1, 4096)
        );
    }
}
