//! The handlers: one 9P2000.L request against the tree, with the loop's own checks (fid
//! liveness, fid cap, walk length, name syntax, reply sizes) applied around the tree's answer.

use rs9p::{DirEntryData, FCall, GetAttrMask, NOFID};
use tokio::sync::OwnedMutexGuard;

use super::Conn;
use super::fids::Live;
use crate::wire::{IOHDRSZ, MAXWELEM, RREAD_HEADER_LEN};
use crate::{Errno, FileTree, Result};

/// The fids a request must be ordered on: the fids it names, including a newfid it creates.
/// Messages we refuse outright (unsupported types, Tauth) name none and so never wait.
pub(super) fn fids_named(body: &FCall) -> Vec<u32> {
    match *body {
        FCall::TAttach { fid, .. } => vec![fid],
        FCall::TWalk { fid, newfid, .. } if fid != newfid => vec![fid, newfid],
        FCall::TWalk { fid, .. }
        | FCall::TxAttrWalk { fid, .. }
        | FCall::TGetAttr { fid, .. }
        | FCall::TSetAttr { fid, .. }
        | FCall::TlOpen { fid, .. }
        | FCall::TlCreate { fid, .. }
        | FCall::TRead { fid, .. }
        | FCall::TWrite { fid, .. }
        | FCall::TReadDir { fid, .. }
        | FCall::TClunk { fid }
        | FCall::TRemove { fid }
        | FCall::TStatFs { fid }
        | FCall::TFSync { fid } => vec![fid],
        FCall::TMkDir { dfid, .. } => vec![dfid],
        FCall::TUnlinkAt { dirfd, .. } => vec![dirfd],
        _ => Vec::new(),
    }
}

