//! The server loop's rules, each checked over a real socketpair with raw frames.
//!
//! Why one file: one harness of raw frames over a socketpair; each test is one rule of
//! `specs/9p.md`.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::{HANG, Raw, TestTree, lerror, serve_pair};
use rs9p::{FCall, NOFID, NONUNAME};
use warren_9p::{Errno, Limits};

fn attach(fid: u32) -> FCall {
    FCall::TAttach {
        fid,
        afid: NOFID,
        uname: "u".into(),
        aname: "".into(),
        n_uname: NONUNAME,
    }
}

#[tokio::test]
async fn live_fid_reuse_is_refused() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree.clone(), Limits::default());
    p.attach().await;
    // Attach onto the live fid 0: refused (EIO, as diod), and fid 0 is untouched.
    assert_eq!(p.rpc(5, attach(0)).await, lerror(Errno::EIO));
    assert!(matches!(
        p.walk(6, 0, 1, &["hello"]).await,
        FCall::RWalk { .. }
    ));
    // Walk onto the live newfid 1: refused; fid 1 still names hello.
    assert_eq!(p.walk(7, 0, 1, &["dir"]).await, lerror(Errno::EIO));
    match p
        .rpc(
            8,
            FCall::TGetAttr {
                fid: 1,
                req_mask: Default::default(),
            },
        )
        .await
    {
        FCall::RGetAttr { qid, .. } => assert_eq!(qid.path, 3, "fid 1 still names hello"),
        other => panic!("{other:?}"),
    }
    // After Rclunk the number is free again.
    assert_eq!(p.rpc(9, FCall::TClunk { fid: 1 }).await, FCall::RClunk);
    assert!(matches!(
        p.walk(10, 0, 1, &["dir"]).await,
        FCall::RWalk { .. }
    ));
    // Walking a fid onto itself (newfid == fid) is not reuse.
    assert!(matches!(
        p.walk(11, 1, 1, &["leaf"]).await,
        FCall::RWalk { .. }
    ));
}

#[tokio::test]
async fn walk_of_17_names_is_refused_and_16_pass() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree.clone(), Limits::default());
    p.attach().await;
    let seventeen = [".."; 17];
    assert_eq!(p.walk(2, 0, 1, &seventeen).await, lerror(Errno::EINVAL));
    assert!(
        tree.walked.lock().unwrap().is_empty(),
        "the tree never saw the 17-name walk"
    );
    match p.walk(3, 0, 1, &seventeen[..16]).await {
        FCall::RWalk { wqids } => assert_eq!(wqids.len(), 16),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn dotdot_at_root_stays_at_root_and_reaches_the_tree() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree.clone(), Limits::default());
    p.attach().await;
    match p.walk(2, 0, 1, &["..", "..", "hello"]).await {
        FCall::RWalk { wqids } => {
            assert_eq!(
                wqids.iter().map(|q| q.path).collect::<Vec<_>>(),
                vec![1, 1, 3]
            );
        }
        other => panic!("{other:?}"),
    }
    match p.walk(3, 0, 2, &["dir", "..", ".."]).await {
        FCall::RWalk { wqids } => {
            assert_eq!(wqids.last().unwrap().path, 1, "dir/../.. is the root")
        }
        other => panic!("{other:?}"),
    }
    let walked = tree.walked.lock().unwrap().clone();
    assert_eq!(
        walked,
        ["..", "..", "hello", "dir", "..", ".."],
        "the loop passes `..` through unchanged"
    );
    // Names that are paths never reach the tree.
    assert_eq!(p.walk(4, 0, 3, &["dir/leaf"]).await, lerror(Errno::EINVAL));
    assert_eq!(p.walk(5, 0, 3, &[""]).await, lerror(Errno::EINVAL));
}

