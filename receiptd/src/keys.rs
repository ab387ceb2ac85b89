//! Signing keys: generation, the key file in the secrets dir, RFC 7638 thumbprints, and the public
//! key registry (the file `warren verify --keys` takes).

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The only algorithm a registry row may name in this version.
pub const ALG_ED25519: &str = "Ed25519";

/// The key file name inside the secrets dir's `receiptd/` directory.
pub const KEY_FILE: &str = "signing.key";

/// RFC 7638 thumbprint of the OKP JWK of an Ed25519 public key: base64url(SHA-256 of the JSON
/// object with exactly the required members crv, kty, x in lexicographic order, no whitespace).
pub fn thumbprint(key: &VerifyingKey) -> String {
    let x = URL_SAFE_NO_PAD.encode(key.as_bytes());
    let jwk = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
    URL_SAFE_NO_PAD.encode(Sha256::digest(jwk.as_bytes()))
}

/// A signer: the private key and its id. Only receiptd's uid can read the file it came from.
pub struct Signer {
    key: SigningKey,
    keyid: String,
}

impl Signer {
    pub fn from_seed(seed: [u8; 32]) -> Signer {
        let key = SigningKey::from_bytes(&seed);
        let keyid = thumbprint(&key.verifying_key());
        Signer { key, keyid }
    }

    /// A fresh key from the kernel's CSPRNG.
    pub fn generate() -> std::io::Result<Signer> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| std::io::Error::other(format!("getrandom: {e}")))?;
        Ok(Signer::from_seed(seed))
    }

    pub fn keyid(&self) -> &str {
        &self.keyid
    }

    pub fn public(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        self.key.sign(msg).to_bytes()
    }

    /// Reads the 32-byte seed at `path`, refusing a symlink, a file of another uid, and one
    /// that others could read or write.
    pub fn load(path: &Path) -> Result<Signer, String> {
        let mut file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => {
                    format!("signing key {} is a symlink; refusing it", path.display())
                }
                _ => format!("signing key {}: {e}", path.display()),
            })?;
        let meta = file
            .metadata()
            .map_err(|e| format!("signing key {}: {e}", path.display()))?;
        let me = nix::unistd::geteuid().as_raw();
        if !meta.is_file() || meta.uid() != me {
            return Err(format!(
                "signing key {} is not a file of uid {me} (owner uid {}); refusing it",
                path.display(),
                meta.uid()
            ));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(format!(
                "signing key {} is readable by others (mode {:o}); refusing it",
                path.display(),
                meta.permissions().mode() & 0o777
            ));
        }
        let mut bytes = Vec::with_capacity(32);
        file.read_to_end(&mut bytes)
            .map_err(|e| format!("signing key {}: {e}", path.display()))?;
        let seed: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
            format!(
                "signing key {} is {} bytes, not 32",
                path.display(),
                bytes.len()
            )
        })?;
        Ok(Signer::from_seed(seed))
    }

    /// Writes the seed to `path` (mode 0600, created exclusively: an existing key, or a symlink
    /// in its place, is never written through), its directory made 0700 and the caller's without
    /// following a symlink (warren_daemon::dirs::make_own_dir), and syncs both.
    pub fn save_new(&self, path: &Path) -> std::io::Result<()> {
        let dir = path
            .parent()
            .ok_or_else(|| std::io::Error::other("key path has no directory"))?;
        let dir_fd = warren_daemon::dirs::make_own_dir(dir)?;
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        file.write_all(self.key.as_bytes())?;
        file.sync_all()?;
        nix::unistd::fsync(&dir_fd).map_err(std::io::Error::from)
    }
}

/// Where the signing key lives: `<secrets>/receiptd/signing.key`.
pub fn key_path(secrets_dir: &Path) -> PathBuf {
    secrets_dir.join("receiptd").join(KEY_FILE)
}

/// One row of the key registry. Times are Unix milliseconds (below 2^53).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRow {
    pub keyid: String,
    /// The algorithm the verifier uses for this key, never taken from a receipt.
    pub alg: String,
    /// base64url (no padding) of the raw public key.
    pub public_key: String,
    /// The signed-note key name checkpoints signed with this key carry.
    pub note_name: String,
    pub valid_from: u64,
    pub valid_until: Option<u64>,
    pub superseded_by: Option<String>,
}

impl KeyRow {
    pub fn for_signer(signer: &Signer, note_name: &str, valid_from: u64) -> KeyRow {
        KeyRow {
            keyid: signer.keyid().to_owned(),
            alg: ALG_ED25519.to_owned(),
            public_key: URL_SAFE_NO_PAD.encode(signer.public().as_bytes()),
            note_name: note_name.to_owned(),
            valid_from,
            valid_until: None,
            superseded_by: None,
        }
    }

    /// The public key, checked against the row's keyid (a row whose key does not hash to its id
    /// is refused).
    pub fn verifying_key(&self) -> Result<VerifyingKey, String> {
        if self.alg != ALG_ED25519 {
            return Err(format!(
                "key {}: unsupported algorithm {:?}",
                self.keyid, self.alg
            ));
        }
        let raw = URL_SAFE_NO_PAD
            .decode(&self.public_key)
            .map_err(|e| format!("key {}: public_key: {e}", self.keyid))?;
        let raw: [u8; 32] = raw
            .as_slice()
            .try_into()
            .map_err(|_| format!("key {}: public_key is not 32 bytes", self.keyid))?;
        let key = VerifyingKey::from_bytes(&raw).map_err(|e| format!("key {}: {e}", self.keyid))?;
        if thumbprint(&key) != self.keyid {
            return Err(format!(
                "key {}: the public key's RFC 7638 thumbprint is {}",
                self.keyid,
                thumbprint(&key)
            ));
        }
        Ok(key)
    }
}

/// The registry file: `{"keys":[KeyRow...],"version":1}` in RFC 8785 form.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    pub version: u32,
    pub keys: Vec<KeyRow>,
}

impl Registry {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = warren_jcs::to_vec(self).expect("a registry always serialises");
        out.push(b'\n');
        out
    }

    pub fn parse(bytes: &[u8]) -> Result<Registry, String> {
        let reg: Registry =
            serde_json::from_slice(bytes).map_err(|e| format!("key registry: {e}"))?;
        if reg.version != 1 {
            return Err(format!("key registry: version {} is not 1", reg.version));
        }
        Ok(reg)
    }

    pub fn find(&self, keyid: &str) -> Option<&KeyRow> {
        self.keys.iter().find(|k| k.keyid == keyid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbprint_matches_rfc8037_appendix_a3() {
        // RFC 8037 A.3: the thumbprint of its example Ed25519 key.
        let x = URL_SAFE_NO_PAD
            .decode("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
            .unwrap();
        let key = VerifyingKey::from_bytes(&x.try_into().unwrap()).unwrap();
        assert_eq!(
            thumbprint(&key),
            "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
        );
    }

    #[test]
    fn a_row_whose_key_does_not_match_its_id_is_refused() {
        let a = Signer::generate().unwrap();
        let b = Signer::generate().unwrap();
        let mut row = KeyRow::for_signer(&a, "n", 0);
        assert!(row.verifying_key().is_ok());
        row.keyid = b.keyid().to_owned();
        assert!(row.verifying_key().is_err());
    }
}
