//! The spec `warren run`'s convenience flags stand for (`--ro`, `--rw`, `--tool`, `--mcp`,
//! `--import`, `--net`, `--net-proxy`, `--bare`): spec text, through the one parser, so the flags
//! get the same checks and error messages as a spec file.

use std::path::Path;

use crate::spec::{self, Spec, SpecError, quote};

/// `warren run`'s convenience flags.
#[derive(Clone, Debug, Default)]
pub struct CliGrants {
    pub tools: Vec<String>,
    /// `NAME` or `NAME:TOOL,TOOL`: `mount mcp:NAME /mnt/mcp/NAME [TOOL…]`.
    pub mcp: Vec<String>,
    pub ro: Vec<String>,
    pub rw: Vec<String>,
    pub net_loopback: bool,
    /// `PEER:TREE:PATH`: `mount -k PEER ADDR PATH TREE`, ADDR the peer's `addr:` in the peers
    /// file.
    pub imports: Vec<String>,
    /// `net proxy PATTERN…` (with no `net` line in the `--ns` spec).
    pub net_proxy: Vec<String>,
    /// Skip the default read-only /usr, /bin, /lib, /lib64.
    pub bare: bool,
}

/// Host directories bound read-only unless `--bare`, so ordinary commands run.
pub const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/lib", "/lib64"];

/// Builds a spec from `--ns` (if any) plus the convenience flags. The flags become spec text
/// and go through the same parser, so they get the same checks and error messages.
pub fn spec_from_cli(base: Option<&Spec>, grants: &CliGrants) -> Result<Spec, SpecError> {
    let mut text = base.map(Spec::to_text).unwrap_or_default();
    let taken = |p: &str| base.is_some_and(|b| b.binds.iter().any(|x| x.path == p));
    if !grants.bare {
        for dir in SYSTEM_DIRS {
            if Path::new(dir).exists() && !taken(dir) {
                text.push_str(&format!("bind -r {0} {0}\n", quote(dir)));
            }
        }
    }
    for p in &grants.ro {
        text.push_str(&format!("bind -r {0} {0}\n", quote(p)));
    }
    for p in &grants.rw {
        text.push_str(&format!("bind -w {0} {0}\n", quote(p)));
    }
    if !grants.tools.is_empty() {
        let names: Vec<String> = grants.tools.iter().map(|t| quote(t)).collect();
        text.push_str(&format!("mount tool /tool {}\n", names.join(" ")));
    }
    for m in &grants.mcp {
        let (name, tools) = m.split_once(':').unwrap_or((m, ""));
        let tools: Vec<String> = tools
            .split(',')
            .filter(|t| !t.is_empty())
            .map(quote)
            .collect();
        text.push_str(&format!(
            "mount mcp:{0} /mnt/mcp/{0} {1}\n",
            quote(name),
            tools.join(" ")
        ));
    }
    for i in &grants.imports {
        text.push_str(&import_line(i)?);
    }
    if grants.net_loopback {
        text.push_str("net loopback\n");
    }
    if !grants.net_proxy.is_empty() {
        let patterns: Vec<String> = grants.net_proxy.iter().map(|p| quote(p)).collect();
        text.push_str(&format!("net proxy {}\n", patterns.join(" ")));
    }
    spec::parse("<command line>", &text)
}

/// `--import PEER:TREE:PATH` as a spec line, with the address the peers file gives PEER.
fn import_line(import: &str) -> Result<String, SpecError> {
    let refused = |why: String| SpecError {
        file: "<command line>".into(),
        line: 1,
        column: 1,
        width: 8,
        message: why,
        source_line: format!("--import {import}"),
    };
    let mut parts = import.splitn(3, ':');
    let (Some(peer), Some(tree), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(refused("expected PEER:TREE:PATH".into()));
    };
    let path_file = warren_proto::export::peers::peers_path();
    let peers =
        warren_proto::export::peers::Peers::load(&path_file).map_err(|e| refused(e.to_string()))?;
    let entry = peers
        .by_name(peer)
        .ok_or_else(|| refused(format!("no peer {peer} in {}", path_file.display())))?;
    let addr = entry.addr.as_deref().ok_or_else(|| {
        refused(format!(
            "peer {peer} has no addr:tcp!HOST!PORT in {}",
            path_file.display()
        ))
    })?;
    Ok(format!(
        "mount -k {} {} {} {}\n",
        quote(peer),
        quote(addr),
        quote(path),
        quote(tree)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Net;

    #[test]
    fn net_proxy_flags_become_one_net_proxy_line() {
        let grants = CliGrants {
            net_proxy: vec!["api.example.org".into(), "*.pypi.org:443".into()],
            bare: true,
            ..CliGrants::default()
        };
        let spec = spec_from_cli(None, &grants).unwrap();
        assert_eq!(spec.net(), Net::Proxy);
        let shown: Vec<String> = spec.proxy.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["api.example.org", "*.pypi.org:443"]);
        let bad = CliGrants {
            net_proxy: vec!["a b".into()],
            bare: true,
            ..CliGrants::default()
        };
        let e = spec_from_cli(None, &bad).unwrap_err().to_string();
        assert!(e.contains("not a host name"), "{e}");
        let base = spec::parse("b.ns", "net loopback\n").unwrap();
        let e = spec_from_cli(Some(&base), &grants).unwrap_err().to_string();
        assert!(e.contains("net already set"), "{e}");
    }
}
