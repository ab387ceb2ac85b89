//! gate.db: pending asks, decisions, allow-once tokens, session grants and rules, in SQLite (WAL,
//! mode 0600, in the gate's own data dir). Ids are AUTOINCREMENT: never reused, even after a
//! delete or a restart.
//!
//! Why one file: one SQLite schema and the statements over it (each guarded `UPDATE` next to the
//! table it guards); about a third is its tests.

use std::cell::RefCell;
use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::policy::{Candidates, Rule, Selector, Verdict};

pub type Result<T> = std::result::Result<T, rusqlite::Error>;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS pending (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    fp TEXT NOT NULL,
    class TEXT NOT NULL,
    risk TEXT,
    basis TEXT NOT NULL,
    context TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    -- Set once the ask's decision receipt is acknowledged: only then is it listed or walkable.
    shown INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'answered', 'expired', 'orphaned')),
    outcome TEXT CHECK (outcome IN ('allow', 'deny')),
    outcome_basis TEXT,
    answer TEXT,
    answered_by TEXT,
    answered_ms INTEGER,
    -- Who asked: the caller's lineage as nsd gave it (JSON), and its sessions as `,s1,s2,…,`
    -- (self first) so a subtree's open asks are counted in one statement.
    lineage TEXT NOT NULL DEFAULT '',
    chain TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS pending_open ON pending (state, session);
-- Decisions are never deleted, so plain rowids are never reused either; AUTOINCREMENT would
-- cost a second page write (sqlite_sequence) on every decide.
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    tool TEXT NOT NULL,
    fp TEXT NOT NULL,
    verdict TEXT NOT NULL,
    basis TEXT NOT NULL,
    pending_id INTEGER,
    receipt TEXT,
    at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS once_tokens (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    fp TEXT NOT NULL,
    pending_id INTEGER,
    spent INTEGER NOT NULL DEFAULT 0,
    created_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS once_unspent ON once_tokens (fp, spent);
CREATE TABLE IF NOT EXISTS session_grants (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    fp TEXT NOT NULL,
    verdict TEXT NOT NULL CHECK (verdict IN ('allow', 'deny')),
    pending_id INTEGER,
    created_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS grants_by_call ON session_grants (session, fp);
CREATE TABLE IF NOT EXISTS rules (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    verdict TEXT NOT NULL CHECK (verdict IN ('allow', 'ask', 'deny')),
    selector TEXT NOT NULL,
    origin TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
";

/// A pending ask as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingRow {
    pub id: i64,
    pub session: String,
    pub tool: String,
    pub args: String,
    pub fp: String,
    pub class: String,
    pub risk: Option<String>,
    pub basis: String,
    pub context: String,
    pub created_ms: i64,
    pub expires_ms: i64,
    pub state: String,
    pub outcome: Option<String>,
    pub outcome_basis: Option<String>,
    pub answer: Option<String>,
    /// Whether the ask has been shown (its receipt was acknowledged).
    pub shown: bool,
    /// The caller's lineage (JSON; empty when none came with the call).
    pub lineage: String,
}

/// A new ask, before it has an id.
pub struct NewPending<'a> {
    pub session: &'a str,
    pub tool: &'a str,
    pub args: &'a str,
    pub fp: &'a str,
    pub class: &'a str,
    pub risk: Option<&'a str>,
    pub basis: &'a str,
    pub context: &'a str,
    pub created_ms: i64,
    pub expires_ms: i64,
    /// The caller's lineage as JSON, and its sessions as `,s1,s2,…,` (see [`chain_key`]).
    pub lineage: &'a str,
    pub chain: &'a str,
}

/// How an open ask was closed.
pub struct Closing<'a> {
    pub state: &'static str,
    pub outcome: Verdict,
    pub basis: &'a str,
    pub answer: &'a str,
    pub by: &'a str,
    pub at_ms: i64,
}

/// The two lookups every decide makes. No ORDER BY, LIMIT or max(): with them this SQLite
/// (STAT4) re-prepares the statement whenever a parameter changes — about a quarter of a decide's
/// own cost, measured — so the order is made in Rust instead.
const SESSION_GRANTS_SQL: &str =
    "SELECT id, verdict FROM session_grants WHERE session = ?1 AND fp = ?2";
const UNSPENT_TOKENS_SQL: &str = "SELECT id FROM once_tokens WHERE fp = ?1 AND spent = 0";

