//! warren-9p's client (`warren_9p::Client`, what the bridge speaks to every 9P server, including
//! a `tcp!` or `unix!` server named in a spec, which nothing vouches for) on any bytes a server
//! may send: an in-memory duplex whose far end plays the server.
//!
//! Input: a mode byte, then reply frames, each a u16 length and that many bytes (type, tag,
//! body) sent behind a size field that matches (mode bit 0 set: sent as they are). Mode bit 1
//! clear: an Rversion (msize 8 KiB) goes first. An empty frame ends the first batch. The client
//! has an attach and a request of each kind in flight when the first batch arrives; once the
//! attach succeeds, a second round (a 20-name walk, getattr, open, read, write, readdir, an
//! rpc-file call) runs on the attached fid while the rest arrives. Then the server hangs up.
//! Checks: no panic; every request ends (answered, or failed when the server hung up, never left
//! waiting); what the client hands back stays within what it asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rs9p::{Data, FCall, GetAttrMask, Msg};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_9p::{Client, wire};

const MSIZE: u32 = 8192;

/// One request of each kind on fid 0, all in flight at once.
async fn round_one(client: &Client) {
    let rpc = |body| client.rpc(body);
    let _ = tokio::join!(
        rpc(FCall::TWalk {
            fid: 0,
            newfid: 1,
            wnames: vec!["a".into(), "b".into()],
        }),
        rpc(FCall::TRead {
            fid: 0,
            offset: 0,
            count: 100,
        }),
        rpc(FCall::TReadDir {
            fid: 0,
            offset: 0,
            count: 100,
        }),
        rpc(FCall::TGetAttr {
            fid: 0,
            req_mask: GetAttrMask::all(),
        }),
        rpc(FCall::TWrite {
            fid: 0,
            offset: 0,
            data: Data(b"x".to_vec()),
        }),
        rpc(FCall::TStatFs { fid: 0 }),
        rpc(FCall::TClunk { fid: 0 }),
    );
}

/// The second round, on an attached fid; each result checked against what was asked.
async fn use_fid(root: warren_9p::Fid) {
    let (walked, attr, opened, read, written, listed, called) = tokio::join!(
        root.walk(&["x"; 20]),
        root.getattr(),
        root.open(warren_9p::oflags::RDWR),
        root.read(0, 100),
        root.write(0, b"hello"),
        root.readdir_all(),
        root.call(b"request"),
    );
    let _ = (walked, attr, opened, listed, called);
    if let Ok(data) = read {
        assert!(data.len() <= 100, "read {} bytes of 100", data.len());
    }
    if let Ok(n) = written {
        assert!(n <= 5, "wrote {n} of 5 bytes");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let mut batches = [Vec::new(), Vec::new()];
    if mode & 2 == 0 {
        batches[0] = wire::encode(&Msg {
            tag: rs9p::NOTAG,
            body: FCall::RVersion {
                msize: MSIZE,
                version: rs9p::P92000L.into(),
            },
        });
    }
    let mut batch = 0;
    while let [a, b, tail @ ..] = rest {
        let len = (u16::from_le_bytes([*a, *b]) as usize).min(tail.len());
        let (frame, next) = tail.split_at(len);
        rest = next;
        if frame.is_empty() {
            batch = 1;
            continue;
        }
        if mode & 1 == 0 {
            batches[batch].extend_from_slice(&(len as u32 + 4).to_le_bytes());
        }
        batches[batch].extend_from_slice(frame);
    }
    let [first, second] = batches;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let (mut from_client, mut to_client) = tokio::io::split(theirs);
        let server = async move {
            let _ = to_client.write_all(&first).await;
            // Let the client take the first batch in (and start its second round) before the
            // rest arrives; on this single-threaded runtime each yield runs every ready task.
            for _ in 0..64 {
                tokio::task::yield_now().await;
            }
            let _ = to_client.write_all(&second).await;
            let _ = to_client.shutdown().await;
            // Hold the read half until the client is done: it still sends (clunks, flushes).
            let mut sink = Vec::new();
            let _ = from_client.read_to_end(&mut sink).await;
        };
        let client = async move {
            let Ok(client) = Client::new(ours, 64 * 1024).await else {
                return;
            };
            assert!(
                (wire::MIN_MSIZE..=64 * 1024).contains(&client.msize()),
                "msize {}",
                client.msize()
            );
            let attached = async {
                if let Ok(root) = client.attach("fuzz", "").await {
                    use_fid(root).await;
                }
            };
            tokio::join!(attached, round_one(&client));
        };
        tokio::join!(server, client);
    });
});
