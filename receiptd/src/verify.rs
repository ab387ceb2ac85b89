//! Export of one scope and its offline verification (what `warren verify` runs).
//!
//! An export is JSON lines: first every entry of the scope up to its latest checkpoint (each line
//! the canonical DSSE envelope, byte for byte as chained), then every checkpoint of the scope up
//! to that size (`{"checkpoint":"<signed note>"}`). Verification needs only the export and the
//! key registry. An export says nothing about entries after its last checkpoint: to require
//! them, the verifier gives a checkpoint it got elsewhere ([`Require::head`]) or a size
//! ([`Require::size`]), and an export that ends before it is refused ([`EXIT_INCOMPLETE`]).

use std::io::Write;
use std::path::Path;

use ed25519_dalek::Signature;
use sha2::{Digest, Sha256};

use crate::dsse::{self, Envelope, RECEIPT_PAYLOAD_TYPE};
use crate::keys::{KeyRow, Registry};
use crate::merkle::{self, Frontier};
use crate::note::{self, Checkpoint, SignedNote};
use crate::receipt::{Body, GENESIS_PREV, Hlc, Kind, parse_strict};
use crate::store;

/// Writes the export of `scope` from the receipts database at `db_path` (opened read-only, so it
/// runs beside a live receiptd). Entries past the latest checkpoint are left out: an export is as
/// fresh as the scope's head, at most one checkpoint interval behind. Returns the entry count.
pub fn export(db_path: &Path, scope: &str, out: &mut impl Write) -> anyhow::Result<u64> {
    let conn = store::open_ro(db_path)?;
    let tx = conn.unchecked_transaction()?;
    let (size, _) = store::head(&tx, scope)?
        .ok_or_else(|| anyhow::anyhow!("scope {scope:?} has no checkpoint (unknown scope?)"))?;
    for env in store::envelopes(&tx, scope, 0, size)? {
        out.write_all(&env)?;
        out.write_all(b"\n")?;
    }
    for note in store::checkpoints(&tx, scope, size)? {
        let line = warren_jcs::value_to_vec(&serde_json::json!({"checkpoint": note}))?;
        out.write_all(&line)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(size)
}

/// Writes the key registry of the database at `db_path` (the file `--keys` takes).
pub fn export_registry(db_path: &Path, out: &mut impl Write) -> anyhow::Result<()> {
    let conn = store::open_ro(db_path)?;
    out.write_all(&store::registry(&conn)?.to_bytes())?;
    Ok(())
}

pub const EXIT_VERIFIED: i32 = 0;
pub const EXIT_INVALID: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
/// Valid as far as it goes, but it ends before the checkpoint or size the verifier required.
pub const EXIT_INCOMPLETE: i32 = 3;
pub const EXIT_UNKNOWN_KEY: i32 = 5;
pub const EXIT_KEY_RETIRED: i32 = 6;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyOutcome {
    /// The process exit code: 0 verified, 1 invalid, 2 usage, 3 incomplete (ends before what
    /// [`Require`] asked for), 5 unknown key, 6 key used after its retirement.
    pub code: i32,
    /// What was verified, or the row and the reason it failed.
    pub message: String,
    pub entries: u64,
    pub checkpoints: u64,
}

struct Failure {
    code: i32,
    message: String,
}

/// `SEQ:HASH` (what [`Require::entry`] takes): a seq and a 64-hex-digit SHA-256.
pub fn parse_entry(arg: &str) -> Result<(u64, &str), String> {
    let (seq, hash) = arg
        .split_once(':')
        .ok_or_else(|| format!("{arg:?} is not SEQ:HASH"))?;
    let seq = seq.parse().map_err(|e| format!("seq {seq:?}: {e}"))?;
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("hash {hash:?} is not 64 hex digits"));
    }
    Ok((seq, hash))
}

/// `1 entry`, `2 entries`: a count with its noun in the right number.
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn invalid(message: String) -> Failure {
    Failure {
        code: EXIT_INVALID,
        message,
    }
}

