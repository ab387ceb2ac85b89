//! The FUSE bridge's request decoding and dispatch (`bridge/src/request.rs` and the session
//! loop behind it), on any message sequence a "kernel" may send: a SOCK_SEQPACKET socketpair
//! stands in for /dev/fuse (one message per read, as the device gives), and the 9P side is the
//! demo tree (`hello`, `zero`, `null`) over an in-memory duplex.
//!
//! Input: a mode byte, then messages, each a u16 length and that many bytes. Mode bit 0 clear:
//! each message goes behind a `len` field that matches it (so the bytes are the rest of
//! `fuse_in_header` and the arguments); set: the bytes are sent as they are. Mode bit 1 clear: a
//! FUSE_INIT (7.31) goes first. Mode bit 2 set: call-file semantics (`/tool`'s).
//! Checks: no panic; the bridge stops when the "kernel" hangs up; every reply is a whole
//! `fuse_out_header` + body whose `len` is its size, with an error in -511..=0 and no body on
//! error; no request is answered more often than its `unique` was sent; a READ or READDIR is
//! answered with no more bytes than it asked for.
#![no_main]

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, Shutdown, SockFlag, SockType, shutdown, socketpair};
use polyfuse_kernel as abi;
use tokio::net::UnixStream;
use zerocopy::{FromBytes, IntoBytes};

const IN_HEADER: usize = size_of::<abi::fuse_in_header>();
const OUT_HEADER: usize = size_of::<abi::fuse_out_header>();

fn init_message() -> Vec<u8> {
    let init = abi::fuse_init_in {
        major: abi::FUSE_KERNEL_VERSION,
        minor: 31,
        max_readahead: 131072,
        flags: u32::MAX,
    };
    let header = abi::fuse_in_header {
        len: (IN_HEADER + size_of::<abi::fuse_init_in>()) as u32,
        opcode: abi::FUSE_INIT,
        unique: 2,
        ..Default::default()
    };
    [header.as_bytes(), init.as_bytes()].concat()
}

/// Sends every message, then hangs up (the bridge reads end of file: the mount went away).
async fn send_all(sock: &UnixStream, messages: &[Vec<u8>]) {
    for msg in messages {
        loop {
            sock.writable().await.expect("writable");
            match sock.try_write(msg) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                // A message larger than the socket takes is dropped; the kernel never sends one.
                Err(e) if e.raw_os_error() == Some(Errno::EMSGSIZE as i32) => break,
                Err(e) => panic!("write: {e}"),
            }
        }
    }
    shutdown(sock.as_raw_fd(), Shutdown::Write).expect("shutdown");
}

/// Reads replies (one per read, as the socket keeps message boundaries) until `done` fires,
/// then takes whatever is already queued.
async fn read_replies(
    sock: &UnixStream,
    mut done: tokio::sync::oneshot::Receiver<()>,
) -> Vec<Vec<u8>> {
    let mut replies = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut finishing = false;
    loop {
        match sock.try_read(&mut buf) {
            Ok(0) => return replies,
            Ok(n) => {
                replies.push(buf[..n].to_vec());
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if finishing {
                    return replies;
                }
            }
            Err(e) => panic!("read: {e}"),
        }
        tokio::select! {
            ready = sock.readable() => ready.expect("readable"),
            _ = &mut done => finishing = true,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let raw = mode & 1 != 0;
    let mut messages = Vec::new();
    if mode & 2 == 0 {
        messages.push(init_message());
    }
    while let [a, b, tail @ ..] = rest {
        let len = (u16::from_le_bytes([*a, *b]) as usize).min(tail.len());
        let (bytes, next) = tail.split_at(len);
        rest = next;
        // A read of 0 bytes is the end of the connection; the device never gives one.
        if raw && bytes.is_empty() {
            continue;
        }
        messages.push(if raw {
            bytes.to_vec()
        } else {
            [&(len as u32 + 4).to_le_bytes()[..], bytes].concat()
        });
    }
    // Per unique: requests sent with it, and the largest READ/READDIR size when every one of
    // them was a READ or READDIR (`None` once another operation used it).
    let mut sent: HashMap<u64, usize> = HashMap::new();
    let mut read_size: HashMap<u64, Option<u32>> = HashMap::new();
    for msg in &messages {
        if let Ok((header, args)) = abi::fuse_in_header::read_from_prefix(msg) {
            *sent.entry(header.unique).or_default() += 1;
            let size = match header.opcode {
                abi::FUSE_READ | abi::FUSE_READDIR => abi::fuse_read_in::read_from_prefix(args)
                    .map_or(Some(0), |(read, _)| Some(read.size)),
                _ => None,
            };
            let max = read_size.entry(header.unique).or_insert(Some(0));
            *max = max.zip(size).map(|(a, b)| a.max(b));
        }
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let replies = rt.block_on(async move {
        let (client_end, server_end) = tokio::io::duplex(1 << 20);
        tokio::spawn(warren_9p::serve(
            Arc::new(warren_9p::demo::DemoTree),
            server_end,
            warren_9p::Limits::default(),
        ));
        let client = warren_9p::Client::new(client_end, 1 << 20)
            .await
            .expect("9P client");
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )
        .expect("socketpair");
        let opts = warren_bridge::BridgeOptions {
            call_files: mode & 4 != 0,
            ..Default::default()
        };
        let bridge = warren_bridge::Bridge::new(theirs, client, opts)
            .await
            .expect("bridge attaches");
        let run = tokio::spawn(bridge.run());
        // tokio's UnixStream over the SOCK_SEQPACKET end: its reads and writes are read(2) and
        // write(2), one message each.
        let ours =
            UnixStream::from_std(std::os::unix::net::UnixStream::from(ours)).expect("register");
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let kernel = async {
            send_all(&ours, &messages).await;
            run.await
                .expect("the bridge ends without panicking")
                .expect("the bridge stops cleanly at hang-up");
            let _ = done_tx.send(());
        };
        let ((), replies) = tokio::join!(kernel, read_replies(&ours, done_rx));
        replies
    });

    let mut answered: HashMap<u64, usize> = HashMap::new();
    for reply in &replies {
        let (header, body) =
            abi::fuse_out_header::read_from_prefix(reply).expect("a whole fuse_out_header");
        assert_eq!(header.len as usize, reply.len(), "len is the reply's size");
        assert!((-511..=0).contains(&header.error), "error {}", header.error);
        assert!(
            header.error == 0 || body.is_empty(),
            "an error reply with a body"
        );
        assert!(reply.len() >= OUT_HEADER);
        *answered.entry(header.unique).or_default() += 1;
        if let Some(Some(size)) = read_size.get(&header.unique) {
            assert!(
                body.len() <= *size as usize,
                "{} bytes read, {size} asked",
                body.len()
            );
        }
    }
    for (unique, n) in answered {
        let asked = sent.get(&unique).copied().unwrap_or(0);
        assert!(
            n <= asked,
            "unique {unique} answered {n} times, sent {asked}"
        );
    }
});