#[tokio::test]
async fn msize_is_negotiated_down_and_never_exceeded() {
    let tree = Arc::new(TestTree::default());
    let limits = Limits {
        max_msize: 65536,
        ..Limits::default()
    };
    let (mut p, _srv) = serve_pair(tree, limits);
    // A hand-made Tversion offering 16 MiB.
    let mut tversion = vec![0u8; 4];
    tversion.push(100); // Tversion
    tversion.extend_from_slice(&0xFFFFu16.to_le_bytes());
    tversion.extend_from_slice(&(16u32 << 20).to_le_bytes());
    tversion.extend_from_slice(&8u16.to_le_bytes());
    tversion.extend_from_slice(b"9P2000.L");
    let size = tversion.len() as u32;
    tversion[..4].copy_from_slice(&size.to_le_bytes());
    p.send_bytes(&tversion).await;
    assert_eq!(
        p.recv().await.body,
        FCall::RVersion {
            msize: 65536,
            version: "9P2000.L".into()
        }
    );
    p.rpc(1, attach(0)).await;
    assert!(matches!(
        p.walk(2, 0, 1, &["dir", "leaf"]).await,
        FCall::RWalk { .. }
    ));
    assert!(matches!(
        p.rpc(3, FCall::TlOpen { fid: 1, flags: 0 }).await,
        FCall::RlOpen { .. }
    ));
    // A 10 MiB read of a file whose handler returns 64 MiB.
    p.send(
        4,
        FCall::TRead {
            fid: 1,
            offset: 0,
            count: 10 << 20,
        },
    )
    .await;
    let frame = p.recv_frame().await;
    assert!(
        frame.len() <= 65536,
        "Rread of {} bytes beyond msize",
        frame.len()
    );
    assert_eq!(frame.len(), 65536, "the read fills msize exactly");
    // A read smaller than msize gets exactly its count.
    match p
        .rpc(
            5,
            FCall::TRead {
                fid: 1,
                offset: 0,
                count: 100,
            },
        )
        .await
    {
        FCall::RRead { data } => assert_eq!(data.0.len(), 100),
        other => panic!("{other:?}"),
    }
    // A frame one byte over msize closes the connection.
    let mut big = wire_write(6, 1, vec![0; 65536 - 23]);
    assert_eq!(big.len(), 65536);
    p.send_bytes(&big).await;
    assert!(
        matches!(p.recv().await.body, FCall::RlError { .. }),
        "a write to leaf is refused, but framed fine"
    );
    big = wire_write(7, 1, vec![0; 65536 - 22]);
    p.send_bytes(&big).await;
    assert!(p.closed().await);
}

fn wire_write(tag: u16, fid: u32, data: Vec<u8>) -> Vec<u8> {
    warren_9p::wire::encode(&rs9p::Msg {
        tag,
        body: FCall::TWrite {
            fid,
            offset: 0,
            data: rs9p::Data(data),
        },
    })
}

#[tokio::test]
async fn version_other_than_9p2000l_is_unknown_and_small_msize_refused() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree, Limits::default());
    for v in ["9P2000", "9P2000.u", "9P2000.L.zerofs3"] {
        match p
            .rpc(
                rs9p::NOTAG,
                FCall::TVersion {
                    msize: 8192,
                    version: v.into(),
                },
            )
            .await
        {
            FCall::RVersion { version, .. } => assert_eq!(version, "unknown", "{v}"),
            other => panic!("{other:?}"),
        }
    }
    // Not negotiated: requests are refused.
    assert_eq!(p.rpc(1, attach(0)).await, lerror(Errno::EPROTO));
    assert_eq!(
        p.rpc(
            rs9p::NOTAG,
            FCall::TVersion {
                msize: 1024,
                version: "9P2000.L".into()
            }
        )
        .await,
        lerror(Errno::EINVAL)
    );
    assert_eq!(p.version(8192).await, (8192, "9P2000.L".into()));
}

#[tokio::test]
async fn tversion_resets_the_session() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree.clone(), Limits::default());
    p.attach().await;
    assert!(matches!(
        p.walk(2, 0, 1, &["hello"]).await,
        FCall::RWalk { .. }
    ));
    p.version(65536).await;
    assert_eq!(
        tree.clunks.load(Ordering::SeqCst),
        2,
        "both fids handed to clunk"
    );
    assert_eq!(
        p.rpc(
            3,
            FCall::TGetAttr {
                fid: 1,
                req_mask: Default::default()
            }
        )
        .await,
        lerror(Errno::EBADF)
    );
    assert!(
        matches!(p.rpc(4, attach(1)).await, FCall::RAttach { .. }),
        "fid 1 is free again"
    );
}

#[tokio::test]
async fn tflush_cancels_a_blocked_read() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree.clone(), Limits::default());
    p.attach().await;
    p.open(1, "block").await;
    p.send(
        10,
        FCall::TRead {
            fid: 1,
            offset: 0,
            count: 100,
        },
    )
    .await;
    p.send(11, FCall::TFlush { oldtag: 10 }).await;
    let reply = p.recv().await;
    assert_eq!((reply.tag, reply.body), (11, FCall::RFlush));
    assert_eq!(
        tree.block_dropped.load(Ordering::SeqCst),
        tree.block_started.load(Ordering::SeqCst)
    );
    // The read had started and its future was dropped before Rflush, or it never started.
    assert!(tree.block_dropped.load(Ordering::SeqCst) <= 1);
    // The fid's queue moved on: the next request on fid 1 runs (and nothing for tag 10 comes first).
    let reply = p
        .rpc(
            12,
            FCall::TGetAttr {
                fid: 1,
                req_mask: Default::default(),
            },
        )
        .await;
    assert!(matches!(reply, FCall::RGetAttr { .. }));
    // Tag 10 is free again; a flush of an unknown tag is just Rflush.
    assert_eq!(
        p.rpc(10, FCall::TFlush { oldtag: 999 }).await,
        FCall::RFlush
    );
}