/// What the verifier requires beyond a valid export: that it reach entries the verifier knows
/// exist from elsewhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct Require<'a> {
    /// A signed checkpoint (C2SP note) of the scope got elsewhere, e.g. its `head` read from
    /// `/receipts/<scope>/head` when the export was handed over: it must verify under the
    /// registry, the export must reach its size, and its root must be the root of the export's
    /// first that many entries.
    pub head: Option<&'a str>,
    /// The export must cover at least this many entries.
    pub size: Option<u64>,
    /// With `head`, for an export that ends before it: a consistency proof from the export's
    /// last checkpoint to the head, as `/receipts/<scope>/proof/consistency/<m>-<n>` serves it
    /// (JSON with `old_size`, `new_size` and `proof`). It cannot make the export complete; it
    /// shows whether the export's entries are the start of the head's log (left out after,
    /// not changed) or not (a different history).
    pub proof: Option<&'a str>,
    /// A cross-reference: the entry at this seq must have this hash (hex SHA-256 of its line, as
    /// the next entry's `prev` names it) and be covered by the verified checkpoint (`head`'s
    /// when given): what another host's `remote` receipt names as this host's decision.
    pub entry: Option<(u64, &'a str)>,
}

/// Verifies an export against a key registry. Never panics on any input.
pub fn verify(export: &[u8], registry: &[u8]) -> VerifyOutcome {
    verify_with(export, registry, Require::default())
}

/// [`verify`], then refuses an export that ends before what `require` names.
pub fn verify_with(export: &[u8], registry: &[u8], require: Require<'_>) -> VerifyOutcome {
    let registry = match Registry::parse(registry) {
        Ok(r) => r,
        Err(e) => {
            return VerifyOutcome {
                code: EXIT_USAGE,
                message: e,
                entries: 0,
                checkpoints: 0,
            };
        }
    };
    let mut v = Verifier {
        registry,
        scope: None,
        entries: 0,
        frontier: Frontier::default(),
        prev_hash: GENESIS_PREV.to_owned(),
        last_hlc: None,
        roots: Vec::new(),
        checkpoints: 0,
        covered: 0,
        in_checkpoints: false,
        wanted: require.entry.map(|(seq, _)| seq),
        wanted_hash: None,
    };
    match v.run(export).and_then(|()| v.require(require)) {
        Ok(reach) => VerifyOutcome {
            code: EXIT_VERIFIED,
            message: format!(
                "verified: scope {}, {} up to its checkpoint of size {}, {}; {reach}",
                v.scope.as_deref().unwrap_or("?"),
                counted(v.entries, "entry", "entries"),
                v.covered,
                counted(v.checkpoints, "checkpoint", "checkpoints")
            ),
            entries: v.entries,
            checkpoints: v.checkpoints,
        },
        Err(f) => VerifyOutcome {
            code: f.code,
            message: f.message,
            entries: v.entries,
            checkpoints: v.checkpoints,
        },
    }
}

struct Verifier {
    registry: Registry,
    scope: Option<String>,
    entries: u64,
    frontier: Frontier,
    prev_hash: String,
    last_hlc: Option<Hlc>,
    /// Root of the tree after each entry (index = size - 1).
    roots: Vec<merkle::Hash>,
    checkpoints: u64,
    covered: u64,
    in_checkpoints: bool,
    /// The seq of [`Require::entry`], and that entry's hash once read.
    wanted: Option<u64>,
    wanted_hash: Option<String>,
}

