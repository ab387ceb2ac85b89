//! The SQLite schema and the read queries shared by the daemon's log and offline export.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::keys::{KeyRow, Registry};
use crate::merkle::Hash;

pub const DB_FILE: &str = "receipts.db";

/// The page size of a new database. `entries` is a WITHOUT ROWID table, whose rows SQLite keeps
/// in the page only up to about a quarter of it; at the default 4 KiB that is ~1 000 bytes, and
/// an envelope is 1.1-1.3 KiB, so every entry took an overflow page of its own (4.6 KiB on disk
/// per entry, and one more WAL frame per append). At 8 KiB an entry of up to ~2 000 bytes stays
/// in its leaf: measured with SQLite alone, 8 KiB commits an entry 15-30 % faster than 4 KiB and
/// 16 KiB, in 40 % less space (docs/decisions.md).
pub const PAGE_SIZE: u32 = 8 * 1024;

pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join(DB_FILE)
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS keys (
  keyid TEXT PRIMARY KEY, alg TEXT NOT NULL, public_key TEXT NOT NULL, note_name TEXT NOT NULL,
  valid_from INTEGER NOT NULL, valid_until INTEGER, superseded_by TEXT) STRICT;
CREATE TABLE IF NOT EXISTS scopes (
  scope TEXT PRIMARY KEY, size INTEGER NOT NULL, head TEXT NOT NULL, frontier BLOB NOT NULL,
  covered INTEGER NOT NULL, hlc_wall INTEGER NOT NULL, hlc_counter INTEGER NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS entries (
  scope TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, envelope BLOB NOT NULL,
  leaf_hash BLOB NOT NULL, PRIMARY KEY (scope, seq)) STRICT, WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
  scope TEXT NOT NULL, size INTEGER NOT NULL, note TEXT NOT NULL, PRIMARY KEY (scope, size)) STRICT;
";

/// Opens (creating, mode 0600) the receipts database for writing: WAL, synchronous as given.
/// The file, and its -wal and -shm if there, must be receiptd's own private files, not symlinks
/// (warren_daemon::dirs::open_own_file): a database another uid planted, or could write to, is
/// refused rather than adopted.
pub fn open_rw(path: &Path, synchronous: &str) -> Result<Connection, OpenError> {
    warren_daemon::dirs::check_own_database(path)?;
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_NOFOLLOW,
    )?;
    // Only a new database takes this (an existing one keeps its page size): see PAGE_SIZE.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", synchronous)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

/// Why [`open_rw`] failed: the file was refused, or SQLite failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Refused(#[from] std::io::Error),
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

/// Opens the database read-only (export, offline inspection).
pub fn open_ro(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_NOFOLLOW,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

pub fn meta_get(conn: &Connection, k: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row("SELECT v FROM meta WHERE k = ?1", [k], |r| r.get(0))
        .optional()
}

pub fn meta_set(conn: &Connection, k: &str, v: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO meta (k, v) VALUES (?1, ?2) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
    )?
    .execute([k, v])?;
    Ok(())
}

pub fn registry(conn: &Connection) -> rusqlite::Result<Registry> {
    let mut stmt = conn.prepare(
        "SELECT keyid, alg, public_key, note_name, valid_from, valid_until, superseded_by FROM keys ORDER BY valid_from, keyid")?;
    let keys = stmt
        .query_map([], |r| {
            Ok(KeyRow {
                keyid: r.get(0)?,
                alg: r.get(1)?,
                public_key: r.get(2)?,
                note_name: r.get(3)?,
                valid_from: r.get::<_, i64>(4)? as u64,
                valid_until: r.get::<_, Option<i64>>(5)?.map(|v| v as u64),
                superseded_by: r.get(6)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Registry { version: 1, keys })
}

pub fn insert_key(conn: &Connection, row: &KeyRow) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO keys (keyid, alg, public_key, note_name, valid_from, valid_until, superseded_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![row.keyid, row.alg, row.public_key, row.note_name, row.valid_from as i64, row.valid_until.map(|v| v as i64), row.superseded_by],
    )?;
    Ok(())
}

pub fn scopes(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached("SELECT scope FROM scopes ORDER BY scope")?;
    stmt.query_map([], |r| r.get(0))?.collect()
}

/// The canonical envelopes of `scope` with seq in [from, to).
pub fn envelopes(
    conn: &Connection,
    scope: &str,
    from: u64,
    to: u64,
) -> rusqlite::Result<Vec<Vec<u8>>> {
    let mut stmt = conn.prepare_cached(
        "SELECT envelope FROM entries WHERE scope = ?1 AND seq >= ?2 AND seq < ?3 ORDER BY seq",
    )?;
    stmt.query_map(params![scope, from as i64, to as i64], |r| r.get(0))?
        .collect()
}

/// The leaf hashes of the first `size` entries of `scope`.
pub fn leaf_hashes(conn: &Connection, scope: &str, size: u64) -> rusqlite::Result<Vec<Hash>> {
    let mut stmt = conn.prepare_cached(
        "SELECT leaf_hash FROM entries WHERE scope = ?1 AND seq < ?2 ORDER BY seq",
    )?;
    stmt.query_map(params![scope, size as i64], |r| {
        let b: Vec<u8> = r.get(0)?;
        b.try_into().map_err(|_| {
            rusqlite::Error::InvalidColumnType(0, "leaf_hash".into(), rusqlite::types::Type::Blob)
        })
    })?
    .collect()
}

/// The latest signed checkpoint of `scope`: (tree size, signed note).
pub fn head(conn: &Connection, scope: &str) -> rusqlite::Result<Option<(u64, String)>> {
    conn.prepare_cached(
        "SELECT size, note FROM checkpoints WHERE scope = ?1 ORDER BY size DESC LIMIT 1",
    )?
    .query_row([scope], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
    .optional()
}

/// Every checkpoint of `scope` up to `size`, oldest first.
pub fn checkpoints(conn: &Connection, scope: &str, max_size: u64) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT note FROM checkpoints WHERE scope = ?1 AND size <= ?2 ORDER BY size",
    )?;
    stmt.query_map(params![scope, max_size as i64], |r| r.get(0))?
        .collect()
}
