//! What this namespace grants, read from its own files: `/tool/tools` and each
//! `/mnt/mcp/<server>/tools` list the tools; a tool's `doc` and `schema` describe it; its `call`
//! runs it. Nothing else is a tool here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rmcp::model::{JsonObject, Tool, ToolAnnotations};

/// Between an MCP server's name and its tool's in the names clients call (`everything__echo`).
/// Built-in tool names never hold it.
pub const SEPARATOR: &str = "__";

/// One granted tool: the directory holding its `doc`, `schema` and `call`.
#[derive(Clone, Debug)]
pub struct Granted {
    pub dir: PathBuf,
    pub tier: String,
    /// A mounted MCP server's tool: called through `call.mcp`, whose result keeps the
    /// server's content blocks and notes beside the text (specs/tool-tree.md §3).
    pub mcp: bool,
}

/// The tools the namespace grants, by the name a client calls them by, sorted.
#[derive(Clone, Debug, Default)]
pub struct Grant {
    pub tools: BTreeMap<String, Granted>,
}

/// Where the granted trees are mounted.
#[derive(Clone, Debug)]
pub struct Roots {
    pub tool: PathBuf,
    pub mcp: PathBuf,
    /// One mounted MCP server's tools under their own names (no `SERVER__`): only when it is
    /// the whole grant, so no name can be two tools'.
    pub plain: bool,
}

impl Roots {
    /// Reads the listings now. A tree that is not mounted grants nothing; a name that two
    /// servers would both give (`a_` + `_b`, `a` + `__b`) is withheld, said on stderr.
    pub fn scan(&self) -> Grant {
        let mut tools = BTreeMap::new();
        let built_ins = listing(&self.tool);
        for (name, tier) in built_ins.iter().cloned() {
            tools.insert(
                name.clone(),
                Granted {
                    dir: self.tool.join(&name),
                    tier,
                    mcp: false,
                },
            );
        }
        let mut servers: Vec<PathBuf> = std::fs::read_dir(&self.mcp)
            .map(|dir| dir.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        servers.sort();
        if self.plain && (!built_ins.is_empty() || servers.len() != 1) {
            eprintln!(
                "warren-mcp-server: plain names need exactly one mounted MCP server and no \
                 built-in tools; this namespace has {} built-in tools and {} servers: nothing is served",
                built_ins.len(),
                servers.len()
            );
            return Grant::default();
        }
        let mut clashing = Vec::new();
        for server in servers {
            let Some(server_name) = server.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            for (tool, tier) in listing(&server) {
                let name = if self.plain {
                    tool.clone()
                } else {
                    format!("{server_name}{SEPARATOR}{tool}")
                };
                let granted = Granted {
                    dir: server.join(&tool),
                    tier,
                    mcp: true,
                };
                if tools.insert(name.clone(), granted).is_some() {
                    clashing.push(name);
                }
            }
        }
        for name in clashing {
            eprintln!(
                "warren-mcp-server: two granted tools would both be called {name}: neither is served"
            );
            tools.remove(&name);
        }
        Grant { tools }
    }
}

impl Roots {
    /// The mounted MCP servers' resources (a whole-server mount's `resources.mcp/`), by URI:
    /// each file's name is its URI percent-encoded by mcpfs. A URI two servers both serve is
    /// withheld, said on stderr.
    pub fn resources(&self) -> BTreeMap<String, PathBuf> {
        let mut resources = BTreeMap::new();
        let mut clashing = Vec::new();
        let servers = std::fs::read_dir(&self.mcp)
            .map(|dir| dir.flatten().map(|e| e.path().join("resources.mcp")))
            .into_iter()
            .flatten();
        for dir in servers {
            let Ok(files) = std::fs::read_dir(&dir) else {
                continue;
            };
            for file in files.flatten() {
                let name = file.file_name();
                let Some(uri) = name
                    .to_str()
                    .and_then(|n| percent_encoding::percent_decode_str(n).decode_utf8().ok())
                else {
                    continue;
                };
                if resources.insert(uri.to_string(), dir.join(&name)).is_some() {
                    clashing.push(uri.to_string());
                }
            }
        }
        for uri in clashing {
            eprintln!("warren-mcp-server: two mounted servers both serve {uri}: neither is served");
            resources.remove(&uri);
        }
        resources
    }
}

/// The `name\ttier\tdescription` lines of `<dir>/tools`: (name, tier). A name that is not one
/// path component is skipped (a tree of the `/tool` shape never lists one).
fn listing(dir: &Path) -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string(dir.join("tools")) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let name = fields.next()?;
            let tier = fields.next().unwrap_or("exec");
            let component = !name.is_empty() && name != "." && name != ".." && !name.contains('/');
            component.then(|| (name.to_string(), tier.to_string()))
        })
        .collect()
}