impl Verifier {
    fn run(&mut self, export: &[u8]) -> Result<(), Failure> {
        if export.is_empty() {
            return Err(invalid("the export is empty".into()));
        }
        if !export.ends_with(b"\n") {
            return Err(invalid(
                "the export does not end with a newline (truncated?)".into(),
            ));
        }
        for (i, line) in export[..export.len() - 1]
            .split(|b| *b == b'\n')
            .enumerate()
        {
            let row = i + 1;
            let value = parse_strict(line).map_err(|e| invalid(format!("line {row}: {e}")))?;
            let canonical = warren_jcs::value_to_vec(&value)
                .map_err(|e| invalid(format!("line {row}: {e}")))?;
            if canonical != line {
                return Err(invalid(format!(
                    "line {row}: not in RFC 8785 canonical form"
                )));
            }
            if let Some(note) = value.get("checkpoint") {
                self.in_checkpoints = true;
                let note = note
                    .as_str()
                    .filter(|_| value.as_object().is_some_and(|o| o.len() == 1))
                    .ok_or_else(|| {
                        invalid(format!(
                            "line {row}: a checkpoint line is {{\"checkpoint\": string}}"
                        ))
                    })?;
                self.checkpoint(row, note)?;
            } else {
                if self.in_checkpoints {
                    return Err(invalid(format!(
                        "line {row}: an entry after the checkpoints"
                    )));
                }
                let env: Envelope = serde_json::from_value(value)
                    .map_err(|e| invalid(format!("line {row}: envelope: {e}")))?;
                self.entry(row, line, &env)?;
            }
        }
        if self.entries == 0 {
            return Err(invalid("the export holds no entries".into()));
        }
        if self.covered != self.entries {
            return Err(invalid(format!(
                "the latest checkpoint covers {} of {} entries; the rest are not covered by a signature",
                self.covered, self.entries
            )));
        }
        Ok(())
    }

    fn key(&self, row: usize, keyid: &str) -> Result<&KeyRow, Failure> {
        self.registry.find(keyid).ok_or_else(|| Failure {
            code: EXIT_UNKNOWN_KEY,
            message: format!("line {row}: signed by key {keyid}, which the registry does not hold"),
        })
    }

    /// The key must have been in force at `at_ms` (valid_from and valid_until inclusive).
    fn check_window_at(at: &str, key: &KeyRow, at_ms: u64) -> Result<(), Failure> {
        if let Some(until) = key.valid_until
            && at_ms > until
        {
            return Err(Failure {
                code: EXIT_KEY_RETIRED,
                message: format!(
                    "{at}: signed at {at_ms} ms by key {}, retired at {until} ms (superseded by {})",
                    key.keyid,
                    key.superseded_by.as_deref().unwrap_or("nothing")
                ),
            });
        }
        if at_ms < key.valid_from {
            return Err(invalid(format!(
                "{at}: signed at {at_ms} ms by key {}, valid only from {} ms",
                key.keyid, key.valid_from
            )));
        }
        Ok(())
    }

    fn entry(&mut self, row: usize, line: &[u8], env: &Envelope) -> Result<(), Failure> {
        if env.payload_type != RECEIPT_PAYLOAD_TYPE {
            return Err(invalid(format!(
                "line {row}: payloadType {:?} is not {RECEIPT_PAYLOAD_TYPE}",
                env.payload_type
            )));
        }
        let payload = env
            .payload_bytes()
            .map_err(|e| invalid(format!("line {row}: payload: {e}")))?;
        let body: Body = serde_json::from_slice(&payload)
            .map_err(|e| invalid(format!("line {row}: body: {e}")))?;
        if body.canonical() != payload {
            return Err(invalid(format!(
                "line {row}: body is not in RFC 8785 canonical form"
            )));
        }
        let seq = self.entries;
        let at = format!("line {row} (scope {}, seq {})", body.scope, body.seq);
        match &self.scope {
            None => self.scope = Some(body.scope.clone()),
            Some(s) if *s != body.scope => {
                return Err(invalid(format!(
                    "{at}: scope differs from the export's {s}"
                )));
            }
            Some(_) => {}
        }
        if body.v != 1 {
            return Err(invalid(format!("{at}: body version {} is not 1", body.v)));
        }
        if body.seq != seq {
            return Err(invalid(format!(
                "{at}: expected seq {seq} (an entry is missing or out of order)"
            )));
        }
        if body.prev != self.prev_hash {
            return Err(invalid(format!(
                "{at}: prev {} is not the hash of the previous entry, {}",
                body.prev, self.prev_hash
            )));
        }
        if let Some(last) = &self.last_hlc
            && !body.hlc.is_after(last)
        {
            return Err(invalid(format!(
                "{at}: clock {}.{} does not follow {}.{}",
                body.hlc.wall_ms, body.hlc.counter, last.wall_ms, last.counter
            )));
        }
        if body.kind.signed() {
            let [sig] = env.signatures.as_slice() else {
                return Err(invalid(format!(
                    "{at}: a {} receipt needs exactly one signature, has {}",
                    body.kind,
                    env.signatures.len()
                )));
            };
            let key = self.key(row, &sig.keyid)?;
            let vk = key
                .verifying_key()
                .map_err(|e| invalid(format!("{at}: registry: {e}")))?;
            let raw =
                base64_decode(&sig.sig).map_err(|e| invalid(format!("{at}: signature: {e}")))?;
            let raw: [u8; 64] = raw
                .as_slice()
                .try_into()
                .map_err(|_| invalid(format!("{at}: signature is not 64 bytes")))?;
            vk.verify_strict(
                &dsse::pae(&env.payload_type, &payload),
                &Signature::from_bytes(&raw),
            )
            .map_err(|_| {
                invalid(format!(
                    "{at}: the signature does not verify under key {}",
                    key.keyid
                ))
            })?;
            Self::check_window_at(&format!("line {row}"), key, body.hlc.wall_ms)?;
        } else if body.kind == Kind::Query && !env.signatures.is_empty() {
            return Err(invalid(format!("{at}: query receipts are unsigned")));
        }
        self.prev_hash = hex::encode(Sha256::digest(line));
        if self.wanted == Some(self.entries) {
            self.wanted_hash = Some(self.prev_hash.clone());
        }
        self.frontier.push(merkle::leaf_hash(line));
        self.roots.push(self.frontier.root());
        self.last_hlc = Some(body.hlc);
        self.entries += 1;
        Ok(())
    }

