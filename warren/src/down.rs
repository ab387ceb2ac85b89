//! `warren down`'s check of the namespaces still running before the daemons stop.

use anyhow::Result;
use warren_daemon::Dirs;

use crate::namespaces::NsTree;

/// Whether `down` may go on: no live namespace, or (`force`) every live one killed and ended.
pub fn settle_namespaces(dirs: &Dirs, force: bool) -> Result<bool> {
    crate::namespaces::block_on(async {
        let (tree, live) = match NsTree::connect(dirs).await {
            Ok(tree) => {
                let live: Vec<_> = tree
                    .list()
                    .await?
                    .into_iter()
                    .filter(|n| n.is_running())
                    .collect();
                (tree, live)
            }
            Err(e) if force => {
                eprintln!("warren down: {e:#}; --force: stopping without asking nsd");
                return Ok(true);
            }
            Err(e) => {
                eprintln!(
                    "warren down: refused: cannot tell whether namespaces are live ({e:#}); \
                     `warren down --force` stops the daemons anyway"
                );
                return Ok(false);
            }
        };
        // An MCP server's namespace is mcpfs's: it ends when mcpfs stops, so it strands nothing.
        let mut others = Vec::new();
        for n in live {
            let info = tree.read(n.id, "info").await.unwrap_or_default();
            if !info.lines().any(|l| l == "origin mcp") {
                others.push(n);
            }
        }
        let live = others;
        if live.is_empty() {
            return Ok(true);
        }
        if !force {
            eprintln!(
                "warren down: refused: {} namespace(s) still running; their mounts would be \
                 stranded:",
                live.len()
            );
            for n in &live {
                eprintln!("  namespace {}  {}", n.id, n.status);
            }
            eprintln!("end them, or `warren down --force` kills them first");
            return Ok(false);
        }
        for n in &live {
            let ended = tree.kill(n.id).await?;
            println!("killed namespace {} ({ended})", n.id);
        }
        Ok(true)
    })
}
