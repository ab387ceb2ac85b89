//! Checkpoints in the C2SP tlog-checkpoint format, signed as a C2SP signed note:
//!
//! ```text
//! <origin>\n<tree size>\n<base64 root hash>\ntime <unix ms>\n\n— <name> <base64(keyhash4 || sig)>\n
//! ```
//!
//! The Ed25519 signature is over the note text (every line up to and including the newline
//! before the blank line); the key hash is SHA-256(name || 0x0A || 0x01 || public key)[..4].
//! `time` is an extension line: when the checkpoint was signed, so a verifier can hold the key's
//! validity window against it.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{Signature, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::keys::Signer;
use crate::merkle::Hash;

/// The signature type byte of Ed25519 in signed notes.
const SIG_TYPE_ED25519: u8 = 0x01;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
    pub time_ms: u64,
}

impl Checkpoint {
    pub fn text(&self) -> String {
        format!(
            "{}\n{}\n{}\ntime {}\n",
            self.origin,
            self.size,
            STANDARD.encode(self.root),
            self.time_ms
        )
    }

    /// The signed note: text, blank line, one signature line.
    pub fn sign(&self, name: &str, signer: &Signer) -> String {
        let text = self.text();
        let mut blob = key_hash(name, &signer.public()).to_vec();
        blob.extend_from_slice(&signer.sign(text.as_bytes()));
        format!("{text}\n\u{2014} {name} {}\n", STANDARD.encode(blob))
    }
}

/// SHA-256(name || "\n" || 0x01 || public key)[..4].
pub fn key_hash(name: &str, key: &VerifyingKey) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([b'\n', SIG_TYPE_ED25519]);
    h.update(key.as_bytes());
    let d: [u8; 32] = h.finalize().into();
    [d[0], d[1], d[2], d[3]]
}

/// A parsed signed note: the checkpoint and its signature lines (name, key hash, signature).
#[derive(Clone, Debug)]
pub struct SignedNote {
    pub checkpoint: Checkpoint,
    pub text: String,
    pub signatures: Vec<(String, [u8; 4], [u8; 64])>,
}

impl SignedNote {
    pub fn parse(note: &str) -> Result<SignedNote, String> {
        let (text, sigs) = note
            .split_once("\n\n")
            .ok_or("checkpoint: no blank line before the signatures")?;
        let text = format!("{text}\n");
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() < 3 {
            return Err("checkpoint: fewer than three lines".into());
        }
        let origin = lines[0].to_owned();
        if origin.is_empty() {
            return Err("checkpoint: empty origin".into());
        }
        let size: u64 = lines[1]
            .parse()
            .map_err(|_| format!("checkpoint: tree size {:?} is not a number", lines[1]))?;
        if size.to_string() != lines[1] {
            return Err(format!(
                "checkpoint: tree size {:?} is not in canonical decimal",
                lines[1]
            ));
        }
        let root = STANDARD
            .decode(lines[2])
            .map_err(|e| format!("checkpoint: root hash: {e}"))?;
        let root: Hash = root
            .as_slice()
            .try_into()
            .map_err(|_| "checkpoint: root hash is not 32 bytes")?;
        if lines.len() != 4 {
            return Err("checkpoint: expected exactly one extension line (time)".into());
        }
        let time_ms: u64 = lines[3]
            .strip_prefix("time ")
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| {
                format!(
                    "checkpoint: extension line {:?} is not `time <ms>`",
                    lines[3]
                )
            })?;
        let checkpoint = Checkpoint {
            origin,
            size,
            root,
            time_ms,
        };
        if checkpoint.text() != text {
            return Err("checkpoint: text is not in canonical form".into());
        }
        if !sigs.ends_with('\n') {
            return Err("checkpoint: signature block does not end in a newline".into());
        }
        let mut signatures = Vec::new();
        for line in sigs.lines() {
            let rest = line.strip_prefix("\u{2014} ").ok_or_else(|| {
                format!("checkpoint: signature line {line:?} does not start with an em dash")
            })?;
            let (name, b64) = rest
                .rsplit_once(' ')
                .ok_or("checkpoint: signature line has no signature")?;
            let blob = STANDARD
                .decode(b64)
                .map_err(|e| format!("checkpoint: signature: {e}"))?;
            if blob.len() != 68 {
                return Err(format!(
                    "checkpoint: signature is {} bytes, not 4 + 64",
                    blob.len()
                ));
            }
            signatures.push((
                name.to_owned(),
                blob[..4].try_into().expect("4"),
                blob[4..].try_into().expect("64"),
            ));
        }
        if signatures.is_empty() {
            return Err("checkpoint: no signature".into());
        }
        Ok(SignedNote {
            checkpoint,
            text,
            signatures,
        })
    }

    /// Verifies the first signature line made by `key` under `name`.
    pub fn verify(&self, name: &str, key: &VerifyingKey) -> bool {
        let hash = key_hash(name, key);
        self.signatures
            .iter()
            .filter(|(n, h, _)| n == name && *h == hash)
            .any(|(_, _, sig)| {
                key.verify_strict(self.text.as_bytes(), &Signature::from_bytes(sig))
                    .is_ok()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_note_roundtrip_and_tamper() {
        let signer = Signer::generate().unwrap();
        let cp = Checkpoint {
            origin: "warren.receipts/n/s".into(),
            size: 7,
            root: [9; 32],
            time_ms: 5,
        };
        let note = cp.sign("warren.receipts/n", &signer);
        let parsed = SignedNote::parse(&note).unwrap();
        assert_eq!(parsed.checkpoint, cp);
        assert!(parsed.verify("warren.receipts/n", &signer.public()));
        let tampered = note.replacen("\n7\n", "\n8\n", 1);
        assert!(
            !SignedNote::parse(&tampered)
                .unwrap()
                .verify("warren.receipts/n", &signer.public())
        );
    }
}