/// A rule with where it came from.
#[derive(Clone, Debug)]
pub struct StoredRule {
    pub rule: Rule,
    pub origin: String,
}

/// A decision as gate.db keeps it for the operator's audit. The decision receipt, written
/// before the answer, is the durable record; these rows are written in batches by the gate's
/// flusher a few milliseconds later, so they cost no commit on the call's path (a kill -9 may
/// lose the last few milliseconds of rows, never a receipt).
#[derive(Clone, Debug)]
pub struct DecisionRow {
    pub session: String,
    pub tool: String,
    pub fp: String,
    pub verdict: Verdict,
    pub basis: String,
    pub pending_id: Option<i64>,
    pub receipt: Option<String>,
    pub at_ms: i64,
}

pub struct Store {
    conn: Connection,
    /// The rules, read once: with the database opened exclusively, no one else can change them.
    rules_cache: RefCell<Option<Vec<StoredRule>>>,
    cache_rules: bool,
    /// Decisions not yet in the `decisions` table.
    queued: RefCell<Vec<DecisionRow>>,
}

impl Store {
    /// Opens (creating, mode 0600) the database at `path`, shared: other connections (tests of
    /// concurrent spending) may open it too.
    pub fn open(path: &Path) -> anyhow::Result<Store> {
        Store::open_with(path, false)
    }

    /// Opens the database for the daemon alone: SQLite's exclusive locking mode, so a transaction
    /// takes no file locks and keeps no shared-memory index (measured: about a third of the
    /// gate's own cost per decide), and a second gate on the same data dir cannot open it.
    pub fn open_exclusive(path: &Path) -> anyhow::Result<Store> {
        Store::open_with(path, true)
    }

