//! Serves warren_9p's demo tree (`hello`, `zero`, `null`, under any aname) on a Unix socket, one
//! `serve` per connection: the server side of the 9P interop checks and of `scripts/bench-9p`.
//!
//! Usage: demo_server SOCKET_PATH [MAX_MSIZE]

use std::sync::Arc;

use warren_9p::{Limits, demo::DemoTree, serve};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: demo_server SOCKET_PATH [MAX_MSIZE]");
        std::process::exit(2);
    };
    let mut limits = Limits::default();
    if let Some(m) = args.next() {
        limits.max_msize = m
            .parse()
            .map_err(|e| std::io::Error::other(format!("MAX_MSIZE: {e}")))?;
    }
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)?;
    eprintln!("demo_server: listening on {path}");
    let tree = Arc::new(DemoTree);
    loop {
        let (stream, _) = listener.accept().await?;
        let (tree, limits) = (tree.clone(), limits.clone());
        tokio::spawn(async move {
            if let Err(e) = serve(tree, stream, limits).await {
                eprintln!("demo_server: connection dropped: {e}");
            }
        });
    }
}