    /// What the export reaches, checked against `require` (after [`Verifier::run`]).
    fn require(&self, require: Require<'_>) -> Result<String, Failure> {
        let mut reach = Vec::new();
        let mut signed = self.covered;
        if let Some(text) = require.head {
            let cp = self.signed_checkpoint("--head", text)?;
            signed = cp.size;
            if cp.size > self.covered {
                let prefix = match require.proof {
                    None => String::new(),
                    Some(proof) => {
                        self.consistent(proof, &cp)?;
                        format!(
                            "; the consistency proof shows its {} entries are the first of that log (the rest were left out, not changed)",
                            self.covered
                        )
                    }
                };
                return Err(Failure {
                    code: EXIT_INCOMPLETE,
                    message: format!(
                        "incomplete: the export ends at checkpoint size {}, but the checkpoint given with --head is of size {}: the {} entries after it are not in this export{prefix}",
                        self.covered,
                        cp.size,
                        cp.size - self.covered
                    ),
                });
            }
            if cp.size == 0 || cp.root != self.roots[cp.size as usize - 1] {
                return Err(invalid(format!(
                    "--head: the checkpoint of size {} does not match the export's first {} entries (a different log)",
                    cp.size, cp.size
                )));
            }
            reach.push(format!(
                "complete up to the checkpoint given with --head (size {})",
                cp.size
            ));
        }
        if let Some(size) = require.size {
            if size > self.covered {
                return Err(Failure {
                    code: EXIT_INCOMPLETE,
                    message: format!(
                        "incomplete: the export ends at checkpoint size {}, but --size requires {size} entries: {} are not in this export",
                        self.covered,
                        size - self.covered
                    ),
                });
            }
            reach.push(format!("holds the {size} entries --size requires"));
        }
        if let Some((seq, hash)) = require.entry {
            if seq >= signed {
                return Err(invalid(format!(
                    "--entry: entry {seq} is not under the checkpoint (size {signed})"
                )));
            }
            let found = self.wanted_hash.as_deref().unwrap_or_default();
            if !found.eq_ignore_ascii_case(hash) {
                return Err(invalid(format!(
                    "--entry: entry {seq} has hash {found}, not {hash}"
                )));
            }
            reach.push(format!(
                "entry {seq} has hash {found} under the checkpoint of size {signed}"
            ));
        }
        if reach.is_empty() {
            return Ok(
                "this export says nothing about entries after it (--head or --size require them)"
                    .into(),
            );
        }
        Ok(reach.join(", "))
    }

