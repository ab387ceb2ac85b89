//! Call files: one open is one call, the offset rule, concurrency, strict arguments, withdrawal,
//! flush, and the per-connection caps.

mod common;

use std::time::Duration;

use common::*;
use warren_9p::{Errno, oflags};
use warren_toolfs::{Envelope, Status, Taint};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_returns_canonical_arguments_in_an_envelope() {
    let d = Daemon::start();
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let env = call_envelope(
        &root,
        "echo",
        br#"{ "b": [1.50, "x\u0041"], "a": {"z": null} }"#,
    )
    .await;
    assert_eq!(env.status, Status::Ok);
    assert_eq!(env.tool, "echo");
    assert_eq!(env.taint, Taint::Untrusted);
    assert_eq!(env.content, r#"{"a":{"z":null},"b":[1.5,"xA"]}"#);
    assert!(env.digest_matches());
    assert_eq!(env.digest, digest(env.content.as_bytes()));
    // The envelope itself is canonical JSON.
    let raw = call(&root, "echo", br#"{"k":1}"#).await;
    assert_eq!(raw, Envelope::parse(&raw).unwrap().to_canonical());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_r_plus_b_idiom() {
    // f = open(p, 'r+b', buffering=0); f.write(a); f.read(); f.read() → b''
    let d = Daemon::start();
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let args = br#"{"idiom":"python"}"#;
    let fid = open_call(&root, "echo").await;
    assert_eq!(fid.write(0, args).await.unwrap() as usize, args.len());
    let n = args.len() as u64;
    let result = fid.read(n, 65536).await.unwrap();
    let env = Envelope::parse(&result).unwrap();
    assert_eq!(env.content, r#"{"idiom":"python"}"#);
    assert!(
        fid.read(n + result.len() as u64, 65536)
            .await
            .unwrap()
            .is_empty(),
        "0 bytes at the end"
    );
    // Reading again where the first read was returns the same immutable result.
    assert_eq!(fid.read(n, 65536).await.unwrap(), result);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_exec_3_idiom_and_the_offset_rule() {
    // exec 3<>call; printf part1 >&3; printf part2 >&3; cat <&3 — the writes land at growing
    // offsets (ignored: they append), cat reads from where the writes left the shared offset.
    let d = Daemon::start();
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let (p1, p2) = (&br#"{"idiom":"#[..], &br#""bash"}"#[..]);
    let fid = open_call(&root, "echo").await;
    fid.write(0, p1).await.unwrap();
    fid.write(0, p2).await.unwrap(); // any offset: appended
    let o0 = 1000u64; // the first read's offset is o₀, whatever it is
    let mut result = Vec::new();
    loop {
        // cat-like small reads
        let chunk = fid.read(o0 + result.len() as u64, 7).await.unwrap();
        if chunk.is_empty() {
            break;
        }
        assert!(chunk.len() <= 7);
        result.extend_from_slice(&chunk);
    }
    let env = Envelope::parse(&result).unwrap();
    assert_eq!(env.content, r#"{"idiom":"bash"}"#);
    // result[o − o₀ …]: a read in the middle.
    assert_eq!(fid.read(o0 + 5, 10).await.unwrap(), result[5..15]);
    // Below o₀ there is nothing to map to.
    assert_eq!(fid.read(o0 - 1, 10).await.err(), Some(Errno::EINVAL));
    // The result is immutable: a write after the first read is refused.
    assert_eq!(fid.write(0, b"{}").await.err(), Some(Errno::EBUSY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hundred_concurrent_calls_each_get_their_own_result() {
    let d = Daemon::start();
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let root = std::sync::Arc::new(root);
    // Open all first, so the calls really overlap (each sleeps 300 ms inside echo).
    let mut fids = Vec::new();
    for i in 0..100 {
        let fid = open_call(&root, "echo").await;
        fid.write_all(0, format!(r#"{{"delay_ms":300,"i":{i}}}"#).as_bytes())
            .await
            .unwrap();
        fids.push(fid);
    }
    let tasks: Vec<_> = fids
        .into_iter()
        .enumerate()
        .map(|(i, fid)| {
            tokio::spawn(async move {
                let env = Envelope::parse(&fid.read_to_end(0).await.unwrap()).unwrap();
                (i, env)
            })
        })
        .collect();
    for t in tasks {
        let (i, env) = t.await.unwrap();
        assert_eq!(env.status, Status::Ok);
        assert_eq!(env.content, format!(r#"{{"delay_ms":300,"i":{i}}}"#));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_arguments_are_refused_naming_the_field_and_never_run() {
    let d = Daemon::start();
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let cases: [(&[u8], &str); 7] = [
        (br#"{"a":{"b":1,"b":2}}"#, r#"/a: duplicate key "b""#),
        (br#"{"n":NaN}"#, "/n: expected value"),
        (br#"{"n":1e999}"#, "/n: number out of range"),
        (
            br#"{"n":9007199254740993}"#,
            "/n: integer 9007199254740993 is beyond ±2^53",
        ),
        (
            br#"{"n":[1,-9007199254740993]}"#,
            "/n/1: integer -9007199254740993",
        ),
        (
            br#"{"delay_ms":"x"}"#,
            r#"/delay_ms: "x" is not of type "integer""#,
        ),
        (
            br#"{"delay_ms":10001}"#,
            "/delay_ms: 10001 is greater than the maximum of 10000",
        ),
    ];
    for (args, want) in cases {
        let env = call_envelope(&root, "echo", args).await;
        assert_eq!(
            env.status,
            Status::Error,
            "{}",
            String::from_utf8_lossy(args)
        );
        assert!(
            env.content.contains(want),
            "{:?} does not contain {want:?}",
            env.content
        );
    }
    // Nothing reached echo.
    assert!(d.journal().is_empty(), "{:?}", d.journal());
    // A sound call does.
    call_envelope(&root, "echo", b"{}").await;
    assert_eq!(d.journal().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_closed_before_its_first_read_never_runs() {
    let d = Daemon::start();
    let (client, root) = d.granted(&record(&["echo"]), &[]).await;
    let withdrawn = br#"{"withdrawn":"clunk"}"#;
    let fid = open_call(&root, "echo").await;
    fid.write_all(0, withdrawn).await.unwrap();
    fid.clunk().await.unwrap();
    // Another call on the same connection after it, as a barrier.
    call_envelope(&root, "echo", br#"{"after":1}"#).await;
    // And a connection that goes away with a call open and written.
    let dropped = br#"{"withdrawn":"connection"}"#;
    {
        let sock = d.hand_over(&record(&["echo"]), &[]).unwrap();
        let ours = sock.try_clone().unwrap();
        sock.set_nonblocking(true).unwrap();
        let c2 = warren_9p::Client::new(tokio::net::UnixStream::from_std(sock).unwrap(), 1 << 20)
            .await
            .unwrap();
        let root2 = c2.attach("x", "").await.unwrap();
        let fid2 = open_call(&root2, "echo").await;
        fid2.write_all(0, dropped).await.unwrap();
        // The connection goes down under the client: no clunk ever reaches toolfs.
        ours.shutdown(std::net::Shutdown::Both).unwrap();
        drop((fid2, root2, c2));
    }
    for _ in 0..500 {
        if d.log()
            .matches("call withdrawn: closed before its first read")
            .count()
            >= 2
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        d.log()
            .matches("call withdrawn: closed before its first read")
            .count(),
        2,
        "{}",
        d.log()
    );
    let journal = d.journal();
    assert!(
        !journal.iter().any(|l| l.ends_with(&digest(withdrawn))),
        "{journal:?}"
    );
    assert!(
        !journal.iter().any(|l| l.ends_with(&digest(dropped))),
        "{journal:?}"
    );
    assert!(
        journal.contains(&format!("done {}", digest(br#"{"after":1}"#))),
        "{journal:?}"
    );
    drop(client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_read_leaves_a_started_call_running_and_the_next_read_gets_its_result() {
    let d = Daemon::start();
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let args = br#"{"delay_ms":1500,"flush":true}"#;
    let fid = open_call(&root, "echo").await;
    fid.write_all(0, args).await.unwrap();
    let started = format!("start {}", digest(args));
    tokio::select! {
        r = fid.read(args.len() as u64, 65536) => panic!("the read should still be blocked: {r:?}"),
        () = wait_journal(&d, |j| j.contains(&started)) => {}
    }
    // The read future is gone: the client flushed it. The connection still answers…
    assert_eq!(tools_file_names(&root).await, ["echo"]);
    // …and the call ran on: re-issuing the read (as Python does after EINTR) gets its result.
    let result = fid.read_to_end(args.len() as u64).await.unwrap();
    let env = Envelope::parse(&result).unwrap();
    assert_eq!(env.content, r#"{"delay_ms":1500,"flush":true}"#);
    let runs = d.journal().iter().filter(|l| **l == started).count();
    assert_eq!(runs, 1, "the call ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_opens_never_share_results_and_reads_without_writes_get_an_error() {
    let d = Daemon::start();
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let a = open_call(&root, "echo").await;
    let b = open_call(&root, "echo").await;
    a.write_all(0, br#"{"who":"a"}"#).await.unwrap();
    b.write_all(0, br#"{"who":"b"}"#).await.unwrap();
    let rb = Envelope::parse(&b.read_to_end(0).await.unwrap()).unwrap();
    let ra = Envelope::parse(&a.read_to_end(0).await.unwrap()).unwrap();
    assert_eq!(
        (ra.content.as_str(), rb.content.as_str()),
        (r#"{"who":"a"}"#, r#"{"who":"b"}"#)
    );
    // `cat call` alone: a call with no arguments, refused.
    let c = root.walk(&["echo", "call"]).await.unwrap();
    c.open(oflags::RDONLY).await.unwrap();
    let env = Envelope::parse(&c.read_to_end(0).await.unwrap()).unwrap();
    assert_eq!(env.status, Status::Error);
    assert!(env.content.contains("no arguments"), "{}", env.content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_on_open_calls_and_argument_bytes() {
    let d = Daemon::start_with(&["--max-open-calls", "4", "--max-arg-bytes", "1024"]);
    let grant = record(&["echo"]);
    let (_c, root) = d.granted(&grant, &[]).await;
    // A second connection of the same session shares the session's cap.
    let (_c1b, root1b) = d.granted(&grant, &[]).await;
    let mut open = Vec::new();
    for _ in 0..2 {
        open.push(open_call(&root, "echo").await);
        open.push(open_call(&root1b, "echo").await);
    }
    for r in [&root, &root1b] {
        let fifth = r.walk(&["echo", "call"]).await.unwrap();
        assert_eq!(fifth.open(oflags::RDWR).await.err(), Some(Errno::EAGAIN));
    }
    // Another session has a cap of its own.
    let (_c2, root2) = d.granted(&record(&["echo"]), &[]).await;
    call_envelope(&root2, "echo", b"{}").await;
    // Closing one frees a place.
    open.pop().unwrap().clunk().await.unwrap();
    let fid = open_call(&root, "echo").await;
    let ran = d.journal().len();
    fid.write_all(0, &[b' '; 1000]).await.unwrap();
    assert_eq!(fid.write(0, &[b' '; 25]).await.err(), Some(Errno::EFBIG));
    // A refused write poisons the call: a reader may have sent its first read before it saw
    // the refusal (the bridge sends the first write with the first read), so nothing may run on
    // what was written before it.
    fid.write(0, b"{}").await.unwrap();
    let env = Envelope::parse(&fid.read_to_end(0).await.unwrap()).unwrap();
    assert_eq!(env.status, Status::Error, "{env:?}");
    assert!(
        env.content.contains("over 1024 bytes") && env.content.contains("nothing ran"),
        "{}",
        env.content
    );
    assert_eq!(d.journal().len(), ran, "{:?}", d.journal());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misbehaving_connection_does_not_stop_toolfs() {
    use std::io::Write;
    let mut d = Daemon::start();
    let mut garbage = d.hand_over(&record(&["echo"]), &[]).unwrap();
    garbage.write_all(&[0xff; 64]).unwrap();
    let mut op = std::os::unix::net::UnixStream::connect(d.operator_sock()).unwrap();
    op.write_all(&[0x07, 0, 0, 0, 0xff, 0xff, 0xff]).unwrap();
    drop(op);
    drop(garbage);
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    assert_eq!(call_envelope(&root, "echo", b"{}").await.status, Status::Ok);
    assert!(d.is_running());
}
