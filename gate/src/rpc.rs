//! One request/reply on an rpc file (`decide`, receiptd's `append`): see [`Fid::call`], which
//! pipelines the write and the first read.

use warren_9p::{Errno, Fid};

/// Writes `request` and reads the reply (one round trip).
pub async fn call(fid: &Fid, request: &[u8]) -> Result<Vec<u8>, (Errno, Vec<u8>)> {
    fid.call(request).await
}