impl Granted {
    /// The tool's name at the gate: a built-in's own, `mcp:<server>:<tool>` for a mounted
    /// server's (its directory is `<mcp root>/<server>/<tool>`).
    pub fn gate_name(&self) -> String {
        let name = |p: &Path| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        if self.mcp {
            let server = self.dir.parent().map(name).unwrap_or_default();
            format!("mcp:{server}:{}", name(&self.dir))
        } else {
            name(&self.dir)
        }
    }

    /// The call file a call opens.
    pub fn call_file(&self) -> PathBuf {
        self.dir.join(if self.mcp { "call.mcp" } else { "call" })
    }

    /// The tool as `tools/list` shows it: description from `doc`, input schema from `schema`,
    /// and the gate's tier as hints (`read`: read-only; `destructive`: destructive).
    pub fn describe(&self, name: &str) -> std::io::Result<Tool> {
        let doc = std::fs::read_to_string(self.dir.join("doc"))?;
        let schema = std::fs::read(self.dir.join("schema"))?;
        let schema: JsonObject = serde_json::from_slice(&schema).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", self.dir.join("schema").display()),
            )
        })?;
        let description = format!("{} (warren tier: {})", doc.trim_end(), self.tier);
        let mut tool = Tool::new_with_raw(name.to_string(), Some(description.into()), schema);
        tool.annotations = match self.tier.as_str() {
            "read" => Some(ToolAnnotations::new().read_only(true)),
            "destructive" => Some(ToolAnnotations::new().destructive(true)),
            _ => None,
        };
        Ok(tool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Roots under `dir`: built-ins in `tool/`, MCP servers in `mcp/`.
    fn roots(dir: &Path, plain: bool) -> Roots {
        Roots {
            tool: dir.join("tool"),
            mcp: dir.join("mcp"),
            plain,
        }
    }

    fn tree(root: &Path, tools: &[(&str, &str)]) {
        std::fs::create_dir_all(root).unwrap();
        let mut listing = String::new();
        for (name, tier) in tools {
            listing.push_str(&format!("{name}\t{tier}\tsays {name}\n"));
            std::fs::create_dir_all(root.join(name)).unwrap();
        }
        std::fs::write(root.join("tools"), listing).unwrap();
    }

    #[test]
    fn built_ins_keep_their_names_and_mcp_tools_are_prefixed_by_their_server() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let roots = roots(dir, false);
        tree(&roots.tool, &[("echo", "read"), ("fs_read", "read")]);
        tree(
            &roots.mcp.join("everything"),
            &[("echo", "read"), ("get-sum", "exec")],
        );
        let names: Vec<String> = roots.scan().tools.into_keys().collect();
        assert_eq!(
            names,
            ["echo", "everything__echo", "everything__get-sum", "fs_read"]
        );
    }

    #[test]
    fn a_name_two_servers_would_give_is_withheld() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let roots = roots(dir, false);
        tree(&roots.mcp.join("a_"), &[("_b", "read"), ("c", "read")]);
        tree(&roots.mcp.join("a"), &[("__b", "read")]);
        let names: Vec<String> = roots.scan().tools.into_keys().collect();
        assert_eq!(names, ["a___c"]);
    }

    #[test]
    fn resources_are_the_mounted_servers_files_by_uri_and_a_shared_uri_is_withheld() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let roots = roots(dir, false);
        for (server, file) in [
            ("a", "test:%2F%2Fstatic-text"),
            ("a", "x%25y"),
            ("b", "shared"),
            ("c", "shared"),
        ] {
            let d = roots.mcp.join(server).join("resources.mcp");
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file), "{}").unwrap();
        }
        let uris: Vec<String> = roots.resources().into_keys().collect();
        assert_eq!(uris, ["test://static-text", "x%y"]);
    }

    #[test]
    fn nothing_mounted_grants_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let roots = roots(dir, false);
        assert!(roots.scan().tools.is_empty());
    }

    #[test]
    fn plain_names_only_for_one_server_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut roots = roots(dir, true);
        tree(&roots.mcp.join("everything"), &[("echo", "read")]);
        let names: Vec<String> = roots.scan().tools.into_keys().collect();
        assert_eq!(names, ["echo"]);
        tree(&roots.tool, &[("echo", "read")]);
        assert!(roots.scan().tools.is_empty(), "a built-in beside it");
        roots.tool = dir.join("none");
        tree(&roots.mcp.join("other"), &[("x", "read")]);
        assert!(roots.scan().tools.is_empty(), "two servers");
    }
}