#[tokio::test]
async fn tflush_after_the_handler_started_drops_its_future() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree.clone(), Limits::default());
    p.attach().await;
    p.open(1, "block").await;
    p.send(
        10,
        FCall::TRead {
            fid: 1,
            offset: 0,
            count: 100,
        },
    )
    .await;
    // Wait (without a clock) until the handler is really running.
    common::wait_until(|| tree.block_started.load(Ordering::SeqCst) > 0).await;
    assert_eq!(p.rpc(11, FCall::TFlush { oldtag: 10 }).await, FCall::RFlush);
    assert_eq!(
        tree.block_dropped.load(Ordering::SeqCst),
        1,
        "the handler's future was dropped before Rflush"
    );
    assert!(
        matches!(p.rpc(12, FCall::TClunk { fid: 1 }).await, FCall::RClunk),
        "no Rread for tag 10 came first"
    );
}

#[tokio::test]
async fn garbage_and_absurd_lengths_close_only_their_connection() {
    let tree = Arc::new(TestTree::default());
    let dir = common::short_tmp();
    let path = dir.path().join("s");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let accept_tree = tree.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(warren_9p::serve(accept_tree.clone(), s, Limits::default()));
        }
    });
    let connect = || async { Raw::new(tokio::net::UnixStream::connect(&path).await.unwrap()) };
    let mut good = connect().await;
    good.attach().await;

    let bad_frames: Vec<Vec<u8>> = vec![
        // size = 0xFFFFFFF0
        vec![0xF0, 0xFF, 0xFF, 0xFF, 100, 0, 0],
        // size below the header
        vec![3, 0, 0, 0],
        // unknown message type 200
        vec![7, 0, 0, 0, 200, 1, 0],
        // an R-message sent to the server
        vec![7, 0, 0, 0, 101, 1, 0],
        // Tclunk with a truncated body
        vec![9, 0, 0, 0, 120, 1, 0, 5, 0],
        // Twrite claiming 4 GiB of data in a small frame
        {
            let mut f = wire_write(1, 0, vec![1, 2, 3]);
            f[19..23].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
            f
        },
    ];
    for frame in bad_frames {
        let mut bad = connect().await;
        bad.version(65536).await;
        bad.send_bytes(&frame).await;
        assert!(bad.closed().await, "frame {frame:?} closed its connection");
        // The other connection goes on.
        assert!(matches!(
            good.walk(2, 0, 1, &["hello"]).await,
            FCall::RWalk { .. }
        ));
        assert_eq!(good.rpc(3, FCall::TClunk { fid: 1 }).await, FCall::RClunk);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_fid_in_order_and_different_fids_concurrently() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree.clone(), Limits::default());
    p.attach().await;
    p.open(1, "log").await;
    // Pipelined: the first write sleeps, the second does not; the second must wait its turn.
    let write = |tag, data: &str| {
        (
            tag,
            FCall::TWrite {
                fid: 1,
                offset: 0,
                data: rs9p::Data(data.into()),
            },
        )
    };
    for (tag, body) in [write(20, "slow"), write(21, "fast")] {
        p.send(tag, body).await;
    }
    assert_eq!(p.recv().await.tag, 20);
    assert_eq!(p.recv().await.tag, 21);
    assert_eq!(*tree.log.lock().unwrap(), ["slow", "fast"]);

    // A read blocked on fid 2 does not hold up fid 3.
    p.open(2, "block").await;
    p.open(3, "hello").await;
    p.send(
        30,
        FCall::TRead {
            fid: 2,
            offset: 0,
            count: 10,
        },
    )
    .await;
    let reply = p
        .rpc(
            31,
            FCall::TRead {
                fid: 3,
                offset: 0,
                count: 100,
            },
        )
        .await;
    assert_eq!(
        reply,
        FCall::RRead {
            data: rs9p::Data(common::HELLO.to_vec())
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_walk_open_read_on_the_new_fid() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree.clone(), Limits::default());
    p.attach().await;
    // Sent back to back before any reply: each waits for the walk that creates fid 7.
    p.send(
        40,
        FCall::TWalk {
            fid: 0,
            newfid: 7,
            wnames: vec!["hello".into()],
        },
    )
    .await;
    p.send(41, FCall::TlOpen { fid: 7, flags: 0 }).await;
    p.send(
        42,
        FCall::TRead {
            fid: 7,
            offset: 0,
            count: 5,
        },
    )
    .await;
    p.send(43, FCall::TClunk { fid: 7 }).await;
    let replies: Vec<_> = [
        p.recv().await,
        p.recv().await,
        p.recv().await,
        p.recv().await,
    ]
    .into();
    assert_eq!(
        replies.iter().map(|m| m.tag).collect::<Vec<_>>(),
        [40, 41, 42, 43]
    );
    assert_eq!(
        replies[2].body,
        FCall::RRead {
            data: rs9p::Data(b"hello".to_vec())
        }
    );
    assert_eq!(replies[3].body, FCall::RClunk);
}

