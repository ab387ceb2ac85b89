//! 9P Tflush and tag reuse between our client and server, checked over every interleaving of
//! four requests on three tags, any of which may be given up.

use stateright::{Checker, Model};
use warren_formal::flush::{Bug, Flush};

fn flush(bug: Option<Bug>) -> Flush {
    Flush {
        tags: 3,
        requests: 4,
        bug,
    }
}

#[test]
fn a_reply_always_reaches_its_request_and_tags_are_reused() {
    let checker = flush(None).checker().spawn_bfs().join();
    checker.assert_properties();
    assert!(
        checker.unique_state_count() > 1_000,
        "the model explores little: check its bounds"
    );
    println!(
        "flush: {} states, {} unique, depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
}

fn counterexample(bug: Bug, property: &'static str) {
    let checker = flush(Some(bug)).checker().spawn_bfs().join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("planted {bug:?} was not caught by \"{property}\""));
    println!("{bug:?} breaks \"{property}\": {:?}", path.into_actions());
}

#[test]
fn a_client_freeing_the_tag_at_tflush_is_caught() {
    counterexample(
        Bug::ClientFreesTagAtFlush,
        "a reply reaches the request that carried its tag",
    );
}

#[test]
fn a_server_replying_after_rflush_is_caught() {
    counterexample(
        Bug::ServerRepliesAfterRflush,
        "a reply reaches the request that carried its tag",
    );
    counterexample(
        Bug::ServerRepliesAfterRflush,
        "the server never runs two requests on one tag",
    );
}
