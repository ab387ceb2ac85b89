//! The server loop: one connection, one `FileTree`.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::FileTree;

/// Per-connection limits. A peer that exceeds one gets an error for that request (or, for a
/// malformed frame, loses its connection); other connections are unaffected.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The largest msize the server agrees to (the client's offer is negotiated down to it).
    pub max_msize: u32,
    /// Live fids per connection; a request that would create one more gets EMFILE.
    pub max_fids: usize,
    /// Requests in flight per connection; past it the loop stops reading the connection until
    /// one finishes (backpressure, not an error).
    pub max_inflight: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_msize: 1 << 20, max_fids: 4096, max_inflight: 256 }
    }
}

/// Serves one connection until the peer closes it or sends garbage. Every fid still live at the
/// end is clunked through `tree.clunk`.
pub async fn serve<T, S>(tree: Arc<T>, stream: S, limits: Limits) -> std::io::Result<()>
where
    T: FileTree,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let _ = (tree, stream, limits);
    unimplemented!("warren-9p server loop")
}