    fn open_with(path: &Path, exclusive: bool) -> anyhow::Result<Store> {
        warren_daemon::dirs::check_own_database(path)?;
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )?;
        if exclusive {
            // Before the first WAL access, so the wal-index lives in heap memory.
            conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
        }
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        add_columns(&conn)?;
        conn.execute_batch(SCHEMA)?;
        Ok(Store {
            conn,
            rules_cache: RefCell::new(None),
            cache_rules: exclusive,
            queued: RefCell::new(Vec::new()),
        })
    }

    /// What the policy consults for one call.
    pub fn candidates(&self, session: &str, fp: &str) -> Result<Candidates> {
        let mut stmt = self.conn.prepare_cached(SESSION_GRANTS_SQL)?;
        let mut session_grants = stmt
            .query_map(params![session, fp], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })?
            .map(|r| r.map(|(id, v)| (id, v.parse().unwrap_or(Verdict::Deny))))
            .collect::<Result<Vec<_>>>()?;
        session_grants.sort_unstable_by_key(|(id, _)| *id);
        let allow_once = self
            .conn
            .prepare_cached(UNSPENT_TOKENS_SQL)?
            .query_map(params![fp], |r| r.get::<_, i64>(0))?
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .max();
        let rules = self.rules()?.into_iter().map(|r| r.rule).collect();
        Ok(Candidates {
            session: session_grants,
            allow_once,
            rules,
        })
    }

    /// Spends the allow-once token `id`; `true` for the one caller that spent it.
    pub fn spend_token(&self, id: i64) -> Result<bool> {
        let spent: Option<i64> = self
            .conn
            .prepare_cached(
                "UPDATE once_tokens SET spent = 1 WHERE id = ?1 AND spent = 0 RETURNING id",
            )?
            .query_row(params![id], |r| r.get(0))
            .optional()?;
        Ok(spent.is_some())
    }

    /// Spends the oldest unspent allow-once token for `fp`, in one statement: of any number of
    /// concurrent callers (on any connections to the file) exactly one gets each token.
    pub fn spend_once(&self, fp: &str) -> Result<Option<i64>> {
        self.conn
            .prepare_cached(
                "UPDATE once_tokens SET spent = 1 \
                 WHERE id = (SELECT id FROM once_tokens WHERE fp = ?1 AND spent = 0 ORDER BY id LIMIT 1) AND spent = 0 \
                 RETURNING id",
            )?
            .query_row(params![fp], |r| r.get(0))
            .optional()
    }

    pub fn add_once_token(&self, fp: &str, pending_id: Option<i64>, now_ms: i64) -> Result<i64> {
        self.conn.execute(
            "INSERT INTO once_tokens (fp, pending_id, created_ms) VALUES (?1, ?2, ?3)",
            params![fp, pending_id, now_ms],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    pub fn add_session_grant(
        &self,
        session: &str,
        fp: &str,
        verdict: Verdict,
        pending_id: Option<i64>,
        now_ms: i64,
    ) -> Result<i64> {
        self.conn.execute(
            "INSERT INTO session_grants (session, fp, verdict, pending_id, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![session, fp, verdict.as_str(), pending_id, now_ms],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    pub fn rules(&self) -> Result<Vec<StoredRule>> {
        if let Some(rules) = self.rules_cache.borrow().as_ref() {
            return Ok(rules.clone());
        }
        let rules = self.read_rules()?;
        if self.cache_rules {
            *self.rules_cache.borrow_mut() = Some(rules.clone());
        }
        Ok(rules)
    }

    fn read_rules(&self) -> Result<Vec<StoredRule>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id, verdict, selector, origin FROM rules ORDER BY id")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, verdict, selector, origin) = row?;
            // Rows are written only from parsed edits; one that no longer parses is skipped
            // loudly rather than guessed at.
            match (verdict.parse::<Verdict>(), selector.parse::<Selector>()) {
                (Ok(verdict), Ok(selector)) => out.push(StoredRule {
                    rule: Rule {
                        id,
                        verdict,
                        selector,
                    },
                    origin,
                }),
                _ => tracing::error!(id, "rule row does not parse; ignored"),
            }
        }
        Ok(out)
    }

    pub fn add_rule(
        &self,
        verdict: Verdict,
        selector: &Selector,
        origin: &str,
        now_ms: i64,
    ) -> Result<i64> {
        self.rules_cache.replace(None);
        self.conn.execute(
            "INSERT INTO rules (verdict, selector, origin, created_ms) VALUES (?1, ?2, ?3, ?4)",
            params![verdict.as_str(), selector.to_string(), origin, now_ms],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    pub fn delete_rule(&self, id: i64) -> Result<bool> {
        self.rules_cache.replace(None);
        Ok(self
            .conn
            .execute("DELETE FROM rules WHERE id = ?1", params![id])?
            == 1)
    }

    pub fn insert_pending(&self, p: &NewPending<'_>) -> Result<i64> {
        self.conn.execute(
            "INSERT INTO pending (session, tool, args, fp, class, risk, basis, context, created_ms, expires_ms, lineage, chain) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![p.session, p.tool, p.args, p.fp, p.class, p.risk, p.basis, p.context, p.created_ms, p.expires_ms, p.lineage, p.chain],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Open asks of `session`'s subtree: its own, and those of every namespace it cloned (at
    /// any depth).
    pub fn open_asks_in_subtree(&self, session: &str) -> Result<usize> {
        self.conn
            .prepare_cached(
                "SELECT COUNT(*) FROM pending WHERE state = 'open' AND (session = ?1 OR instr(chain, ?2) > 0)",
            )?
            .query_row(params![session, format!(",{session},")], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n as usize)
    }

    pub fn open_asks(&self, session: &str) -> Result<usize> {
        self.conn
            .prepare_cached("SELECT COUNT(*) FROM pending WHERE state = 'open' AND session = ?1")?
            .query_row(params![session], |r| r.get::<_, i64>(0))
            .map(|n| n as usize)
    }

    pub fn pending(&self, id: i64) -> Result<Option<PendingRow>> {
        self.conn
            .prepare_cached(&format!("SELECT {PENDING_COLS} FROM pending WHERE id = ?1"))?
            .query_row(params![id], pending_row)
            .optional()
    }

    /// Every open ask, oldest first.
    pub fn open_pending(&self) -> Result<Vec<PendingRow>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {PENDING_COLS} FROM pending WHERE state = 'open' ORDER BY id"
        ))?;
        stmt.query_map([], pending_row)?.collect()
    }

    /// Marks an ask shown: its receipt is written, so it may be listed and answered.
    pub fn mark_shown(&self, id: i64) -> Result<()> {
        self.conn
            .execute("UPDATE pending SET shown = 1 WHERE id = ?1", params![id])?;
        Ok(())
    }

    /// Closes an open ask; `false` if it was not open (answered, expired or orphaned already).
    pub fn close_pending(&self, id: i64, c: &Closing<'_>) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE pending SET state = ?2, outcome = ?3, outcome_basis = ?4, answer = ?5, answered_by = ?6, answered_ms = ?7 \
             WHERE id = ?1 AND state = 'open'",
            params![id, c.state, c.outcome.as_str(), c.basis, c.answer, c.by, c.at_ms],
        )?;
        Ok(n == 1)
    }

    /// Runs `f` in one write transaction (BEGIN IMMEDIATE).
    pub fn transaction<T>(&mut self, f: impl FnOnce(&Store) -> Result<T>) -> Result<T> {
        // Cached statements: every decide runs one of these transactions.
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let done = f(self).and_then(|v| {
            self.conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(v)
        });
        if done.is_err() {
            let _ = self.conn.execute_batch("ROLLBACK");
            // Rolled back: the rules may be as they were.
            self.rules_cache.replace(None);
        }
        done
    }

    /// Queues a decision for the `decisions` table (see [`DecisionRow`]).
    pub fn queue_decision(&self, row: DecisionRow) {
        self.queued.borrow_mut().push(row);
    }

    /// Writes the queued decision rows, all in one transaction (the gate's flusher, a few
    /// milliseconds after a decide, and at shutdown). On failure they stay queued.
    pub fn flush_decisions(&mut self) -> Result<()> {
        let rows = self.queued.take();
        if rows.is_empty() {
            return Ok(());
        }
        let written = self.transaction(|s| s.insert_decisions(&rows));
        if written.is_err() {
            let mut again = rows;
            again.append(&mut self.queued.borrow_mut());
            self.queued.replace(again);
        }
        written
    }

    fn insert_decisions(&self, rows: &[DecisionRow]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut stmt = self.conn.prepare_cached(
            "INSERT INTO decisions (session, tool, fp, verdict, basis, pending_id, receipt, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        for d in rows {
            stmt.execute(params![
                d.session,
                d.tool,
                d.fp,
                d.verdict.as_str(),
                d.basis,
                d.pending_id,
                d.receipt,
                d.at_ms
            ])?;
        }
        Ok(())
    }

    /// How many decisions the `decisions` table holds (tests).
    pub fn recorded_decisions(&self) -> Result<i64> {
        self.conn
            .query_row("SELECT COUNT(*) FROM decisions", [], |r| r.get(0))
    }

    /// The open asks whose expiry is at or before `now_ms`.
    pub fn due(&self, now_ms: i64) -> Result<Vec<i64>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id FROM pending WHERE state = 'open' AND expires_ms <= ?1 ORDER BY id",
        )?;
        stmt.query_map(params![now_ms], |r| r.get(0))?.collect()
    }

    /// The earliest expiry among open asks.
    pub fn next_expiry(&self) -> Result<Option<i64>> {
        self.conn
            .prepare_cached("SELECT MIN(expires_ms) FROM pending WHERE state = 'open'")?
            .query_row([], |r| r.get(0))
    }
}

