//! The operator's client of nsd's `/ns` tree (specs/namespace.md): which namespaces exist, their
//! status, info and spec, and `kill` through their ctl. `warren ps`, `warren ns` and `warren down`
//! read it.

use std::time::Duration;

use anyhow::{Context, Result};
use warren_9p::{Client, Errno, Fid, oflags};
use warren_daemon::Dirs;

/// How long `down --force` waits for a killed namespace to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Runs one client operation on a current-thread runtime.
pub fn block_on<T>(fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(fut)
}

/// A long-lived operator connection to nsd.
pub struct NsTree {
    root: Fid,
    _client: Client,
}

/// One namespace as `/ns/<id>/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: u64,
    /// The status line, trimmed: `created`, `running holder=<pid>`, `exited <code>`, `failed …`.
    pub status: String,
}

impl Listed {
    /// The host pid holding the namespace, while it runs.
    pub fn holder(&self) -> Option<u32> {
        self.status
            .strip_prefix("running holder=")
            .and_then(|p| p.trim().parse().ok())
    }

    pub fn is_running(&self) -> bool {
        self.status.starts_with("running")
    }
}

impl NsTree {
    pub async fn connect(dirs: &Dirs) -> Result<NsTree> {
        let socket = dirs.socket("ns");
        let client = tokio::time::timeout(Duration::from_secs(2), Client::connect_unix(&socket))
            .await
            .map_err(|_| anyhow::anyhow!("nsd did not answer at {} in time", socket.display()))?
            .with_context(|| crate::none_answers("nsd", &socket))?;
        let root = client
            .attach("operator", "")
            .await
            .context("attach to nsd")?;
        Ok(NsTree {
            root,
            _client: client,
        })
    }

    /// Every namespace nsd knows, by id, with its status.
    pub async fn list(&self) -> Result<Vec<Listed>> {
        let dir = self.root.walk(&[]).await?;
        dir.open(oflags::RDONLY).await?;
        let mut ids: Vec<u64> = dir
            .readdir_all()
            .await
            .context("list /ns")?
            .into_iter()
            .filter_map(|e| e.name.parse().ok())
            .collect();
        ids.sort_unstable();
        let mut out = Vec::new();
        for id in ids {
            // A namespace whose launcher just left can vanish between the listing and the read.
            match self.read(id, "status").await {
                Ok(status) => out.push(Listed {
                    id,
                    status: status.trim().to_owned(),
                }),
                Err(e) if is_enoent(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The text of `/ns/<id>/<file>`.
    pub async fn read(&self, id: u64, file: &str) -> Result<String> {
        let id_s = id.to_string();
        let fid = self
            .root
            .walk(&[&id_s, file])
            .await
            .with_context(|| format!("/ns/{id}/{file}"))?;
        fid.open(oflags::RDONLY)
            .await
            .with_context(|| format!("/ns/{id}/{file}"))?;
        let bytes = fid
            .read_to_end(0)
            .await
            .with_context(|| format!("/ns/{id}/{file}"))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// SIGKILLs the namespace through its ctl and waits (bounded) until nsd has reaped it.
    /// Returns its final status line, or `gone` when nsd removed it meanwhile (a `warren run`
    /// namespace is removed as soon as its launcher has been told its end).
    pub async fn kill(&self, id: u64) -> Result<String> {
        let id_s = id.to_string();
        let killed = async {
            let ctl = self.root.walk(&[&id_s, "ctl"]).await?;
            ctl.open(oflags::WRONLY).await?;
            match ctl.write_all(0, b"kill").await {
                // ESRCH: it ended on its own meanwhile, which is what we wanted.
                Err(e) if e != Errno(libc::ESRCH as u32) => return Err(e),
                _ => {}
            }
            let wait = self.root.walk(&[&id_s, "wait"]).await?;
            wait.open(oflags::RDONLY).await?;
            wait.read_to_end(0).await
        };
        match tokio::time::timeout(KILL_WAIT, killed).await {
            Err(_) => anyhow::bail!("namespace {id} did not end within {KILL_WAIT:?}"),
            Ok(Ok(line)) => Ok(String::from_utf8_lossy(&line).trim().to_owned()),
            Ok(Err(Errno::ENOENT)) => Ok("gone".into()),
            Ok(Err(e)) => Err(e).with_context(|| format!("kill namespace {id}")),
        }
    }
}

fn is_enoent(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.downcast_ref::<Errno>() == Some(&Errno::ENOENT))
}

#[cfg(test)]
mod tests {
    use super::Listed;

    #[test]
    fn the_holder_comes_from_a_running_status_only() {
        let l = |s: &str| Listed {
            id: 1,
            status: s.into(),
        };
        assert_eq!(l("running holder=4242").holder(), Some(4242));
        assert!(l("running holder=4242").is_running());
        assert_eq!(l("exited 0").holder(), None);
        assert!(!l("created").is_running());
    }
}
