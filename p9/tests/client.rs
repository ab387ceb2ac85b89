//! The client against our own server, over a real socketpair.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::TestTree;
use rs9p::FCall;
use warren_9p::{Client, Errno, Limits, oflags};

async fn pair(
    tree: Arc<TestTree>,
    limits: Limits,
) -> (Client, tokio::task::JoinHandle<std::io::Result<()>>) {
    let (a, b) = tokio::net::UnixStream::pair().unwrap();
    let server = tokio::spawn(warren_9p::serve(tree, b, limits));
    (Client::new(a, 1 << 20).await.unwrap(), server)
}

#[tokio::test]
async fn reads_writes_lists_and_walks_long_paths() {
    let tree = Arc::new(TestTree::default());
    let (client, _srv) = pair(
        tree.clone(),
        Limits {
            max_msize: 8192,
            ..Limits::default()
        },
    )
    .await;
    assert_eq!(
        client.msize(),
        8192,
        "negotiated down to the server's limit"
    );
    let root = client.attach("u", "").await.unwrap();

    let hello = root.walk(&["hello"]).await.unwrap();
    hello.open(oflags::RDONLY).await.unwrap();
    assert_eq!(hello.read_to_end(0).await.unwrap(), common::HELLO);

    // 20 names: sent as a Twalk of 16 and one of 4, both seen by the tree.
    let mut names = vec![".."; 19];
    names.push("hello");
    let far = root.walk(&names).await.unwrap();
    assert_eq!(far.qid().path, 3);
    assert_eq!(tree.walked.lock().unwrap().len(), 1 + 20);
    assert_eq!(root.walk_path("/dir//leaf").await.unwrap().qid().path, 6);
    assert_eq!(root.walk(&["nope"]).await.err(), Some(Errno::ENOENT));
    assert_eq!(
        root.walk(&["dir", "nope"]).await.err(),
        Some(Errno::ENOENT),
        "a partial walk is an error"
    );

    let log = root.walk(&["log"]).await.unwrap();
    log.open(oflags::WRONLY).await.unwrap();
    let big = vec![b'a'; 20_000];
    log.write_all(0, &big).await.unwrap();
    let pieces = tree.log.lock().unwrap().clone();
    assert!(
        pieces.len() >= 3,
        "20000 bytes at msize 8192 take several Twrites"
    );
    assert_eq!(pieces.concat().len(), 20_000);

    let dir = root.walk(&[]).await.unwrap();
    dir.open(oflags::RDONLY).await.unwrap();
    let names: Vec<String> = dir.read_dir_names().await.unwrap();
    assert_eq!(names, ["hello", "block", "log", "dir"]);
}

#[tokio::test]
async fn fid_numbers_are_reused_only_after_rclunk() {
    let tree = Arc::new(TestTree::default());
    let (client, _srv) = pair(tree.clone(), Limits::default()).await;
    let root = client.attach("u", "").await.unwrap();
    let a = root.walk(&["hello"]).await.unwrap();
    let id = a.id();
    let b = root.walk(&["hello"]).await.unwrap();
    assert_ne!(b.id(), id, "a live fid's number is not handed out");
    a.clunk().await.unwrap();
    let c = root.walk(&["hello"]).await.unwrap();
    assert_eq!(c.id(), id, "reused after Rclunk");
    drop(c);
    // The background clunk of a dropped Fid reaches the server.
    common::wait_until(|| tree.clunks.load(Ordering::SeqCst) >= 2).await;
}

#[tokio::test]
async fn dropped_request_sends_tflush() {
    let tree = Arc::new(TestTree::default());
    let (client, _srv) = pair(tree.clone(), Limits::default()).await;
    let root = client.attach("u", "").await.unwrap();
    let block = root.walk(&["block"]).await.unwrap();
    block.open(oflags::RDONLY).await.unwrap();
    let id = block.id();
    let read = client.rpc(FCall::TRead {
        fid: id,
        offset: 0,
        count: 10,
    });
    tokio::select! {
        r = read => panic!("the blocked read answered: {r:?}"),
        _ = common::wait_until(|| tree.block_started.load(Ordering::SeqCst) > 0) => {}
    }
    // The read's future is dropped: only a Tflush can make the server drop its handler (a hang
    // here means no Tflush was sent).
    common::wait_until(|| tree.block_dropped.load(Ordering::SeqCst) > 0).await;
    // The connection and the fid still work.
    assert!(block.getattr().await.is_ok());
}

#[tokio::test]
async fn lost_connection_fails_pending_and_new_requests() {
    let tree = Arc::new(TestTree::default());
    let (client, srv) = pair(tree.clone(), Limits::default()).await;
    let root = client.attach("u", "").await.unwrap();
    let block = root.walk(&["block"]).await.unwrap();
    block.open(oflags::RDONLY).await.unwrap();
    let pending = tokio::spawn({
        let client = client.clone();
        let id = block.id();
        async move {
            client
                .rpc(FCall::TRead {
                    fid: id,
                    offset: 0,
                    count: 1,
                })
                .await
        }
    });
    common::wait_until(|| tree.block_started.load(Ordering::SeqCst) > 0).await;
    srv.abort(); // drops the server's end of the socket
    assert_eq!(pending.await.unwrap(), Err(Errno::ECONNRESET));
    assert_eq!(block.getattr().await.err(), Some(Errno::ENOTCONN));
}
