//! stdin/stdout for the MCP session, with one addition: a line that is not JSON is answered
//! with JSON-RPC's Parse error (-32700, id null), as JSON-RPC 2.0 says, instead of the silence
//! `rmcp` gives it, so a client that sent garbage learns so; a line over [`MAX_MESSAGE`] is
//! answered with Invalid Request (-32600, id null) and skipped unread. Everything else passes
//! through unchanged, a whole line at a time in each direction.

use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream,
};
use tokio::sync::mpsc;

const PIPE: usize = 1 << 20;

/// The longest message (one line) taken from the client: a call's arguments are at most 1 MiB
/// at the call file, and a line is held whole in memory while it is checked.
pub const MAX_MESSAGE: usize = 4 << 20;

/// The (reader, writer) pair to hand `rmcp` in place of stdin and stdout. A pipe is read and
/// written on the runtime's reactor; anything else (a file, a terminal) through tokio's
/// blocking stdio, which costs a thread hop per read and write.
pub fn stdio() -> (DuplexStream, DuplexStream) {
    use std::os::fd::AsFd;
    let pipe = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned().map(std::fs::File::from);
    let input: Box<dyn AsyncRead + Unpin + Send> = match pipe(std::io::stdin().as_fd())
        .and_then(tokio::net::unix::pipe::Receiver::from_file)
    {
        Ok(pipe) => Box::new(pipe),
        Err(_) => Box::new(tokio::io::stdin()),
    };
    let output: Box<dyn AsyncWrite + Unpin + Send> =
        match pipe(std::io::stdout().as_fd()).and_then(tokio::net::unix::pipe::Sender::from_file) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdout()),
        };
    filtered(input, output)
}

pub fn filtered<R, W>(input: R, output: W) -> (DuplexStream, DuplexStream)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (to_rmcp, rmcp_in) = tokio::io::duplex(PIPE);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(PIPE);
    let (errors_tx, errors_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(read_side(input, to_rmcp, errors_tx));
    tokio::spawn(write_side(from_rmcp, output, errors_rx));
    (rmcp_in, rmcp_out)
}

async fn read_side<R: AsyncRead + Unpin>(
    input: R,
    mut to_rmcp: DuplexStream,
    errors: mpsc::UnboundedSender<Vec<u8>>,
) {
    let mut input = BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        let limit = MAX_MESSAGE as u64 + 1;
        match (&mut input).take(limit).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return, // EOF: dropping `to_rmcp` ends the session.
            Ok(_) => {}
        }
        if line.len() > MAX_MESSAGE && line.last() != Some(&b'\n') {
            // Too long to be a message we would take: say so, and skip the rest of its line.
            let error = serde_json::json!({
                "jsonrpc": "2.0",
                "id": null,
                "error": {"code": -32600, "message": format!(
                    "Invalid Request: a message is at most {MAX_MESSAGE} bytes; this one was skipped"
                )},
            });
            let _ = errors.send(error.to_string().into_bytes());
            if !skip_line(&mut input).await {
                return;
            }
            continue;
        }
        let body = line.trim_ascii();
        if !body.is_empty()
            && let Err(e) = serde_json::from_slice::<serde_json::Value>(body)
        {
            let error = serde_json::json!({
                "jsonrpc": "2.0",
                "id": null,
                "error": {"code": -32700, "message": format!("Parse error: not JSON: {e}")},
            });
            let _ = errors.send(error.to_string().into_bytes());
            continue;
        }
        if to_rmcp.write_all(&line).await.is_err() {
            return;
        }
    }
}

/// Reads and drops the rest of a line; `false` at the end of input.
async fn skip_line<R: AsyncRead + Unpin>(input: &mut BufReader<R>) -> bool {
    loop {
        let buf = match input.fill_buf().await {
            Ok([]) | Err(_) => return false,
            Ok(buf) => buf,
        };
        let (used, found) = match buf.iter().position(|b| *b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        input.consume(used);
        if found {
            return true;
        }
    }
}

async fn write_side<W: AsyncWrite + Unpin>(
    from_rmcp: DuplexStream,
    mut output: W,
    mut errors: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let mut from_rmcp = BufReader::new(from_rmcp);
    let mut line = Vec::new();
    loop {
        tokio::select! {
            read = from_rmcp.read_until(b'\n', &mut line) => {
                match read {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if output.write_all(&line).await.is_err() {
                    return;
                }
                line.clear();
            }
            Some(mut error) = errors.recv() => {
                error.push(b'\n');
                if output.write_all(&error).await.is_err() {
                    return;
                }
            }
        }
        if output.flush().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn garbage_gets_a_parse_error_and_json_passes_through() {
        let (client_in, server_in) = tokio::io::duplex(4096);
        let (server_out, mut client_out) = tokio::io::duplex(4096);
        let (mut rmcp_in, mut rmcp_out) = filtered(server_in, server_out);
        let mut client_in = client_in;
        client_in
            .write_all(b"{not json\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
            .await
            .unwrap();
        let mut passed = vec![0u8; 41];
        rmcp_in.read_exact(&mut passed).await.unwrap();
        assert_eq!(
            passed,
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n"
        );
        rmcp_out.write_all(b"{\"id\":1}\n").await.unwrap();
        let mut replies = BufReader::new(&mut client_out);
        let mut first = String::new();
        let mut second = String::new();
        replies.read_line(&mut first).await.unwrap();
        replies.read_line(&mut second).await.unwrap();
        let both = format!("{first}{second}");
        assert!(both.contains("\"code\":-32700"), "{both}");
        assert!(both.contains("{\"id\":1}\n"), "{both}");
    }
}
