//! An operator's definition of one MCP server: `<config dir>/mcp/<name>.toml`.
//!
//! ```toml
//! # how mcpfs reaches it: a stdio command (run in a warren namespace of its own) ...
//! command = ["node", "/opt/mcp/everything/dist/index.js", "stdio"]
//! # ... or a streamable-HTTP endpoint (reached by mcpfs alone)
//! # url = "http://127.0.0.1:3001/mcp"
//!
//! # the namespace the stdio server itself runs in (specs/namespace.md)
//! spec = """
//! bind -r /usr /usr
//! bind -r /opt/mcp/everything /opt/mcp/everything
//! net none
//! """
//!
//! # names of variables it gets; their values come from the secrets dir, never from here
//! env = ["EVERYTHING_TOKEN"]
//!
//! # seconds a call may take before the caller gets an error and the server is restarted
//! timeout = 60
//!
//! # the tier of each tool; a tool not listed is `exec`
//! [tiers]
//! echo = "read"
//! get-sum = "read"
//! ```
//!
//! Unknown keys are refused, so a misspelt `tiers` never silently leaves every tool at `exec`
//! while the operator believes otherwise.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::gate::Tier;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    command: Option<Vec<String>>,
    url: Option<String>,
    spec: Option<String>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    tiers: BTreeMap<String, Tier>,
    /// Seconds a call may take (default [`DEFAULT_CALL_TIMEOUT`]).
    timeout: Option<u64>,
}

/// How long a call may take unless the definition says `timeout = SECS`.
pub const DEFAULT_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// The longest `timeout` a definition may set.
pub const MAX_CALL_TIMEOUT: u64 = 600;

/// How mcpfs reaches a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A program speaking MCP on its stdin and stdout, run in a namespace of its own.
    Stdio { command: Vec<String>, spec: String },
    /// A streamable-HTTP endpoint.
    Http { url: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The server's name: the file's stem, and the `mcp:NAME` of specs and gate names.
    pub name: String,
    pub transport: Transport,
    /// Variable names the server gets (values from the secrets dir).
    pub env: Vec<String>,
    /// The operator's tier for each tool; unlisted tools are [`Tier::Exec`].
    pub tiers: BTreeMap<String, Tier>,
    /// How long one call may take.
    pub call_timeout: std::time::Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// Where the operator's server definitions are: `$WARREN_CONFIG_DIR/mcp` (default
/// `/etc/warren/mcp`). nsd, mcpfs and `warren mcp` all read them here.
pub fn config_dir() -> std::path::PathBuf {
    std::env::var_os("WARREN_CONFIG_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("/etc/warren"))
        .join("mcp")
}

/// Where the tools the operator accepted for server `name` are pinned.
pub fn pins_path(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!("{name}.pins"))
}

/// Where `warren mcp check` records what it showed the operator of server `name` (the digest of
/// each tool), for `warren mcp accept` to accept from.
pub fn shown_path(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!("{name}.checked"))
}

/// A server name is a file name, a gate-name component and a path component at once.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl ServerConfig {
    /// Parses `text`, the file `<name>.toml` (`path` only names it in errors).
    pub fn parse(name: &str, path: &str, text: &str) -> Result<ServerConfig, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_string(),
            message,
        };
        if !valid_name(name) {
            return Err(invalid(format!(
                "`{name}` is not a server name (letters, digits, `-` and `_`, at most 64)"
            )));
        }
        let file: File = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let transport = match (file.command, file.url, file.spec) {
            (Some(command), None, Some(spec)) if !command.is_empty() => {
                Transport::Stdio { command, spec }
            }
            (Some(_), None, None) => {
                return Err(invalid(
                    "a stdio server needs `spec`: the namespace it runs in (it never runs on the host)"
                        .into(),
                ));
            }
            (Some(c), None, Some(_)) if c.is_empty() => {
                return Err(invalid("`command` is empty".into()));
            }
            (None, Some(url), None) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(invalid(format!("`url` {url:?} is not an http(s) URL")));
                }
                Transport::Http { url }
            }
            (None, Some(_), Some(_)) => {
                return Err(invalid(
                    "`spec` is for stdio servers; an HTTP server is reached by mcpfs alone".into(),
                ));
            }
            _ => {
                return Err(invalid(
                    "exactly one of `command` or `url` is needed".into(),
                ));
            }
        };
        for var in &file.env {
            if var.is_empty() || !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(invalid(format!("`{var}` is not a variable name")));
            }
        }
        let call_timeout = match file.timeout {
            None => DEFAULT_CALL_TIMEOUT,
            Some(secs @ 1..=MAX_CALL_TIMEOUT) => std::time::Duration::from_secs(secs),
            Some(secs) => {
                return Err(invalid(format!(
                    "`timeout` {secs} is not 1 to {MAX_CALL_TIMEOUT} seconds"
                )));
            }
        };
        Ok(ServerConfig {
            name: name.to_string(),
            transport,
            env: file.env,
            tiers: file.tiers,
            call_timeout,
        })
    }

    /// Reads `<dir>/<name>.toml`.
    pub fn load(dir: &Path, name: &str) -> Result<ServerConfig, ConfigError> {
        let path = dir.join(format!("{name}.toml"));
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        ServerConfig::parse(name, &shown, &text)
    }

    /// The operator's tier for `tool`.
    pub fn tier_of(&self, tool: &str) -> Tier {
        self.tiers.get(tool).copied().unwrap_or(Tier::Exec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stdio_server_needs_the_namespace_it_runs_in() {
        let ok = ServerConfig::parse(
            "everything",
            "e.toml",
            "command = [\"node\", \"x.js\", \"stdio\"]\nspec = \"net none\\n\"\n[tiers]\necho = \"read\"\n",
        )
        .unwrap();
        assert_eq!(ok.tier_of("echo"), Tier::Read);
        assert_eq!(ok.tier_of("anything-else"), Tier::Exec);
        let e = ServerConfig::parse("everything", "e.toml", "command = [\"node\"]\n").unwrap_err();
        assert!(e.to_string().contains("needs `spec`"), "{e}");
    }

    #[test]
    fn bad_definitions_are_refused_clearly() {
        for (text, says) in [
            ("url = \"ftp://x\"\n", "not an http(s) URL"),
            ("url = \"http://x\"\nspec = \"\"\n", "`spec` is for stdio"),
            ("command = [\"a\"]\nurl = \"http://x\"\n", "exactly one"),
            ("\n", "exactly one"),
            (
                "command = [\"a\"]\nspec = \"\"\ntier = {}\n",
                "unknown field",
            ),
            (
                "command = [\"a\"]\nspec = \"\"\n[tiers]\necho = \"root\"\n",
                "unknown variant",
            ),
            (
                "command = [\"a\"]\nspec = \"\"\nenv = [\"A=B\"]\n",
                "not a variable",
            ),
        ] {
            let e = ServerConfig::parse("s", "s.toml", text).unwrap_err();
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
        assert!(ServerConfig::parse("a/b", "x", "url = \"http://x\"").is_err());
        assert!(ServerConfig::parse("", "x", "url = \"http://x\"").is_err());
    }
}
