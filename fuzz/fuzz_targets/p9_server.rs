//! warren-9p's server loop (`warren_9p::serve`), on any byte stream a 9P client may send once
//! it has a connection: an in-memory duplex to the demo tree (`hello`, `zero`, `null`).
//!
//! Input: a mode byte, then frames. Mode bit 0 clear: each frame is a u16 length and that many
//! bytes (type, tag, body), sent behind a size field that matches; set: the rest is sent as is,
//! size fields and all. Mode bit 1 clear: a Tversion (msize 64 KiB) and a Tattach of fid 0 go
//! first, so the fuzzer starts at the requests that reach the tree.
//! Checks: no panic; the server ends when the client hangs up; every reply is a well-formed
//! R-message no larger than the largest msize on offer; in framed mode, no tag is answered
//! more often than it was sent, no Rread or Rreaddir carries more than the count asked, and no
//! Rwalk more qids than the names asked (at most 16).
#![no_main]

use std::collections::HashMap;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use rs9p::{FCall, Msg};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_9p::demo::DemoTree;
use warren_9p::wire::{self, HEADER_LEN, RREAD_HEADER_LEN};

const MAX_MSIZE: u32 = 64 * 1024;

fn handshake() -> Vec<u8> {
    let mut out = wire::encode(&Msg {
        tag: rs9p::NOTAG,
        body: FCall::TVersion {
            msize: MAX_MSIZE,
            version: rs9p::P92000L.into(),
        },
    });
    out.extend(wire::encode(&Msg {
        tag: 0,
        body: FCall::TAttach {
            fid: 0,
            afid: rs9p::NOFID,
            uname: "fuzz".into(),
            aname: String::new(),
            n_uname: 0,
        },
    }));
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let raw = mode & 1 != 0;
    let mut stream = Vec::new();
    // Per tag (framed mode only): requests sent with it, the largest Tread/Treaddir count
    // and the most walk names among them.
    let mut sent: HashMap<u16, usize> = HashMap::new();
    let mut read_count: HashMap<u16, u32> = HashMap::new();
    let mut walk_names: HashMap<u16, usize> = HashMap::new();
    if mode & 2 == 0 {
        stream = handshake();
        *sent.entry(rs9p::NOTAG).or_default() += 1;
        *sent.entry(0).or_default() += 1;
    }
    if raw {
        stream.extend_from_slice(rest);
    } else {
        let mut rest = rest;
        while let [a, b, tail @ ..] = rest {
            let len = (u16::from_le_bytes([*a, *b]) as usize).min(tail.len());
            let (body, next) = tail.split_at(len);
            let at = stream.len();
            stream.extend_from_slice(&(len as u32 + 4).to_le_bytes());
            stream.extend_from_slice(body);
            if let [_, t0, t1, ..] = body {
                let tag = u16::from_le_bytes([*t0, *t1]);
                *sent.entry(tag).or_default() += 1;
                match wire::decode_request(&stream[at..]).map(|m| m.body) {
                    Ok(FCall::TRead { count, .. } | FCall::TReadDir { count, .. }) => {
                        let max = read_count.entry(tag).or_default();
                        *max = (*max).max(count);
                    }
                    Ok(FCall::TWalk { wnames, .. }) => {
                        let max = walk_names.entry(tag).or_default();
                        *max = (*max).max(wnames.len());
                    }
                    _ => {}
                }
            }
            rest = next;
        }
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let replies = rt.block_on(async move {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let limits = warren_9p::Limits {
            max_msize: MAX_MSIZE,
            max_fids: 64,
            max_inflight: 8,
        };
        let server = tokio::spawn(warren_9p::serve(Arc::new(DemoTree), theirs, limits));
        let (mut rd, mut wr) = tokio::io::split(ours);
        let writer = async move {
            // The server may hang up first (a malformed frame): then the write fails.
            let _ = wr.write_all(&stream).await;
            let _ = wr.shutdown().await;
        };
        let reader = async move {
            let mut replies = Vec::new();
            rd.read_to_end(&mut replies).await.expect("read replies");
            replies
        };
        let ((), replies) = tokio::join!(writer, reader);
        // Ok or InvalidData (dropped for garbage): either way it ended.
        let _ = server
            .await
            .expect("the server task ends without panicking");
        replies
    });

    let mut answered: HashMap<u16, usize> = HashMap::new();
    let mut at = 0;
    while at < replies.len() {
        let size = u32::from_le_bytes(replies[at..at + 4].try_into().expect("size field")) as usize;
        assert!(
            (HEADER_LEN as usize..=MAX_MSIZE as usize).contains(&size),
            "reply of {size} bytes"
        );
        let frame = &replies[at..at + size];
        let msg = wire::decode_reply(frame).expect("a well-formed reply");
        *answered.entry(msg.tag).or_default() += 1;
        if !raw {
            match &msg.body {
                // Reads and readdirs are capped at the requested count.
                FCall::RRead { .. } | FCall::RReadDir { .. } => {
                    let payload = size - RREAD_HEADER_LEN as usize;
                    let asked = read_count.get(&msg.tag).copied().unwrap_or(0) as usize;
                    assert!(payload <= asked, "{payload} bytes read, {asked} asked");
                }
                // A walk answers at most one qid per name, and never more than 16 names.
                FCall::RWalk { wqids } => {
                    let asked = walk_names.get(&msg.tag).copied().unwrap_or(0);
                    assert!(
                        wqids.len() <= asked.min(wire::MAXWELEM),
                        "{} qids for a walk of {asked} names",
                        wqids.len()
                    );
                }
                _ => {}
            }
        }
        at += size;
    }
    if !raw {
        for (tag, n) in answered {
            let asked = sent.get(&tag).copied().unwrap_or(0);
            assert!(n <= asked, "tag {tag} answered {n} times, sent {asked}");
        }
    }
});
