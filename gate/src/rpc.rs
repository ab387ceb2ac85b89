//! One request/reply on an rpc file (`decide`, receiptd's `append`): the write and the first read
//! are sent back to back without waiting for the write's reply. The server handles requests on one
//! fid in arrival order, so the read sees the write's reply; this saves a round trip per call.

use warren_9p::{Errno, Fid};

/// Replies larger than this take a second read.
const FIRST_READ: u32 = 64 * 1024;

/// Writes `request` and reads the reply. A refused write comes back with the errno and whatever
/// the file says about it (the rpc files put their error message in the reply).
pub async fn call(fid: &Fid, request: &[u8]) -> Result<Vec<u8>, (Errno, Vec<u8>)> {
    let (written, first) = tokio::join!(fid.write(0, request), fid.read(0, FIRST_READ));
    match (written, first) {
        (Ok(n), _) if n as usize != request.len() => Err((Errno::EMSGSIZE, Vec::new())),
        (Ok(_), Ok(mut reply)) => {
            if reply.len() == FIRST_READ as usize {
                let rest = fid
                    .read_to_end(reply.len() as u64)
                    .await
                    .map_err(|e| (e, Vec::new()))?;
                reply.extend_from_slice(&rest);
            }
            Ok(reply)
        }
        (Ok(_), Err(e)) => Err((e, Vec::new())),
        (Err(e), said) => Err((e, said.unwrap_or_default())),
    }
}
