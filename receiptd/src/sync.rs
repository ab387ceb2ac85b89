//! Group commit: one thread fdatasyncs the SQLite WAL file so that commits acknowledged at WAL
//! commit (synchronous=NORMAL, no fsync on the append path) reach the disk within 5 ms, and so
//! that `--durable=fsync` appends can wait for the fdatasync that covers them.
//!
//! fdatasync acts on the inode, so syncing our own descriptor of `<db>-wal` covers every page
//! SQLite wrote to it before the call started.

use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How an append is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// After the WAL commit; an fdatasync follows within [`GROUP_COMMIT_INTERVAL`].
    Wal,
    /// Only after the fdatasync that covers the commit.
    Fsync,
}

/// The longest a WAL commit waits for its fdatasync in the default mode.
pub const GROUP_COMMIT_INTERVAL: Duration = Duration::from_millis(5);

struct State {
    committed: u64,
    synced: u64,
    stop: bool,
    error: Option<String>,
}

pub struct Syncer {
    wal: File,
    mode: Durability,
    state: Mutex<State>,
    wake: Condvar,
    /// (synced generation, the thread failed).
    synced_tx: watch::Sender<(u64, bool)>,
}

impl Syncer {
    /// Opens `<db>-wal` (it must exist: open the database in WAL mode and write first) and starts
    /// the fsync thread.
    pub fn start(db_path: &Path, mode: Durability) -> std::io::Result<Arc<Syncer>> {
        let mut wal_path = db_path.as_os_str().to_owned();
        wal_path.push("-wal");
        let wal = File::options().read(true).write(true).open(&wal_path)?;
        let (synced_tx, _) = watch::channel((0, false));
        let syncer = Arc::new(Syncer {
            wal,
            mode,
            state: Mutex::new(State {
                committed: 0,
                synced: 0,
                stop: false,
                error: None,
            }),
            wake: Condvar::new(),
            synced_tx,
        });
        let worker = Arc::clone(&syncer);
        std::thread::Builder::new()
            .name("receiptd-fsync".into())
            .spawn(move || worker.run())?;
        Ok(syncer)
    }

    pub fn mode(&self) -> Durability {
        self.mode
    }

    /// Records a WAL commit; returns its generation (what [`Syncer::wait`] takes).
    pub fn committed(&self) -> u64 {
        let mut st = self.state.lock().expect("syncer lock");
        st.committed += 1;
        self.wake.notify_one();
        st.committed
    }

    /// fdatasync now, on the caller's thread (before a checkpoint is signed).
    pub fn sync_now(&self) -> std::io::Result<()> {
        let target = self.state.lock().expect("syncer lock").committed;
        nix::unistd::fdatasync(&self.wal).map_err(std::io::Error::from)?;
        self.mark_synced(target);
        Ok(())
    }

    /// Waits (async) until generation `generation` is on disk.
    pub async fn wait(&self, generation: u64) -> Result<(), String> {
        let mut rx = self.synced_tx.subscribe();
        let failed = rx
            .wait_for(|(synced, failed)| *failed || *synced >= generation)
            .await
            .map(|v| v.1);
        match failed {
            Ok(false) => Ok(()),
            _ => Err(self
                .state
                .lock()
                .expect("syncer lock")
                .error
                .clone()
                .unwrap_or_else(|| "fsync thread stopped".into())),
        }
    }

    /// Waits (blocking) until generation `generation` is on disk.
    pub fn wait_blocking(&self, generation: u64) -> Result<(), String> {
        let mut st = self.state.lock().expect("syncer lock");
        while st.synced < generation {
            if let Some(e) = &st.error {
                return Err(e.clone());
            }
            st = self.wake.wait(st).expect("syncer lock");
        }
        Ok(())
    }

    pub fn stop(&self) {
        self.state.lock().expect("syncer lock").stop = true;
        self.wake.notify_all();
    }

    fn mark_synced(&self, target: u64) {
        let mut st = self.state.lock().expect("syncer lock");
        if target > st.synced {
            st.synced = target;
            self.synced_tx.send_replace((target, false));
        }
        self.wake.notify_all();
    }

    fn run(&self) {
        let mut last_sync = Instant::now();
        loop {
            let target = {
                let mut st = self.state.lock().expect("syncer lock");
                while st.committed == st.synced && !st.stop {
                    st = self.wake.wait(st).expect("syncer lock");
                }
                if st.stop && st.committed == st.synced {
                    return;
                }
                st.committed
            };
            // In the default mode, let commits gather for up to the interval: one fdatasync then
            // covers them all. In fsync mode a waiting append is on the clock: sync at once (the
            // commits that arrive during this fdatasync share the next one).
            if self.mode == Durability::Wal {
                let due = last_sync + GROUP_COMMIT_INTERVAL;
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
            }
            let target = target.max(self.state.lock().expect("syncer lock").committed);
            if let Err(e) = nix::unistd::fdatasync(&self.wal) {
                let mut st = self.state.lock().expect("syncer lock");
                st.error = Some(format!("fdatasync of the WAL failed: {e}"));
                self.synced_tx.send_replace((st.synced, true));
                self.wake.notify_all();
                tracing::error!(error = %e, "fdatasync of the WAL failed; the fsync thread stops");
                return;
            }
            last_sync = Instant::now();
            self.mark_synced(target);
        }
    }
}
