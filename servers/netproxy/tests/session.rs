//! The library API in-process: a session served over a stream that is not a socket, with a
//! decision hook that counts how often it is asked and denies one host.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use common::{HELLO, HttpServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_netproxy::{Decide, Decision, Policy, Records, Resolver, Session, serve_connection};

struct Counting {
    asked: AtomicUsize,
}

#[async_trait]
impl Decide for Counting {
    async fn decide(&self, host: &str, _port: u16) -> Decision {
        self.asked.fetch_add(1, Ordering::SeqCst);
        if host == "denied.test" {
            Decision::Deny("the operator said no".into())
        } else {
            Decision::Allow
        }
    }
}

/// One request through a fresh duplex stream; returns the whole answer.
async fn request(session: &Arc<Session>, head: String) -> String {
    let (mut client, proxy_end) = tokio::io::duplex(64 * 1024);
    let served = tokio::spawn(serve_connection(proxy_end, session.clone()));
    client.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    client.read_to_end(&mut out).await.unwrap();
    drop(client);
    served.await.unwrap();
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn the_hook_is_asked_once_per_destination_and_its_deny_is_the_clients_answer() {
    let server = HttpServer::start();
    let port = server.port();
    let policy = Policy::parse([
        format!("api.test:{port}=127.0.0.1").as_str(),
        format!("denied.test:{port}=127.0.0.1").as_str(),
    ])
    .unwrap();
    let resolver = Resolver::with_hosts("127.0.0.1 api.test denied.test\n").unwrap();
    let hook = Arc::new(Counting {
        asked: AtomicUsize::new(0),
    });
    let session = Arc::new(Session::with_decide(
        "hook-test",
        policy,
        resolver,
        Records::none(),
        hook.clone(),
    ));
    for _ in 0..3 {
        let answer = request(
            &session,
            format!("GET http://api.test:{port}/hello HTTP/1.1\r\nHost: x\r\n\r\n"),
        )
        .await;
        assert!(answer.ends_with(HELLO), "{answer}");
    }
    assert_eq!(hook.asked.load(Ordering::SeqCst), 1, "allows are cached");

    for _ in 0..2 {
        let answer = request(
            &session,
            format!("CONNECT denied.test:{port} HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        assert!(answer.ends_with(&format!(
            "\r\n\r\ndenied.test:{port} denied: the operator said no\n"
        )));
    }
    // A deny is not cached: the hook is asked again next time.
    assert_eq!(hook.asked.load(Ordering::SeqCst), 3);
    // An unlisted host never reaches the hook.
    let answer = request(&session, "CONNECT other.test:443 HTTP/1.1\r\n\r\n".into()).await;
    assert!(answer.starts_with("HTTP/1.1 403 "));
    assert_eq!(hook.asked.load(Ordering::SeqCst), 3);
    assert_eq!(server.wait_exchanges(3).len(), 3);
}

/// A connection whose record cannot be accounted for (the reserve hook refuses: the daemon's
/// receipt queue is full or receiptd is not taking receipts) is closed unserved, and nothing is
/// reached; one that can is served and finished with its record.
#[tokio::test]
async fn a_connection_without_a_place_for_its_receipt_is_not_served() {
    let server = HttpServer::start();
    let port = server.port();
    let policy = Policy::parse([format!("api.test:{port}=127.0.0.1").as_str()]).unwrap();
    let resolver = Resolver::with_hosts("127.0.0.1 api.test\n").unwrap();
    let finished = Arc::new(std::sync::Mutex::new(Vec::new()));
    let places = Arc::new(AtomicUsize::new(1));
    let (done, left) = (finished.clone(), places.clone());
    let records = Records::none().with_reserve(Arc::new(move || {
        if left.fetch_sub(1, Ordering::SeqCst) == 0 {
            return Err("no place in the receipt queue".into());
        }
        let done = done.clone();
        Ok(Box::new(move |r: &warren_netproxy::Record| {
            done.lock().unwrap().push(r.outcome)
        }))
    }));
    let session = Arc::new(Session::new("reserve-test", policy, resolver, records));
    let head = format!("GET http://api.test:{port}/hello HTTP/1.1\r\nHost: x\r\n\r\n");
    let answer = request(&session, head.clone()).await;
    assert!(answer.ends_with(HELLO), "{answer}");
    let answer = request(&session, head).await;
    assert_eq!(answer, "", "served without a place for its receipt");
    // The first exchange is logged by the server once its connection has closed; the second
    // connection was closed before anything was read, so there is never a second.
    assert_eq!(
        server.wait_exchanges(1).len(),
        1,
        "the second reached the server"
    );
    assert_eq!(
        *finished.lock().unwrap(),
        [warren_netproxy::Outcome::Closed]
    );
}

/// A hook that counts its asks and answers allow only once the test releases it.
struct Held {
    asked: AtomicUsize,
    release: tokio::sync::Semaphore,
}

#[async_trait]
impl Decide for Held {
    async fn decide(&self, _host: &str, _port: u16) -> Decision {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let _ = self.release.acquire().await.unwrap();
        Decision::Allow
    }
}

/// Concurrent first connections to a new destination wait on one ask: the gate (and so the
/// operator) is asked once, not once per connection.
#[tokio::test]
async fn concurrent_first_uses_of_a_destination_ask_the_hook_once() {
    let server = HttpServer::start();
    let port = server.port();
    let policy = Policy::parse([format!("api.test:{port}=127.0.0.1").as_str()]).unwrap();
    let resolver = Resolver::with_hosts("127.0.0.1 api.test\n").unwrap();
    let hook = Arc::new(Held {
        asked: AtomicUsize::new(0),
        release: tokio::sync::Semaphore::new(0),
    });
    let session = Arc::new(Session::with_decide(
        "single-ask",
        policy,
        resolver,
        Records::none(),
        hook.clone(),
    ));
    let head = format!("GET http://api.test:{port}/hello HTTP/1.1\r\nHost: x\r\n\r\n");
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (session, head) = (session.clone(), head.clone());
            tokio::spawn(async move { request(&session, head).await })
        })
        .collect();
    // The test's runtime has one thread: yielding lets every client run up to the ask (or to
    // waiting on it); nothing on that path waits on the outside world.
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    hook.release.add_permits(4);
    for c in clients {
        assert!(c.await.unwrap().ends_with(HELLO));
    }
    assert_eq!(
        hook.asked.load(Ordering::SeqCst),
        1,
        "one ask per destination"
    );
}
