//! The receipt log: validates, stamps, signs and commits appends; keeps each scope's chain head
//! and Merkle frontier; signs checkpoints; rotates the key. One instance owns the database.
//!
//! Why one file: `Log` is the database's one owner — admission, signing, commit, checkpoints and
//! rotation all move the same chain heads and frontiers, which must change only with a commit.

use std::collections::HashMap;
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::access::{AppendError, Role};
use crate::budget::{BudgetKey, Budgets};
use crate::dsse::{self, Envelope, RECEIPT_PAYLOAD_TYPE};
use crate::keys::{self, KeyRow, Registry, Signer};
use crate::merkle::{self, Frontier, Hash};
use crate::note::Checkpoint;
use crate::receipt::{AppendRequest, Body, GENESIS_PREV, Hlc, Kind};
use crate::store;
use crate::sync::{Durability, Syncer};

/// The scope receiptd writes its own receipts to (start, rotation, floor refusals).
pub const SYSTEM_SCOPE: &str = "receiptd";

/// The default per-scope receipt rate (receipts/s): 20 000/s is 10 000 gated calls/s (a decision
/// and an effect receipt each), about 3-4x the MCP stdio rate warren's speed goal is measured
/// against (2 500-3 900 calls/s), while a runaway session is still bounded (docs/decisions.md).
pub const DEFAULT_RATE_PER_SEC: f64 = 20_000.0;
/// The default per-scope burst: two seconds at the default rate.
pub const DEFAULT_RATE_BURST: f64 = 40_000.0;

#[derive(Clone, Debug)]
pub struct LogConfig {
    pub data_dir: PathBuf,
    pub secrets_dir: PathBuf,
    pub durability: Durability,
    /// Appends are refused while the data dir's filesystem has less free space than this.
    pub min_free_bytes: u64,
    /// Per-scope (per-session) token bucket: refill rate and burst.
    pub rate_per_sec: f64,
    pub rate_burst: f64,
    /// A scope is checkpointed once this many entries are uncovered...
    pub checkpoint_rows: u64,
    /// ...or this long after its first uncovered entry.
    pub checkpoint_interval: Duration,
    /// Generate the signing key if the registry is empty (first start).
    pub generate_key: bool,
    /// Per namespace subtree, where its root's spec sets none: receipts per second and receipt
    /// bytes in total (`budget`).
    pub subtree_rate: u64,
    pub subtree_bytes: u64,
}

impl LogConfig {
    pub fn new(data_dir: &Path, secrets_dir: &Path) -> LogConfig {
        LogConfig {
            data_dir: data_dir.to_owned(),
            secrets_dir: secrets_dir.to_owned(),
            durability: Durability::Wal,
            min_free_bytes: 64 << 20,
            rate_per_sec: DEFAULT_RATE_PER_SEC,
            rate_burst: DEFAULT_RATE_BURST,
            checkpoint_rows: 100,
            checkpoint_interval: Duration::from_secs(5),
            generate_key: true,
            subtree_rate: crate::budget::DEFAULT_SUBTREE_RATE,
            subtree_bytes: crate::budget::DEFAULT_SUBTREE_BYTES,
        }
    }
}

/// What an append returns: its place in the chain and, for `--durable=fsync`, the group-commit
/// generation to wait for before acknowledging.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub seq: u64,
    /// Hex SHA-256 of the canonical envelope (the next entry's `prev`).
    pub hash: String,
    pub generation: u64,
}

impl Ack {
    /// The reply a caller reads from `append`.
    pub fn reply(&self) -> Vec<u8> {
        warren_jcs::value_to_vec(&self.json()).expect("ack serialises")
    }

    /// The reply to a batch: one ack per request, in order.
    pub fn batch_reply(acks: &[Ack]) -> Vec<u8> {
        let all = Value::Array(acks.iter().map(Ack::json).collect());
        warren_jcs::value_to_vec(&all).expect("acks serialise")
    }

    fn json(&self) -> Value {
        json!({"seq": self.seq, "hash": self.hash})
    }
}

/// One write to `append`: its requests (one, or a batch) and the role of the connection that
/// wrote it. A write is appended all or none.
pub struct Write {
    pub requests: Vec<AppendRequest>,
    pub role: Role,
}

/// An admitted request, not yet stamped, signed or chained, and who appends it.
struct NewEntry {
    req: AppendRequest,
    appender: String,
}

struct ScopeState {
    head: String,
    frontier: Frontier,
    covered: u64,
    uncovered_since: Option<Instant>,
}

/// A subtree's refusal episode: when it was last refused, and how often in all.
struct Episode {
    last: Instant,
    refused: u64,
}

