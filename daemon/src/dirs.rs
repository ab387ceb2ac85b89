//! warren's three directories. None of them may ever enter a namespace (nsd checks by inode).

use std::path::PathBuf;

/// The runtime dir holds the daemons' sockets and the `warren up` lock; the data dir holds their
/// databases; the secrets dir holds the receipt signing key and nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirs {
    pub runtime: PathBuf,
    pub data: PathBuf,
    pub secrets: PathBuf,
}

pub const DEFAULT_RUNTIME: &str = "/run/warren";
pub const DEFAULT_DATA: &str = "/var/lib/warren";
pub const DEFAULT_SECRETS: &str = "/etc/warren/secrets";

impl Dirs {
    /// From `WARREN_RUNTIME_DIR`, `WARREN_DATA_DIR` and `WARREN_SECRETS_DIR`, else the defaults.
    pub fn from_env() -> Dirs {
        let var = |name: &str, default: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        Dirs {
            runtime: var("WARREN_RUNTIME_DIR", DEFAULT_RUNTIME),
            data: var("WARREN_DATA_DIR", DEFAULT_DATA),
            secrets: var("WARREN_SECRETS_DIR", DEFAULT_SECRETS),
        }
    }

    /// All three under one base directory (tests, `warren demo`).
    pub fn under(base: impl Into<PathBuf>) -> Dirs {
        let base = base.into();
        Dirs {
            runtime: base.join("run"),
            data: base.join("data"),
            secrets: base.join("secrets"),
        }
    }

    /// The operator socket of a daemon: `tool` → `<runtime>/tool.sock`.
    pub fn socket(&self, server: &str) -> PathBuf {
        self.runtime.join(format!("{server}.sock"))
    }

    /// The control socket of a daemon (trusted peers only): `toolfs` → `<runtime>/toolfs.ctl`.
    pub fn control(&self, daemon: &str) -> PathBuf {
        self.runtime.join(format!("{daemon}.ctl"))
    }
}