const PENDING_COLS: &str = "id, session, tool, args, fp, class, risk, basis, context, created_ms, expires_ms, state, outcome, outcome_basis, answer, shown, lineage";

/// A lineage's sessions as the `chain` column keeps them: `,s1,s2,…,`.
pub fn chain_key<'a>(sessions: impl Iterator<Item = &'a str>) -> String {
    let mut out = String::from(",");
    for s in sessions {
        out.push_str(s);
        out.push(',');
    }
    out
}

/// Columns added since gate.db was first made: a database from before them gets them (empty).
fn add_columns(conn: &Connection) -> Result<()> {
    let has_pending: bool = conn
        .prepare("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'pending'")?
        .query_row([], |r| r.get::<_, i64>(0))?
        > 0;
    if !has_pending {
        return Ok(());
    }
    let cols: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('pending')")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_>>()?;
    for col in ["lineage", "chain"] {
        if !cols.iter().any(|c| c == col) {
            conn.execute_batch(&format!(
                "ALTER TABLE pending ADD COLUMN {col} TEXT NOT NULL DEFAULT ''"
            ))?;
        }
    }
    Ok(())
}

fn pending_row(r: &rusqlite::Row<'_>) -> Result<PendingRow> {
    Ok(PendingRow {
        id: r.get(0)?,
        session: r.get(1)?,
        tool: r.get(2)?,
        args: r.get(3)?,
        fp: r.get(4)?,
        class: r.get(5)?,
        risk: r.get(6)?,
        basis: r.get(7)?,
        context: r.get(8)?,
        created_ms: r.get(9)?,
        expires_ms: r.get(10)?,
        state: r.get(11)?,
        outcome: r.get(12)?,
        outcome_basis: r.get(13)?,
        answer: r.get(14)?,
        shown: r.get(15)?,
        lineage: r.get(16)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::sync::{Arc, Barrier};

    /// The statements every decide runs are prepared once, not again for each call's values
    /// (an ORDER BY or a max() makes this SQLite re-prepare them whenever a parameter changes).
    /// `spend_once` keeps its ORDER BY: it runs once per answered ask, not per decide.
    #[test]
    fn the_decide_statements_are_not_re_prepared_per_call() {
        let (_d, path) = temp_db();
        let mut st = Store::open_exclusive(&path).unwrap();
        for i in 0..4 {
            st.transaction(|s| s.candidates(&format!("session{i}"), &format!("fp{i}")))
                .unwrap();
        }
        for q in [SESSION_GRANTS_SQL, UNSPENT_TOKENS_SQL] {
            let stmt = st.conn.prepare_cached(q).unwrap();
            let n = stmt.get_status(rusqlite::StatementStatus::RePrepare);
            assert_eq!(n, 0, "{q} re-prepared {n} times");
        }
    }

    /// A `gate.db` another uid made (0666), a symlink in its place or a -wal of theirs is
    /// refused, never adopted (the tests run as root, as CI does).
    #[test]
    fn a_database_another_user_planted_is_refused() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root (CI runs as root)"
        );
        let plant = |p: &Path, mode: u32, uid: u32| {
            std::fs::write(p, b"").unwrap();
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
            std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
        };
        let (dir, path) = temp_db();
        plant(&path, 0o666, 4242);
        let err = Store::open_exclusive(&path)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("owner uid 4242"), "{err}");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (4242, 0o666));
        std::fs::remove_file(&path).unwrap();
        let elsewhere = dir.path().join("elsewhere.db");
        plant(&elsewhere, 0o600, 0);
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let err = Store::open_exclusive(&path)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("symlink"), "{err}");
        assert_eq!(std::fs::metadata(&elsewhere).unwrap().len(), 0);
        std::fs::remove_file(&path).unwrap();
        plant(&dir.path().join("gate.db-wal"), 0o644, 4242);
        let err = Store::open_exclusive(&path)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("gate.db-wal"), "{err}");
        std::fs::remove_file(dir.path().join("gate.db-wal")).unwrap();
        Store::open_exclusive(&path).unwrap();
    }

    fn temp_db() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::Builder::new()
            .prefix("gate-store")
            .tempdir_in("/tmp")
            .unwrap();
        let path = dir.path().join("gate.db");
        (dir, path)
    }

    fn row(n: i64) -> DecisionRow {
        DecisionRow {
            session: "s".into(),
            tool: "echo".into(),
            fp: "fp".into(),
            verdict: Verdict::Allow,
            basis: "default:read".into(),
            pending_id: None,
            receipt: None,
            at_ms: n,
        }
    }

    /// Queued decision rows are written by a flush, all of them, once.
    #[test]
    fn queued_decisions_are_written_by_the_flush() {
        let (_d, path) = temp_db();
        let mut store = Store::open_exclusive(&path).unwrap();
        store.queue_decision(row(1));
        store.queue_decision(row(2));
        store.transaction(|s| s.open_asks("s")).unwrap();
        assert_eq!(store.recorded_decisions().unwrap(), 0);
        store.flush_decisions().unwrap();
        assert_eq!(store.recorded_decisions().unwrap(), 2);
        store.flush_decisions().unwrap();
        assert_eq!(store.recorded_decisions().unwrap(), 2);
    }

    /// The exclusive store caches the rules; every edit, and a rolled-back one, is seen next.
    #[test]
    fn cached_rules_follow_every_edit() {
        let (_d, path) = temp_db();
        let mut store = Store::open_exclusive(&path).unwrap();
        assert!(store.rules().unwrap().is_empty());
        let id = store
            .add_rule(Verdict::Deny, &Selector::All, "test", 0)
            .unwrap();
        assert_eq!(store.rules().unwrap().len(), 1);
        let failed: Result<()> = store.transaction(|s| {
            s.add_rule(Verdict::Allow, &Selector::All, "test", 0)?;
            assert_eq!(s.rules()?.len(), 2);
            Err(rusqlite::Error::QueryReturnedNoRows)
        });
        assert!(failed.is_err());
        assert_eq!(
            store.rules().unwrap().len(),
            1,
            "a rolled-back rule is still seen"
        );
        assert!(store.delete_rule(id).unwrap());
        assert!(store.rules().unwrap().is_empty());
    }

    #[test]
    fn the_file_is_0600_and_ids_are_never_reused() {
        let (_d, path) = temp_db();
        let store = Store::open(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let a = store
            .add_rule(Verdict::Deny, &Selector::All, "test", 0)
            .unwrap();
        assert!(store.delete_rule(a).unwrap());
        drop(store);
        let store = Store::open(&path).unwrap();
        let b = store
            .add_rule(Verdict::Deny, &Selector::All, "test", 0)
            .unwrap();
        assert!(b > a, "id {a} was reused as {b}");
    }

    /// Two connections to one file, many threads: each token is spent exactly once.
    #[test]
    fn an_allow_once_is_spent_exactly_once_across_connections() {
        let (_d, path) = temp_db();
        let setup = Store::open(&path).unwrap();
        const ROUNDS: usize = 50;
        for _ in 0..ROUNDS {
            setup.add_once_token("fp", None, 0).unwrap();
        }
        let barrier = Arc::new(Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let path = path.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let store = Store::open(&path).unwrap();
                    barrier.wait();
                    let mut got = Vec::new();
                    while let Some(id) = store.spend_once("fp").unwrap() {
                        got.push(id);
                    }
                    got
                })
            })
            .collect();
        let mut all: Vec<i64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(
            (n, all.len()),
            (ROUNDS, ROUNDS),
            "a token was spent twice or not at all"
        );
        assert_eq!(setup.spend_once("fp").unwrap(), None);
    }

    /// The exactly-once check can fail: a planted two-step spend (read, then write without the
    /// `spent = 0` guard), interleaved by a barrier, spends one token twice and is caught.
    #[test]
    fn a_planted_two_step_spend_is_caught_spending_twice() {
        let (_d, path) = temp_db();
        Store::open(&path)
            .unwrap()
            .add_once_token("fp", None, 0)
            .unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let store = Store::open(&path).unwrap();
                    let id: Option<i64> = store
                        .conn
                        .query_row(
                            "SELECT id FROM once_tokens WHERE fp = 'fp' AND spent = 0",
                            [],
                            |r| r.get(0),
                        )
                        .optional()
                        .unwrap();
                    barrier.wait();
                    let id = id?;
                    let n = store
                        .conn
                        .execute(
                            "UPDATE once_tokens SET spent = 1 WHERE id = ?1",
                            params![id],
                        )
                        .unwrap();
                    (n == 1).then_some(id)
                })
            })
            .collect();
        let spent: Vec<i64> = threads
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(
            spent.len(),
            2,
            "the planted spend should have spent one token twice"
        );
        let mut distinct = spent.clone();
        distinct.dedup();
        assert_ne!(
            spent.len(),
            distinct.len(),
            "the exactly-once check (n == distinct) catches it"
        );
    }

    #[test]
    fn a_closed_ask_cannot_be_closed_again() {
        let (_d, path) = temp_db();
        let store = Store::open(&path).unwrap();
        let id = store
            .insert_pending(&NewPending {
                session: "s",
                tool: "shell",
                args: "{}",
                fp: "f",
                class: "exec",
                risk: None,
                basis: "default:exec",
                context: "",
                created_ms: 0,
                expires_ms: 10,
                lineage: "",
                chain: "",
            })
            .unwrap();
        assert_eq!(store.due(9).unwrap(), Vec::<i64>::new());
        assert_eq!(store.due(10).unwrap(), vec![id]);
        let close = |state| Closing {
            state,
            outcome: Verdict::Deny,
            basis: "x",
            answer: "deny",
            by: "t",
            at_ms: 1,
        };
        assert!(store.close_pending(id, &close("orphaned")).unwrap());
        assert!(!store.close_pending(id, &close("answered")).unwrap());
        assert_eq!(store.pending(id).unwrap().unwrap().state, "orphaned");
    }
}