/// An episode ends once its subtree has gone this long without a refusal.
const EPISODE_QUIET: Duration = Duration::from_secs(10);

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A checkpoint computed but not yet signed: signed only after the fdatasync of `generation`.
pub struct PendingCheckpoint {
    scope: String,
    checkpoint: Checkpoint,
    pub generation: u64,
}

pub struct Log {
    /// An exclusive flock on `<data>/receipts.lock`: one writer per database (a second daemon,
    /// or `--rotate-key` beside a running one, is refused rather than forking the chain).
    _lock: nix::fcntl::Flock<fs::File>,
    conn: Connection,
    cfg: LogConfig,
    signer: Result<Signer, String>,
    node: String,
    hlc: Hlc,
    scopes: HashMap<String, ScopeState>,
    buckets: HashMap<String, Bucket>,
    floor_refusing: bool,
    syncer: Arc<Syncer>,
    budgets: Budgets,
    /// Subtree keys whose refusal episode has been receipted (one system receipt per episode).
    budget_refusing: HashMap<String, Episode>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn storage(e: impl std::fmt::Display) -> AppendError {
    AppendError::Storage(e.to_string())
}

impl Log {
    /// Opens the log in `cfg.data_dir`, loading (or on first start generating) the signing key.
    /// A missing or unusable key does not stop the open: appends are refused instead (fail
    /// closed), with the reason in every refusal.
    pub fn open(cfg: LogConfig) -> anyhow::Result<Log> {
        // Ours alone (no symlink, no other uid's, nobody else can write to it), so what is in
        // it can only be what we or root put there.
        warren_daemon::dirs::make_own_dir(&cfg.data_dir)
            .with_context(|| format!("data dir {}", cfg.data_dir.display()))?;
        refuse_secrets_inside_data(&cfg.data_dir, &cfg.secrets_dir)?;
        let lock_path = cfg.data_dir.join("receipts.lock");
        let lock_file = warren_daemon::dirs::open_own_file(&lock_path, true)?;
        let lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| {
                anyhow::anyhow!(
                    "{} is held ({e}): another receiptd owns this database",
                    lock_path.display()
                )
            })?;
        let db_path = store::db_path(&cfg.data_dir);
        let synchronous = match cfg.durability {
            Durability::Wal => "NORMAL",
            // The fsync thread's fdatasync is what acknowledges in this mode; NORMAL keeps
            // SQLite from adding its own per-commit sync on top.
            Durability::Fsync => "NORMAL",
        };
        let conn = store::open_rw(&db_path, synchronous)?;
        let node = match store::meta_get(&conn, "node")? {
            Some(n) => n,
            None => {
                let mut id = [0u8; 8];
                getrandom::fill(&mut id).map_err(|e| anyhow::anyhow!("getrandom: {e}"))?;
                let n = hex::encode(id);
                store::meta_set(&conn, "node", &n)?;
                n
            }
        };
        // The last stamp: the latest of the one checkpoints and rotations persist in `meta` and
        // the ones appends persist in their scope's row.
        let meta_hlc = (
            store::meta_get(&conn, "hlc_wall")?
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0),
            store::meta_get(&conn, "hlc_counter")?
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0),
        );
        let scope_hlc: (u64, u64) = conn
            .query_row(
                "SELECT hlc_wall, hlc_counter FROM scopes ORDER BY hlc_wall DESC, hlc_counter DESC LIMIT 1",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
            .optional()?
            .unwrap_or((0, 0));
        let (wall_ms, counter) = meta_hlc.max(scope_hlc);
        let hlc = Hlc {
            wall_ms,
            counter,
            node: node.clone(),
        };
        store::meta_set(&conn, "opened_ms", &now_ms().to_string())?;
        let mut scopes = HashMap::new();
        {
            let mut stmt = conn.prepare("SELECT scope, head, frontier, covered FROM scopes")?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })?;
            for row in rows {
                let (scope, head, frontier, covered) = row?;
                let frontier = Frontier::from_bytes(&frontier)
                    .ok_or_else(|| anyhow::anyhow!("scope {scope}: stored frontier is corrupt"))?;
                let uncovered_since = (frontier.size() > covered as u64).then(Instant::now);
                scopes.insert(
                    scope,
                    ScopeState {
                        head,
                        frontier,
                        covered: covered as u64,
                        uncovered_since,
                    },
                );
            }
        }
        let syncer = Syncer::start(&db_path, cfg.durability)?;
        let (subtree_rate, subtree_bytes) = (cfg.subtree_rate, cfg.subtree_bytes);
        let mut log = Log {
            _lock: lock,
            conn,
            cfg,
            signer: Err(String::new()),
            node,
            hlc,
            scopes,
            buckets: HashMap::new(),
            floor_refusing: false,
            budgets: Budgets::new(subtree_rate, subtree_bytes),
            budget_refusing: HashMap::new(),
            syncer,
        };
        log.signer = log.load_signer();
        Ok(log)
    }

    fn note_name(&self) -> String {
        format!("warren.receipts/{}", self.node)
    }

    pub fn origin(&self, scope: &str) -> String {
        format!("warren.receipts/{}/{scope}", self.node)
    }

    pub fn syncer(&self) -> &Arc<Syncer> {
        &self.syncer
    }

    pub fn durability(&self) -> Durability {
        self.cfg.durability
    }

    /// The active key: the key file must exist, be private, and match the registry's one
    /// unretired row. On first start (an empty registry and no key file) the key is generated.
    /// An empty registry beside a key that exists is a data dir made anew (wiped, moved, a new
    /// disk) next to the secrets of an older log: refused, never adopted or replaced
    /// (docs/decisions.md D40, "A new data dir beside an existing signing key").
    fn load_signer(&mut self) -> Result<Signer, String> {
        let path = keys::key_path(&self.cfg.secrets_dir);
        let registry = store::registry(&self.conn).map_err(|e| format!("key registry: {e}"))?;
        if registry.keys.is_empty() {
            if !self.cfg.generate_key {
                return Err("the key registry is empty and key generation is off (run `warren-receiptd --init-key`)".into());
            }
            if fs::symlink_metadata(&path).is_ok() {
                return Err(format!(
                    "the data dir {} holds no key registry (it is new, or its log was wiped or \
                     moved), but the secrets dir already holds a signing key, {}: receiptd will \
                     not start a second log under that key, nor replace it. Restore the data dir \
                     that holds its log; or, to start a new log with a new key, move the key \
                     file out of the secrets dir (keep it: it verifies the old log's exports) \
                     and restart warren",
                    self.cfg.data_dir.display(),
                    path.display()
                ));
            }
            return self.init_key(&path);
        }
        let active: Vec<&KeyRow> = registry
            .keys
            .iter()
            .filter(|k| k.valid_until.is_none())
            .collect();
        let [active] = active.as_slice() else {
            return Err(format!(
                "the key registry has {} unretired keys, not one",
                active.len()
            ));
        };
        // A rotation interrupted after its registry commit leaves the new key at `.new`.
        let pending = path.with_extension("key.new");
        if pending.exists() && Signer::load(&pending).is_ok_and(|s| s.keyid() == active.keyid) {
            fs::rename(&pending, &path)
                .map_err(|e| format!("finishing an interrupted rotation: {e}"))?;
        }
        let signer = Signer::load(&path)?;
        if signer.keyid() != active.keyid {
            return Err(format!(
                "the key file {} holds key {}, but the registry's key in force is {}",
                path.display(),
                signer.keyid(),
                active.keyid
            ));
        }
        Ok(signer)
    }

    fn init_key(&mut self, path: &Path) -> Result<Signer, String> {
        let signer = Signer::generate().map_err(|e| e.to_string())?;
        signer
            .save_new(path)
            .map_err(|e| format!("writing the new signing key {}: {e}", path.display()))?;
        let from = self.hlc.next(now_ms()).wall_ms;
        store::insert_key(
            &self.conn,
            &KeyRow::for_signer(&signer, &self.note_name(), from),
        )
        .map_err(|e| format!("registering the new key: {e}"))?;
        tracing::info!(keyid = signer.keyid(), path = %path.display(), "generated the receipt signing key");
        Ok(signer)
    }

    /// The keyid of the key in force, or why there is none.
    pub fn signer_status(&self) -> Result<&str, &str> {
        self.signer
            .as_ref()
            .map(|s| s.keyid())
            .map_err(|e| e.as_str())
    }

    pub fn registry(&self) -> anyhow::Result<Registry> {
        Ok(store::registry(&self.conn)?)
    }

    /// Appends a request from a connection in `role`.
    pub fn append(&mut self, req: AppendRequest, role: Role) -> Result<Ack, AppendError> {
        let mut acks = self.append_writes(vec![Write {
            requests: vec![req],
            role,
        }]);
        acks.pop()
            .expect("one result per write")
            .map(|mut a| a.pop().expect("one ack per request"))
    }

    /// Appends the writes that arrived together in one transaction (one commit for all of them:
    /// receiptd's batching of concurrent appends). Each write is checked on its own and appended
    /// all or none: a refused write takes nothing from the others, and a failed commit fails
    /// them all. One result per write, in order.
    pub fn append_writes(&mut self, writes: Vec<Write>) -> Vec<Result<Vec<Ack>, AppendError>> {
        // One look at the free space for the whole commit, not one per write.
        let free = self.free_bytes();
        let mut entries = Vec::new();
        // Per write: how many of `entries` are its, or why it was refused.
        let admitted: Vec<Result<usize, AppendError>> = writes
            .into_iter()
            .map(|write| {
                self.admit(&write, &free)?;
                let (n, appender) = (write.requests.len(), write.role.appender());
                entries.extend(write.requests.into_iter().map(|req| NewEntry {
                    req,
                    appender: appender.clone(),
                }));
                Ok(n)
            })
            .collect();
        let mut committed = self.commit_entries(entries).map(Vec::into_iter);
        admitted
            .into_iter()
            .map(|admitted| match (admitted, &mut committed) {
                (Err(refused), _) => Err(refused),
                (Ok(n), Ok(acks)) => Ok(acks.by_ref().take(n).collect()),
                (Ok(_), Err(e)) => Err(e.clone()),
            })
            .collect()
    }

    /// Checks one write before it is staged: its kinds against the role, the signer, the
    /// scopes' rates (all of the write's tokens or none) and the free-space floor.
    fn admit(&mut self, write: &Write, free: &Result<u64, AppendError>) -> Result<(), AppendError> {
        if write.requests.is_empty() {
            return Err(AppendError::Invalid("a write with no request".into()));
        }
        for req in &write.requests {
            write.role.may_append(req.kind)?;
            if !req.budgets.is_empty() {
                write.role.may_charge_budgets()?;
            }
        }
        if let Err(e) = &self.signer {
            return Err(AppendError::NoSigner(e.clone()));
        }
        self.admit_budgets(&write.requests)?;
        self.take_tokens(&write.requests)?;
        self.check_floor(free.clone()?, &write.requests)?;
        for req in &write.requests {
            self.budgets.charge_rate(&req.budgets);
        }
        Ok(())
    }

    /// Refuses a write with a decision receipt whose namespace subtree is over budget (the
    /// call it admits is then denied). Receipts the first refusal of each subtree's episode in
    /// [`SYSTEM_SCOPE`], and its end — the first decision taken after [`EPISODE_QUIET`] with no
    /// refusal — with how many were refused: a flood at the edge of its rate is one episode, not
    /// a receipt per refusal.
    fn admit_budgets(&mut self, requests: &[AppendRequest]) -> Result<(), AppendError> {
        for req in requests
            .iter()
            .filter(|r| r.kind == Kind::Decision && !r.budgets.is_empty())
        {
            let root = req
                .budgets
                .last()
                .map(|k| k.key.clone())
                .unwrap_or_default();
            match self.budgets.admit(&req.budgets, &req.scope) {
                Ok(()) => {
                    let ended = self
                        .budget_refusing
                        .get(&root)
                        .is_some_and(|e| e.last.elapsed() >= EPISODE_QUIET);
                    if ended && let Some(e) = self.budget_refusing.remove(&root) {
                        let _ = self.append_system(json!({
                            "event": "budget_recovered", "subtree": root, "refused": e.refused,
                        }));
                    }
                }
                Err((over, why)) => {
                    let now = Instant::now();
                    match self.budget_refusing.get_mut(&root) {
                        Some(e) => {
                            e.last = now;
                            e.refused += 1;
                        }
                        None => {
                            self.budget_refusing.insert(
                                root.clone(),
                                Episode {
                                    last: now,
                                    refused: 1,
                                },
                            );
                            let receipted = self.append_system(json!({
                                "event": "budget_refused", "subtree": root, "budget": over.code(),
                                "refused": {"scope": req.scope, "kind": req.kind.as_str()},
                            }));
                            if let Err(e) = receipted {
                                tracing::error!(error = %e, "could not receipt a budget refusal");
                            }
                        }
                    }
                    return Err(AppendError::Budget(over, why));
                }
            }
        }
        Ok(())
    }

    /// receiptd's own receipt (boot, rotation, floor) in [`SYSTEM_SCOPE`].
    pub fn append_system(&mut self, subject: Value) -> Result<Ack, AppendError> {
        if let Err(e) = &self.signer {
            return Err(AppendError::NoSigner(e.clone()));
        }
        let req = AppendRequest {
            scope: SYSTEM_SCOPE.to_owned(),
            kind: Kind::Boot,
            subject,
            digests: Value::Null,
            policy_hash: None,
            budgets: Vec::new(),
        };
        let mut acks = self.commit_entries(vec![NewEntry {
            req,
            appender: Role::Receiptd.appender(),
        }])?;
        Ok(acks.pop().expect("one ack per entry"))
    }

    /// The start receipt: names the key in force and the durability mode.
    pub fn append_boot(&mut self) -> Result<Ack, AppendError> {
        let key = self
            .signer
            .as_ref()
            .map(|s| s.keyid().to_owned())
            .map_err(|e| AppendError::NoSigner(e.clone()))?;
        let mode = match self.cfg.durability {
            Durability::Wal => "wal",
            Durability::Fsync => "fsync",
        };
        self.append_system(json!({"event": "start", "key": key, "durable": mode, "version": env!("CARGO_PKG_VERSION")}))
    }

    /// Takes one token per request from each scope's bucket: all of them, or (when any scope is
    /// over its rate) none.
    fn take_tokens(&mut self, requests: &[AppendRequest]) -> Result<(), AppendError> {
        let (rate, burst) = (self.cfg.rate_per_sec, self.cfg.rate_burst);
        let now = Instant::now();
        let mut wanted: Vec<(&str, f64)> = Vec::new();
        for req in requests {
            match wanted.iter_mut().find(|(s, _)| *s == req.scope) {
                Some((_, n)) => *n += 1.0,
                None => wanted.push((&req.scope, 1.0)),
            }
        }
        for (scope, n) in &wanted {
            let bucket = self.buckets.entry((*scope).to_owned()).or_insert(Bucket {
                tokens: burst,
                at: now,
            });
            bucket.tokens =
                (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(burst);
            bucket.at = now;
            if bucket.tokens < *n {
                return Err(AppendError::RateLimited(format!(
                    "scope {scope} is over {rate}/s (burst {burst})"
                )));
            }
        }
        for (scope, n) in wanted {
            if let Some(bucket) = self.buckets.get_mut(scope) {
                bucket.tokens -= n;
            }
        }
        Ok(())
    }

    fn free_bytes(&self) -> Result<u64, AppendError> {
        let st = nix::sys::statvfs::statvfs(&self.cfg.data_dir)
            .map_err(|e| storage(format!("statvfs {}: {e}", self.cfg.data_dir.display())))?;
        Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
    }

    /// Refuses at the floor (not at ENOSPC), receipting the first refusal of each episode and the
    /// recovery. Below the floor the last reserve (the floor's lower half) is kept for what keeps
    /// the host auditable: receiptd's own receipts (which do not pass here) and the gate's
    /// denials; below the reserve those are refused too.
    fn check_floor(&mut self, free: u64, requests: &[AppendRequest]) -> Result<(), AppendError> {
        let floor = self.cfg.min_free_bytes;
        if free >= floor {
            if self.floor_refusing {
                self.floor_refusing = false;
                let _ = self.append_system(json!({"event": "free_space_recovered", "free_bytes": free, "floor_bytes": floor}));
            }
            return Ok(());
        }
        let denials_only = requests
            .iter()
            .all(|r| r.kind == Kind::Decision && r.subject["verdict"] == "deny");
        if denials_only && free >= floor / 2 {
            return Ok(());
        }
        let req = &requests[0];
        if !self.floor_refusing {
            self.floor_refusing = true;
            let receipted = self.append_system(json!({
                "event": "free_space_floor", "free_bytes": free, "floor_bytes": floor,
                "refused": {"scope": req.scope, "kind": req.kind.as_str()},
            }));
            if let Err(e) = receipted {
                tracing::error!(error = %e, "could not receipt the free-space refusal");
            }
        }
        Err(AppendError::Floor(format!(
            "{free} bytes free in {}, below the floor of {floor}",
            self.cfg.data_dir.display()
        )))
    }

    /// Stamps, signs and chains `entries` in order and commits them in one transaction; the
    /// in-memory heads and frontiers move only once the commit succeeded.
    fn commit_entries(&mut self, entries: Vec<NewEntry>) -> Result<Vec<Ack>, AppendError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let signer = self
            .signer
            .as_ref()
            .map_err(|e| AppendError::NoSigner(e.clone()))?;
        // The scopes this commit moves, as they will be once it succeeds.
        let mut moved: HashMap<String, (String, Frontier)> = HashMap::new();
        let mut hlc = self.hlc.clone();
        let mut rows = Vec::with_capacity(entries.len());
        let mut acks = Vec::with_capacity(entries.len());
        // Each receipt's bytes, charged to its subtree's keys once the commit succeeded.
        let mut charges: Vec<(Vec<BudgetKey>, u64)> = Vec::new();
        for NewEntry {
            req: mut e,
            appender,
        } in entries
        {
            let budgets = std::mem::take(&mut e.budgets);
            let (head, frontier) = match moved.get_mut(&e.scope) {
                Some(st) => st,
                None => {
                    let st = match self.scopes.get(&e.scope) {
                        Some(st) => (st.head.clone(), st.frontier.clone()),
                        None => (GENESIS_PREV.to_owned(), Frontier::default()),
                    };
                    moved.entry(e.scope.clone()).or_insert(st)
                }
            };
            let seq = frontier.size();
            hlc = hlc.next(now_ms());
            let body = Body {
                v: 1,
                scope: e.scope.clone(),
                seq,
                prev: std::mem::take(head),
                kind: e.kind,
                hlc: hlc.clone(),
                subject: e.subject,
                digests: e.digests,
                policy_hash: e.policy_hash,
                appender,
            };
            let payload = body.canonical();
            let mut env = Envelope::new(RECEIPT_PAYLOAD_TYPE, &payload);
            if e.kind.signed() {
                let sig = signer.sign(&dsse::pae(RECEIPT_PAYLOAD_TYPE, &payload));
                env.signatures.push(dsse::Signature {
                    keyid: signer.keyid().to_owned(),
                    sig: base64_std(&sig),
                });
            }
            let bytes = env.canonical();
            if !budgets.is_empty() {
                charges.push((budgets, bytes.len() as u64));
            }
            let hash = hex::encode(Sha256::digest(&bytes));
            let leaf = merkle::leaf_hash(&bytes);
            frontier.push(leaf);
            *head = hash.clone();
            rows.push((e.scope, seq, e.kind, bytes, leaf));
            acks.push((seq, hash));
        }

        let tx = self.conn.unchecked_transaction().map_err(storage)?;
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO entries (scope, seq, kind, envelope, leaf_hash) VALUES (?1, ?2, ?3, ?4, ?5)")
                .map_err(storage)?;
            for (scope, seq, kind, bytes, leaf) in &rows {
                insert
                    .execute(params![
                        scope,
                        *seq as i64,
                        kind.as_str(),
                        bytes,
                        leaf.as_slice()
                    ])
                    .map_err(storage)?;
            }
            let mut upsert = tx
                .prepare_cached(
                    "INSERT INTO scopes (scope, size, head, frontier, covered, hlc_wall, hlc_counter) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                        ON CONFLICT (scope) DO UPDATE SET size = excluded.size, head = excluded.head, frontier = excluded.frontier,
                        hlc_wall = excluded.hlc_wall, hlc_counter = excluded.hlc_counter",
                )
                .map_err(storage)?;
            for (scope, (head, frontier)) in &moved {
                let covered = self.scopes.get(scope).map_or(0, |s| s.covered);
                upsert
                    .execute(params![
                        scope,
                        frontier.size() as i64,
                        head,
                        frontier.to_bytes(),
                        covered as i64,
                        hlc.wall_ms as i64,
                        hlc.counter as i64
                    ])
                    .map_err(storage)?;
            }
        }
        tx.commit().map_err(storage)?;

        for (keys, len) in charges {
            self.budgets.charge_bytes(&keys, len);
        }
        self.hlc = hlc;
        for (scope, (head, frontier)) in moved {
            let st = self.scopes.entry(scope).or_insert(ScopeState {
                head: String::new(),
                frontier: Frontier::default(),
                covered: 0,
                uncovered_since: None,
            });
            st.head = head;
            st.frontier = frontier;
            st.uncovered_since.get_or_insert_with(Instant::now);
        }
        let generation = self.syncer.committed();
        Ok(acks
            .into_iter()
            .map(|(seq, hash)| Ack {
                seq,
                hash,
                generation,
            })
            .collect())
    }

    /// Checkpoints due now (`force`: every scope with uncovered entries, as at shutdown). The
    /// caller waits for the fdatasync of each pending checkpoint's generation, then signs it with
    /// [`Log::sign_checkpoints`].
    pub fn due_checkpoints(&mut self, force: bool) -> Vec<PendingCheckpoint> {
        let now = Instant::now();
        let (rows, interval) = (self.cfg.checkpoint_rows, self.cfg.checkpoint_interval);
        let due: Vec<(String, u64, Hash)> = self
            .scopes
            .iter()
            .filter(|(_, st)| st.frontier.size() > st.covered)
            .filter(|(_, st)| {
                force
                    || st.frontier.size() - st.covered >= rows
                    || st
                        .uncovered_since
                        .is_some_and(|t| now.duration_since(t) >= interval)
            })
            .map(|(scope, st)| (scope.clone(), st.frontier.size(), st.frontier.root()))
            .collect();
        if due.is_empty() {
            return Vec::new();
        }
        let generation = self.syncer.committed();
        due.into_iter()
            .map(|(scope, size, root)| {
                let checkpoint = Checkpoint {
                    origin: self.origin(&scope),
                    size,
                    root,
                    time_ms: 0,
                };
                PendingCheckpoint {
                    scope,
                    checkpoint,
                    generation,
                }
            })
            .collect()
    }

    /// Signs and stores checkpoints whose entries are on disk.
    pub fn sign_checkpoints(&mut self, pending: Vec<PendingCheckpoint>) -> Result<(), AppendError> {
        if pending.is_empty() {
            return Ok(());
        }
        let name = self.note_name();
        let signer = self
            .signer
            .as_ref()
            .map_err(|e| AppendError::NoSigner(e.clone()))?;
        let hlc = self.hlc.next(now_ms());
        let tx = self.conn.unchecked_transaction().map_err(storage)?;
        let mut done = Vec::new();
        for mut p in pending {
            if self
                .scopes
                .get(&p.scope)
                .is_some_and(|st| st.covered >= p.checkpoint.size)
            {
                continue;
            }
            p.checkpoint.time_ms = hlc.wall_ms;
            let note = p.checkpoint.sign(&name, signer);
            tx.execute(
                "INSERT OR IGNORE INTO checkpoints (scope, size, note) VALUES (?1, ?2, ?3)",
                params![p.scope, p.checkpoint.size as i64, note],
            )
            .map_err(storage)?;
            tx.execute(
                "UPDATE scopes SET covered = ?2 WHERE scope = ?1",
                params![p.scope, p.checkpoint.size as i64],
            )
            .map_err(storage)?;
            done.push((p.scope, p.checkpoint.size));
        }
        persist_hlc(&tx, &hlc).map_err(storage)?;
        tx.commit().map_err(storage)?;
        self.hlc = hlc;
        for (scope, size) in done {
            if let Some(st) = self.scopes.get_mut(&scope) {
                st.covered = size;
                st.uncovered_since = (st.frontier.size() > size).then(Instant::now);
            }
        }
        self.syncer.committed();
        Ok(())
    }

    /// Checkpoints synchronously (library use, shutdown, rotation): fdatasync, then sign.
    pub fn checkpoint(&mut self, force: bool) -> Result<(), AppendError> {
        let pending = self.due_checkpoints(force);
        if pending.is_empty() {
            return Ok(());
        }
        self.syncer.sync_now().map_err(storage)?;
        self.sign_checkpoints(pending)
    }

    /// Rotates the signing key: every scope is checkpointed under the old key, a new key is
    /// written beside the old one, the registry gains its row and retires the old one
    /// (`valid_until`, `superseded_by`) in one transaction, the new file replaces the old, and a
    /// boot receipt signed by the new key names both.
    pub fn rotate(&mut self) -> Result<String, AppendError> {
        let old = self
            .signer
            .as_ref()
            .map(|s| s.keyid().to_owned())
            .map_err(|e| AppendError::NoSigner(e.clone()))?;
        self.checkpoint(true)?;
        let path = keys::key_path(&self.cfg.secrets_dir);
        let pending = path.with_extension("key.new");
        let _ = fs::remove_file(&pending);
        let new = Signer::generate().map_err(storage)?;
        new.save_new(&pending)
            .map_err(|e| storage(format!("writing {}: {e}", pending.display())))?;
        let at = self.hlc.next(now_ms());
        let tx = self.conn.unchecked_transaction().map_err(storage)?;
        store::insert_key(
            &tx,
            &KeyRow::for_signer(&new, &self.note_name(), at.wall_ms),
        )
        .map_err(storage)?;
        tx.execute(
            "UPDATE keys SET valid_until = ?2, superseded_by = ?3 WHERE keyid = ?1",
            params![old, at.wall_ms as i64, new.keyid()],
        )
        .map_err(storage)?;
        persist_hlc(&tx, &at).map_err(storage)?;
        tx.commit().map_err(storage)?;
        self.hlc = at;
        self.syncer.sync_now().map_err(storage)?;
        fs::rename(&pending, &path).map_err(|e| storage(format!("installing the new key: {e}")))?;
        if let Some(dir) = path.parent() {
            fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(storage)?;
        }
        let keyid = new.keyid().to_owned();
        self.signer = Ok(new);
        self.append_system(json!({"event": "rotate", "key": keyid, "previous": old}))?;
        tracing::info!(old = %old, new = %keyid, "rotated the receipt signing key");
        Ok(keyid)
    }

    // ---- reads ----

    pub fn scopes(&self) -> Vec<String> {
        let mut s: Vec<String> = self.scopes.keys().cloned().collect();
        s.sort();
        s
    }

    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.contains_key(scope)
    }

    pub fn size(&self, scope: &str) -> Option<u64> {
        self.scopes.get(scope).map(|s| s.frontier.size())
    }

    pub fn root(&self, scope: &str) -> Option<Hash> {
        self.scopes.get(scope).map(|s| s.frontier.root())
    }

    /// The scope's log: one canonical envelope per line.
    pub fn log_text(&self, scope: &str) -> anyhow::Result<Vec<u8>> {
        let mut out = Vec::new();
        for env in store::envelopes(&self.conn, scope, 0, u64::MAX >> 1)? {
            out.extend_from_slice(&env);
            out.push(b'\n');
        }
        Ok(out)
    }

    pub fn head(&self, scope: &str) -> anyhow::Result<Option<(u64, String)>> {
        Ok(store::head(&self.conn, scope)?)
    }

    /// `proof/inclusion/<seq>`: against the latest signed checkpoint.
    pub fn inclusion_proof(&self, scope: &str, seq: u64) -> anyhow::Result<Value> {
        let (size, note) = self
            .head(scope)?
            .ok_or_else(|| anyhow::anyhow!("scope {scope} has no checkpoint yet"))?;
        anyhow::ensure!(
            seq < size,
            "seq {seq} is not covered by the latest checkpoint (size {size})"
        );
        let leaves = store::leaf_hashes(&self.conn, scope, size)?;
        let path = merkle::inclusion_proof(seq as usize, &leaves);
        Ok(json!({
            "scope": scope, "seq": seq, "tree_size": size,
            "leaf_hash": hex::encode(leaves[seq as usize]),
            "path": path.iter().map(hex::encode).collect::<Vec<_>>(),
            "checkpoint": note,
        }))
    }

    /// `proof/consistency/<old>-<new>`: `new` must be a checkpointed size.
    pub fn consistency_proof(&self, scope: &str, old: u64, new: u64) -> anyhow::Result<Value> {
        let notes = store::checkpoints(&self.conn, scope, new)?;
        let new_note = notes
            .iter()
            .find(|n| crate::note::SignedNote::parse(n).is_ok_and(|p| p.checkpoint.size == new))
            .ok_or_else(|| anyhow::anyhow!("scope {scope} has no checkpoint of size {new}"))?;
        anyhow::ensure!(old >= 1 && old <= new, "old size {old} must be 1..={new}");
        let leaves = store::leaf_hashes(&self.conn, scope, new)?;
        let proof = merkle::consistency_proof(old as usize, &leaves);
        Ok(json!({
            "scope": scope, "old_size": old, "new_size": new,
            "old_root": hex::encode(merkle::root_of(&leaves[..old as usize])),
            "proof": proof.iter().map(hex::encode).collect::<Vec<_>>(),
            "checkpoint": new_note,
        }))
    }

    /// Stops the fsync thread after a final checkpoint.
    pub fn shutdown(&mut self) {
        if let Err(e) = self.checkpoint(true) {
            tracing::error!(error = %e, "final checkpoint failed");
        }
        let _ = self.syncer.sync_now();
        self.syncer.stop();
    }
}

