//! This host's identity: an Ed25519 key in the secrets dir, shown as `ed25519:BASE64` with a
//! SHA-256 fingerprint. The Noise handshake uses its X25519 form (the same key's Montgomery
//! image), so a peer is named by one key, the one written in its peers entry.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

/// The host key's file in the secrets dir.
pub const HOST_KEY_FILE: &str = "host.key";
const KEY_PREFIX: &str = "ed25519:";

/// `<secrets>/host.key`.
pub fn host_key_path(secrets: &Path) -> PathBuf {
    secrets.join(HOST_KEY_FILE)
}

/// A host's public identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublicKey(pub VerifyingKey);

impl PublicKey {
    /// Parses `ed25519:BASE64` (32 bytes, a valid curve point).
    pub fn parse(text: &str) -> Result<PublicKey, String> {
        let b64 = text
            .strip_prefix(KEY_PREFIX)
            .ok_or_else(|| format!("`{text}` is not a key: it must start with `{KEY_PREFIX}`"))?;
        let bytes = STANDARD
            .decode(b64)
            .map_err(|e| format!("`{text}`: not base64: {e}"))?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|_| format!("`{text}`: an Ed25519 key is 32 bytes"))?;
        VerifyingKey::from_bytes(&bytes)
            .map(PublicKey)
            .map_err(|_| format!("`{text}`: not a point on Ed25519"))
    }

    /// The X25519 key the Noise handshake carries for this host.
    pub fn x25519(&self) -> [u8; 32] {
        self.0.to_montgomery().to_bytes()
    }

    /// `SHA256:` and the hex SHA-256 of the key's 32 bytes.
    pub fn fingerprint(&self) -> String {
        format!("SHA256:{}", hex::encode(Sha256::digest(self.0.as_bytes())))
    }

    /// The gate's and receiptd's session for this peer's calls: the first 128 bits of its
    /// fingerprint, so every receipt of a peer's calls names its key.
    pub fn session(&self) -> String {
        hex::encode(&Sha256::digest(self.0.as_bytes())[..16])
    }
}

impl std::fmt::Display for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{KEY_PREFIX}{}", STANDARD.encode(self.0.as_bytes()))
    }
}

/// This host's key pair.
pub struct HostKey(SigningKey);

impl HostKey {
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// The X25519 private key the handshake uses (X25519 clamps it).
    pub fn x25519_secret(&self) -> [u8; 32] {
        self.0.to_scalar_bytes()
    }

    /// Makes a new key at `path` (0600, never over an existing file).
    pub fn create(path: &Path) -> io::Result<HostKey> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| io::Error::other(e.to_string()))?;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc_nofollow())
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("create {}: {e}", path.display())))?;
        file.write_all(&seed)?;
        file.sync_all()?;
        Ok(HostKey(SigningKey::from_bytes(&seed)))
    }

    /// Loads the key at `path`: 32 bytes, a regular file of the caller's (root's) readable by its
    /// owner only. The secrets dir belongs to receiptd, which could put a file of its own there:
    /// a key the caller does not own is refused, not adopted as this host's identity.
    pub fn load(path: &Path) -> io::Result<HostKey> {
        let mut file = OpenOptions::new()
            .read(true)
            .custom_flags(libc_nofollow())
            .open(path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "read the host key {}: {e} (make one with `warren keys init`)",
                        path.display()
                    ),
                )
            })?;
        let meta = file.metadata()?;
        let me = nix::unistd::geteuid().as_raw();
        if !meta.is_file() || meta.mode() & 0o077 != 0 || meta.uid() != me {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: the host key must be a regular file of uid {me} only its owner can read \
                     (owner uid {}, mode {:o})",
                    path.display(),
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
            ));
        }
        let mut seed = Vec::new();
        file.read_to_end(&mut seed)?;
        let seed: [u8; 32] = seed.try_into().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: a host key is 32 bytes", path.display()),
            )
        })?;
        Ok(HostKey(SigningKey::from_bytes(&seed)))
    }
}

fn libc_nofollow() -> i32 {
    nix::fcntl::OFlag::O_NOFOLLOW.bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_round_trips_as_text_and_is_never_made_over_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.key");
        let key = HostKey::create(&path).unwrap();
        assert!(
            HostKey::create(&path).is_err(),
            "never over an existing key"
        );
        let again = HostKey::load(&path).unwrap();
        assert_eq!(key.public(), again.public());
        let text = key.public().to_string();
        assert_eq!(PublicKey::parse(&text).unwrap(), key.public());
        assert_eq!(key.public().session().len(), 32);
        assert!(key.public().fingerprint().starts_with("SHA256:"));
    }

    #[test]
    fn a_key_others_may_read_or_a_symlink_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.key");
        HostKey::create(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let link = dir.path().join("link.key");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(HostKey::load(&link).is_err(), "a symlink is not followed");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = HostKey::load(&path).err().expect("refused");
        assert!(e.to_string().contains("only its owner can read"), "{e}");
    }

    /// The secrets dir is receiptd's: a key file another uid put there is not this host's key.
    #[test]
    fn a_key_another_uid_owns_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.key");
        HostKey::create(&path).unwrap();
        let other = nix::unistd::geteuid().as_raw() + 1;
        std::os::unix::fs::chown(&path, Some(other), None).unwrap();
        let e = HostKey::load(&path).err().expect("refused");
        assert!(e.to_string().contains(&format!("owner uid {other}")), "{e}");
    }

    #[test]
    fn bad_key_text_is_refused() {
        assert!(PublicKey::parse("ssh-ed25519 AAAA").is_err());
        assert!(PublicKey::parse("ed25519:AAAA").is_err());
    }
}