/// A walk element: one path component, never empty and never containing '/' or NUL, so a tree
/// that maps names onto a host directory cannot be handed a path.
fn check_walk_name(name: &str) -> Result<()> {
    if name.is_empty() || name.contains(['/', '\0']) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// A name to create: a walk element that is not "." or "..".
fn check_new_name(name: &str) -> Result<()> {
    check_walk_name(name)?;
    if name == "." || name == ".." {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

impl<T: FileTree> Conn<T> {
    /// Locks a live fid (uncontended: the fid's queue already made this request its only user).
    async fn lock_fid(&self, fid: u32) -> Result<OwnedMutexGuard<Live<T::Fid>>> {
        let live = self.shared().fids.get(fid).ok_or(Errno::EBADF)?;
        let mut guard = live.lock_owned().await;
        guard.state()?;
        Ok(guard)
    }

    async fn lock_opened(&self, fid: u32) -> Result<OwnedMutexGuard<Live<T::Fid>>> {
        let guard = self.lock_fid(fid).await?;
        if !guard.opened {
            return Err(Errno::EBADF);
        }
        Ok(guard)
    }

    fn check_new(&self, fid: u32) -> Result<()> {
        self.shared().fids.check_new(fid, self.limits.max_fids)
    }

    /// Makes `fid` live; if it was refused meanwhile, the state goes back to the tree.
    async fn insert_new(&self, fid: u32, state: T::Fid) -> Result<()> {
        let refused = self.shared().fids.insert(fid, state, self.limits.max_fids);
        if let Err((errno, state)) = refused {
            self.tree.clunk(state).await;
            return Err(errno);
        }
        Ok(())
    }

    /// Removes `fid` and hands its state to the tree's clunk.
    async fn clunk_fid(&self, fid: u32) -> Result<()> {
        let live = self.shared().fids.remove(fid).ok_or(Errno::EBADF)?;
        let state = live.lock().await.take();
        if let Some(state) = state {
            self.tree.clunk(state).await;
        }
        Ok(())
    }

    /// The most payload an Rread or Rreaddir may carry at this msize.
    fn reply_room(&self, count: u32) -> usize {
        count.min(self.msize().saturating_sub(RREAD_HEADER_LEN)) as usize
    }

    pub(super) async fn handle(&self, body: FCall) -> Result<FCall> {
        let tree = &*self.tree;
        match body {
            // "No authentication required", in the form diod's client library understands.
            FCall::TAuth { .. } => Err(Errno::ENOENT),
            FCall::TAttach {
                fid,
                afid,
                uname,
                aname,
                n_uname,
            } => {
                if afid != NOFID {
                    return Err(Errno::EBADF);
                }
                self.check_new(fid)?;
                let (qid, state) = tree.attach(&uname, &aname, n_uname).await?;
                self.insert_new(fid, state).await?;
                Ok(FCall::RAttach { qid })
            }
            FCall::TWalk {
                fid,
                newfid,
                wnames,
            } => {
                if wnames.len() > MAXWELEM {
                    return Err(Errno::EINVAL);
                }
                wnames.iter().try_for_each(|n| check_walk_name(n))?;
                let mut from = self.lock_fid(fid).await?;
                if newfid != fid {
                    self.check_new(newfid)?;
                }
                let (mut wqids, new) = tree.walk(from.state()?, &wnames).await?;
                wqids.truncate(wnames.len());
                match new {
                    Some(state) if wqids.len() == wnames.len() => {
                        if newfid == fid {
                            let old = from.replace(state);
                            drop(from);
                            if let Some(old) = old {
                                tree.clunk(old).await;
                            }
                        } else {
                            drop(from);
                            self.insert_new(newfid, state).await?;
                        }
                    }
                    Some(state) => {
                        // A tree that found fewer names than asked must not create the fid.
                        drop(from);
                        tree.clunk(state).await;
                    }
                    None => {}
                }
                if wqids.is_empty() && !wnames.is_empty() {
                    return Err(Errno::ENOENT);
                }
                Ok(FCall::RWalk { wqids })
            }
            FCall::TGetAttr { fid, req_mask } => {
                let mut live = self.lock_fid(fid).await?;
                let (qid, stat) = tree.getattr(live.state()?, req_mask).await?;
                Ok(FCall::RGetAttr {
                    valid: GetAttrMask::BASIC,
                    qid,
                    stat,
                })
            }
            FCall::TlOpen { fid, flags } => {
                let mut live = self.lock_fid(fid).await?;
                if live.opened {
                    return Err(Errno::EBADF);
                }
                let (qid, iounit) = tree.open(live.state()?, flags).await?;
                live.opened = true;
                Ok(FCall::RlOpen {
                    qid,
                    iounit: self.clamp_iounit(iounit),
                })
            }
            FCall::TlCreate {
                fid,
                name,
                flags,
                mode,
                gid,
            } => {
                check_new_name(&name)?;
                let mut live = self.lock_fid(fid).await?;
                if live.opened {
                    return Err(Errno::EBADF);
                }
                let (qid, iounit) = tree.create(live.state()?, &name, flags, mode, gid).await?;
                live.opened = true;
                Ok(FCall::RlCreate {
                    qid,
                    iounit: self.clamp_iounit(iounit),
                })
            }
            FCall::TRead { fid, offset, count } => {
                let mut live = self.lock_opened(fid).await?;
                let room = self.reply_room(count);
                let mut data = tree.read(live.state()?, offset, room as u32).await?;
                data.truncate(room);
                Ok(FCall::RRead {
                    data: rs9p::Data(data),
                })
            }
            FCall::TWrite { fid, offset, data } => {
                let mut live = self.lock_opened(fid).await?;
                let n = tree.write(live.state()?, offset, &data.0).await?;
                Ok(FCall::RWrite {
                    count: n.min(data.0.len() as u32),
                })
            }
            FCall::TReadDir { fid, offset, count } => {
                let mut live = self.lock_opened(fid).await?;
                let room = self.reply_room(count);
                let entries = tree.readdir(live.state()?, offset, room as u32).await?;
                let mut packed = DirEntryData::new();
                let mut used = 0usize;
                for entry in entries {
                    if entry.name.len() > u16::MAX as usize {
                        continue;
                    }
                    let size = entry.size() as usize;
                    if used + size > room {
                        break;
                    }
                    used += size;
                    packed.push(entry);
                }
                Ok(FCall::RReadDir { data: packed })
            }
            FCall::TClunk { fid } => {
                self.clunk_fid(fid).await?;
                Ok(FCall::RClunk)
            }
            FCall::TRemove { fid } => {
                // The fid is gone whatever the outcome (9P); no tree here removes files by fid.
                self.clunk_fid(fid).await?;
                Err(Errno::EACCES)
            }
            FCall::TSetAttr { fid, valid, stat } => {
                let mut live = self.lock_fid(fid).await?;
                tree.setattr(live.state()?, valid, &stat).await?;
                Ok(FCall::RSetAttr)
            }
            FCall::TStatFs { fid } => {
                let mut live = self.lock_fid(fid).await?;
                let statfs = tree.statfs(live.state()?).await?;
                Ok(FCall::RStatFs { statfs })
            }
            FCall::TMkDir {
                dfid,
                name,
                mode,
                gid,
            } => {
                check_new_name(&name)?;
                let mut live = self.lock_fid(dfid).await?;
                let qid = tree.mkdir(live.state()?, &name, mode, gid).await?;
                Ok(FCall::RMkDir { qid })
            }
            FCall::TUnlinkAt { dirfd, name, flags } => {
                check_new_name(&name)?;
                let mut live = self.lock_fid(dirfd).await?;
                tree.unlinkat(live.state()?, &name, flags).await?;
                Ok(FCall::RUnlinkAt)
            }
            FCall::TFSync { fid } => {
                let mut live = self.lock_fid(fid).await?;
                tree.fsync(live.state()?).await?;
                Ok(FCall::RFSync)
            }
            FCall::TxAttrWalk { fid, .. } => {
                self.lock_fid(fid).await?;
                Err(Errno::ENODATA)
            }
            _ => Err(Errno::EOPNOTSUPP),
        }
    }

    fn clamp_iounit(&self, iounit: u32) -> u32 {
        iounit.min(self.msize().saturating_sub(IOHDRSZ))
    }
}