#[tokio::test]
async fn fid_cap_gives_emfile() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(
        tree.clone(),
        Limits {
            max_fids: 3,
            ..Limits::default()
        },
    );
    p.attach().await;
    assert!(matches!(p.walk(2, 0, 1, &[]).await, FCall::RWalk { .. }));
    assert!(matches!(p.walk(3, 0, 2, &[]).await, FCall::RWalk { .. }));
    assert_eq!(p.walk(4, 0, 3, &[]).await, lerror(Errno::EMFILE));
    assert_eq!(p.rpc(5, attach(3)).await, lerror(Errno::EMFILE));
    assert_eq!(p.rpc(6, FCall::TClunk { fid: 2 }).await, FCall::RClunk);
    assert!(matches!(p.walk(7, 0, 3, &[]).await, FCall::RWalk { .. }));
}

#[tokio::test]
async fn flush_gets_through_at_the_inflight_cap() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(
        tree.clone(),
        Limits {
            max_inflight: 2,
            ..Limits::default()
        },
    );
    p.attach().await;
    p.open(1, "block").await;
    p.open(2, "block").await;
    p.send(
        50,
        FCall::TRead {
            fid: 1,
            offset: 0,
            count: 1,
        },
    )
    .await;
    p.send(
        51,
        FCall::TRead {
            fid: 2,
            offset: 0,
            count: 1,
        },
    )
    .await;
    // Past the cap: parked until a slot frees.
    p.send(
        52,
        FCall::TGetAttr {
            fid: 0,
            req_mask: Default::default(),
        },
    )
    .await;
    p.send(53, FCall::TFlush { oldtag: 50 }).await;
    let mut tags = vec![p.recv().await.tag, p.recv().await.tag];
    tags.sort();
    assert_eq!(tags, [52, 53]);
    // A parked request can itself be flushed: it never runs.
    let started = tree.block_started.load(Ordering::SeqCst);
    p.send(
        55,
        FCall::TRead {
            fid: 1,
            offset: 0,
            count: 1,
        },
    )
    .await; // blocks: the cap is full again
    common::wait_until(|| tree.block_started.load(Ordering::SeqCst) != started).await;
    let before = tree.getattrs.load(Ordering::SeqCst);
    p.send(
        56,
        FCall::TGetAttr {
            fid: 0,
            req_mask: Default::default(),
        },
    )
    .await; // parked
    assert_eq!(p.rpc(57, FCall::TFlush { oldtag: 56 }).await, FCall::RFlush);
    assert_eq!(p.rpc(58, FCall::TFlush { oldtag: 55 }).await, FCall::RFlush);
    assert!(matches!(
        p.rpc(
            59,
            FCall::TGetAttr {
                fid: 0,
                req_mask: Default::default()
            }
        )
        .await,
        FCall::RGetAttr { .. }
    ));
    assert_eq!(
        tree.getattrs.load(Ordering::SeqCst),
        before + 1,
        "the flushed getattr never ran"
    );
}