/// The signing key must never sit under the data dir (which other tools may be granted): refuse
/// to start if the secrets dir is inside it, comparing resolved paths.
fn refuse_secrets_inside_data(data: &Path, secrets: &Path) -> anyhow::Result<()> {
    let data = data.canonicalize()?;
    // The secrets dir may not exist yet: resolve component by component, following symlinks
    // where the path exists.
    let abs = if secrets.is_absolute() {
        secrets.to_path_buf()
    } else {
        std::env::current_dir()?.join(secrets)
    };
    let mut resolved = PathBuf::new();
    for comp in abs.components() {
        match comp {
            Component::Normal(name) => {
                resolved.push(name);
                if let Ok(real) = resolved.canonicalize() {
                    resolved = real;
                }
            }
            Component::ParentDir => {
                resolved.pop();
            }
            Component::CurDir => {}
            other => resolved.push(other),
        }
    }
    anyhow::ensure!(
        !resolved.starts_with(&data),
        "the secrets dir {} is inside the data dir {}: the signing key must never be under it",
        resolved.display(),
        data.display()
    );
    Ok(())
}

fn persist_hlc(conn: &Connection, hlc: &Hlc) -> rusqlite::Result<()> {
    store::meta_set(conn, "hlc_wall", &hlc.wall_ms.to_string())?;
    store::meta_set(conn, "hlc_counter", &hlc.counter.to_string())
}

impl Drop for Log {
    /// The fsync thread syncs what is pending, then exits.
    fn drop(&mut self) {
        self.syncer.stop();
    }
}

fn base64_std(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