    /// `proof` (JSON) proves the tree of the export's `covered` entries is the start of `head`'s.
    fn consistent(&self, proof: &str, head: &Checkpoint) -> Result<(), Failure> {
        #[derive(serde::Deserialize)]
        struct Consistency {
            old_size: u64,
            new_size: u64,
            proof: Vec<String>,
        }
        let parsed: Consistency =
            serde_json::from_str(proof).map_err(|e| invalid(format!("--proof: {e}")))?;
        if (parsed.old_size, parsed.new_size) != (self.covered, head.size) {
            return Err(invalid(format!(
                "--proof: it is from size {} to {}, not from the export's {} to the head's {}",
                parsed.old_size, parsed.new_size, self.covered, head.size
            )));
        }
        let path = parsed
            .proof
            .iter()
            .map(|h| {
                hex::decode(h)
                    .ok()
                    .and_then(|b| merkle::Hash::try_from(b.as_slice()).ok())
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| invalid("--proof: a hash is not 32 bytes of hex".into()))?;
        let old_root = &self.roots[self.covered as usize - 1];
        if !merkle::verify_consistency(self.covered, head.size, old_root, &head.root, &path) {
            return Err(invalid(format!(
                "--proof: the consistency proof from size {} to {} does not verify: the export is not the start of the log the head signs",
                self.covered, head.size
            )));
        }
        Ok(())
    }

    fn checkpoint(&mut self, row: usize, text: &str) -> Result<(), Failure> {
        let cp = self.signed_checkpoint(&format!("line {row}"), text)?;
        if cp.size == 0 || cp.size > self.entries {
            return Err(invalid(format!(
                "line {row}: checkpoint of size {} but the export holds {} entries",
                cp.size, self.entries
            )));
        }
        if cp.size <= self.covered {
            return Err(invalid(format!(
                "line {row}: checkpoints out of order (size {} after {})",
                cp.size, self.covered
            )));
        }
        if cp.root != self.roots[cp.size as usize - 1] {
            return Err(invalid(format!(
                "line {row}: checkpoint root for size {} does not match the entries",
                cp.size
            )));
        }
        self.covered = cp.size;
        self.checkpoints += 1;
        Ok(())
    }

    /// A checkpoint of this export's scope, signed by a registry key within its window (`at`
    /// names it in errors).
    fn signed_checkpoint(&self, at: &str, text: &str) -> Result<Checkpoint, Failure> {
        let note = SignedNote::parse(text).map_err(|e| invalid(format!("{at}: {e}")))?;
        let cp = note.checkpoint.clone();
        let scope = self.scope.clone().unwrap_or_default();
        if !cp.origin.ends_with(&format!("/{scope}")) || !cp.origin.starts_with("warren.receipts/")
        {
            return Err(invalid(format!(
                "{at}: checkpoint origin {:?} is not this scope's",
                cp.origin
            )));
        }
        // The signer: a registry row whose note name and key hash match a signature line.
        let mut known = false;
        for (name, hash, _) in &note.signatures {
            for key in self.registry.keys.iter().filter(|k| k.note_name == *name) {
                let Ok(vk) = key.verifying_key() else {
                    continue;
                };
                if note::key_hash(name, &vk) != *hash {
                    continue;
                }
                known = true;
                if note.verify(name, &vk) {
                    if cp.origin != format!("{name}/{scope}") {
                        return Err(invalid(format!(
                            "{at}: checkpoint origin {:?} is not {name}/{scope}",
                            cp.origin
                        )));
                    }
                    Self::check_window_at(at, key, cp.time_ms)?;
                    return Ok(cp);
                }
            }
        }
        if known {
            Err(invalid(format!(
                "{at}: checkpoint signature does not verify"
            )))
        } else {
            Err(Failure {
                code: EXIT_UNKNOWN_KEY,
                message: format!("{at}: checkpoint signed by a key the registry does not hold"),
            })
        }
    }
}

fn base64_decode(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s)
}