#[tokio::test]
async fn auth_unsupported_and_xattrs() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree, Limits::default());
    p.attach().await;
    let tauth = FCall::TAuth {
        afid: 9,
        uname: "u".into(),
        aname: "".into(),
        n_uname: NONUNAME,
    };
    assert_eq!(
        p.rpc(2, tauth).await,
        lerror(Errno::ENOENT),
        "diod's tools read ENOENT as no auth needed"
    );
    let symlink = FCall::TSymlink {
        fid: 0,
        name: "l".into(),
        symtgt: "x".into(),
        gid: 0,
    };
    assert_eq!(p.rpc(3, symlink).await, lerror(Errno::EOPNOTSUPP));
    let xattr = FCall::TxAttrWalk {
        fid: 0,
        newfid: 5,
        name: "security.capability".into(),
    };
    assert_eq!(p.rpc(4, xattr).await, lerror(Errno::ENODATA));
    assert_eq!(
        p.rpc(
            5,
            FCall::TRead {
                fid: 0,
                offset: 0,
                count: 1
            }
        )
        .await,
        lerror(Errno::EBADF),
        "read before open"
    );
    assert_eq!(
        p.rpc(6, FCall::TClunk { fid: 42 }).await,
        lerror(Errno::EBADF)
    );
    p.open(1, "hello").await;
    assert_eq!(
        p.rpc(7, FCall::TRemove { fid: 1 }).await,
        lerror(Errno::EACCES)
    );
    assert_eq!(
        p.rpc(8, FCall::TClunk { fid: 1 }).await,
        lerror(Errno::EBADF),
        "Tremove clunked it"
    );
}

#[tokio::test]
async fn readdir_is_packed_into_count() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree, Limits::default());
    p.attach().await;
    p.open(1, ".").await;
    // Each entry is 13 + 8 + 1 + 2 + len(name) bytes: "hello" is 29, "block" 29.
    match p
        .rpc(
            5,
            FCall::TReadDir {
                fid: 1,
                offset: 0,
                count: 60,
            },
        )
        .await
    {
        FCall::RReadDir { data } => {
            assert_eq!(
                data.data
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>(),
                ["hello", "block"]
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn connection_end_clunks_every_live_fid() {
    let tree = Arc::new(TestTree::default());
    let (mut p, srv) = serve_pair(tree.clone(), Limits::default());
    p.attach().await;
    p.open(1, "block").await;
    assert!(matches!(
        p.walk(4, 0, 2, &["dir"]).await,
        FCall::RWalk { .. }
    ));
    p.send(
        9,
        FCall::TRead {
            fid: 1,
            offset: 0,
            count: 1,
        },
    )
    .await;
    common::wait_until(|| tree.block_started.load(Ordering::SeqCst) > 0).await;
    drop(p);
    tokio::time::timeout(HANG, srv)
        .await
        .expect("serve returned")
        .unwrap()
        .unwrap();
    assert_eq!(tree.clunks.load(Ordering::SeqCst), 3);
    assert_eq!(
        tree.block_dropped.load(Ordering::SeqCst),
        1,
        "the blocked read was cancelled"
    );
}

#[tokio::test]
async fn serves_an_already_connected_fd() {
    let tree = Arc::new(TestTree::default());
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let server = tokio::spawn(warren_9p::serve_fd(tree, theirs.into(), Limits::default()));
    ours.set_nonblocking(true).unwrap();
    let mut p = Raw::new(tokio::net::UnixStream::from_std(ours).unwrap());
    p.attach().await;
    p.open(1, "hello").await;
    assert_eq!(
        p.rpc(
            4,
            FCall::TRead {
                fid: 1,
                offset: 0,
                count: 100
            }
        )
        .await,
        FCall::RRead {
            data: rs9p::Data(common::HELLO.to_vec())
        }
    );
    drop(p);
    tokio::time::timeout(HANG, server)
        .await
        .expect("serve_fd returned at EOF")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rflush_never_overtakes_the_reply_it_flushes() {
    let tree = Arc::new(TestTree::default());
    let (mut p, _srv) = serve_pair(tree, Limits::default());
    p.attach().await;
    // A request that finishes at once, flushed at once: either its reply was queued first (and
    // then comes before Rflush) or it was cancelled (and never comes). Never after Rflush.
    let (mut answered, mut cancelled) = (0, 0);
    for _ in 0..300 {
        p.send(
            70,
            FCall::TGetAttr {
                fid: 0,
                req_mask: Default::default(),
            },
        )
        .await;
        p.send(71, FCall::TFlush { oldtag: 70 }).await;
        let first = p.recv().await;
        if first.tag == 70 {
            answered += 1;
            assert!(matches!(first.body, FCall::RGetAttr { .. }));
            assert_eq!(p.recv().await.tag, 71);
        } else {
            cancelled += 1;
            assert_eq!((first.tag, first.body), (71, FCall::RFlush));
        }
        // Nothing for tag 70 may follow Rflush: the next reply is this probe's.
        assert_eq!(
            p.rpc(72, FCall::TClunk { fid: 99 }).await,
            lerror(Errno::EBADF)
        );
    }
    eprintln!("{answered} answered before Rflush, {cancelled} cancelled");
}
