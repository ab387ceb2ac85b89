//! The tier of a tool, from its name alone.
//!
//! The table is code: no caller, rule or registration can change which tier a name has. Tools
//! registered at runtime (an MCP server's, a skill's) are namespaced before they get here
//! (`mcp:<server>:<tool>`, `skill:<name>`), so a hostile server naming its tool `fs_read` is
//! `mcp:evil:fs_read` — dynamic, never the read tier. One exception, for `mcp:` names only: the
//! tier its operator's definition gives the tool, which mcpfs names with each call and the gate
//! takes from mcpfs's connection alone (`crate::tree`); without it the tool is dynamic.

pub use warren_proto::gate::Tier;

/// The code-owned table of core tool names. Network and destructive have no core tool yet
/// (`web_fetch` would be network); destructive is reached by the shell risk raise. The second
/// name is a namespace's model call (its model's name and the request's digest are all the
/// gate sees of it): read, so allowed by default and never raised by the untrusted data an
/// agent's every turn carries; an operator's rule asks or denies it.
pub const CORE_TOOLS: &[(&str, Tier)] = &[
    ("echo", Tier::Read),
    ("llm", Tier::Read),
    ("fs_list", Tier::Read),
    ("fs_read", Tier::Read),
    ("fs_edit", Tier::Write),
    ("fs_write", Tier::Write),
    ("shell", Tier::Exec),
];

/// What a tool name is, as far as policy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolClass {
    /// A core tool with its tier from [`CORE_TOOLS`].
    Core(Tier),
    /// `mcp:<server>:<tool>` or `skill:<name>`: never a core tier; asks by default.
    Dynamic,
    /// A plain name the table does not know: asks by default.
    Unmapped,
}

impl ToolClass {
    /// How the class is named in `tiers`, bases and receipts.
    pub fn label(self) -> &'static str {
        match self {
            ToolClass::Core(t) => t.as_str(),
            ToolClass::Dynamic => "dynamic",
            ToolClass::Unmapped => "unmapped",
        }
    }

    /// Context states raise everything but a core read.
    pub fn is_read(self) -> bool {
        self == ToolClass::Core(Tier::Read)
    }
}

/// The longest tool name accepted.
pub const MAX_TOOL_NAME: usize = 256;

/// Checks a tool name's spelling: 1 to 256 bytes of `[A-Za-z0-9_.:-]`, and a namespaced name has
/// non-empty parts (`mcp:<server>:<tool>` exactly three, `skill:<name>` exactly two).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_TOOL_NAME {
        return Err(format!("tool name must be 1 to {MAX_TOOL_NAME} bytes"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
    {
        return Err(format!("tool name {name:?} may use only [A-Za-z0-9_.:-]"));
    }
    let parts: Vec<&str> = name.split(':').collect();
    let ok = match parts[0] {
        _ if parts.len() == 1 => true,
        "mcp" => parts.len() == 3 && parts.iter().all(|p| !p.is_empty()),
        "skill" => parts.len() == 2 && !parts[1].is_empty(),
        // The egress proxy's `net:<host>:<port>` (an IPv6 host with `-` for its colons).
        "net" => {
            parts.len() == 3
                && !parts[1].is_empty()
                && parts[2]
                    .parse::<u16>()
                    .is_ok_and(|p| p > 0 && !parts[2].starts_with('0'))
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tool name {name:?}: a namespaced name is mcp:<server>:<tool>, skill:<name> or \
             net:<host>:<port>"
        ))
    }
}

/// The class of a (well-spelled) tool name. A name with a `:` is dynamic whatever follows it, so
/// `mcp:x:shell` or `skill:fs_read` never reaches the core table.
pub fn classify(name: &str) -> ToolClass {
    // A connection through the egress proxy is the network tier by its prefix, never lower
    // (and `check_name` admits no other `net:` shape).
    if name.starts_with("net:") {
        return ToolClass::Core(Tier::Network);
    }
    if name.contains(':') {
        return ToolClass::Dynamic;
    }
    CORE_TOOLS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(ToolClass::Unmapped, |&(_, t)| ToolClass::Core(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_names_have_their_tiers() {
        assert_eq!(classify("fs_read"), ToolClass::Core(Tier::Read));
        assert_eq!(classify("fs_list"), ToolClass::Core(Tier::Read));
        assert_eq!(classify("echo"), ToolClass::Core(Tier::Read));
        assert_eq!(classify("fs_write"), ToolClass::Core(Tier::Write));
        assert_eq!(classify("fs_edit"), ToolClass::Core(Tier::Write));
        assert_eq!(classify("shell"), ToolClass::Core(Tier::Exec));
        assert_eq!(classify("web_fetch"), ToolClass::Unmapped);
    }

    #[test]
    fn a_namespaced_core_name_is_dynamic() {
        for name in [
            "mcp:evil:fs_read",
            "skill:fs_read",
            "mcp:x:shell",
            "skill:echo",
        ] {
            check_name(name).unwrap();
            assert_eq!(classify(name), ToolClass::Dynamic, "{name}");
        }
    }

    #[test]
    fn a_net_name_is_the_network_tier() {
        for name in [
            "net:api.test:8080",
            "net:192.0.2.7:22",
            "net:2001-db8--1:443",
        ] {
            check_name(name).unwrap();
            assert_eq!(classify(name), ToolClass::Core(Tier::Network), "{name}");
        }
        for name in [
            "net:api.test",
            "net::80",
            "net:a:0",
            "net:a:080",
            "net:a:70000",
            "net:a:b:1",
        ] {
            assert!(check_name(name).is_err(), "{name:?}");
        }
    }

    #[test]
    fn bad_names_are_refused() {
        for name in [
            "",
            "a b",
            "mcp:x",
            "mcp::t",
            "mcp:s:",
            "skill:",
            "other:x",
            "mcp:a:b:c",
            "fs_read\n",
            "é",
        ] {
            assert!(check_name(name).is_err(), "{name:?}");
        }
        assert!(check_name(&"a".repeat(MAX_TOOL_NAME + 1)).is_err());
    }
}
