//! The gate's decision flow, checked over every interleaving of three identical callers, two
//! operator answers, expiry, callers going away, and a crash of the gate and of receiptd.

use stateright::{Checker, Model};
use warren_formal::gate_flow::{Bug, GateFlow};

fn flow(bug: Option<Bug>) -> GateFlow {
    GateFlow {
        callers: 3,
        answers: 2,
        crashes: 1,
        bug,
    }
}

#[test]
fn every_property_holds_and_none_is_vacuous() {
    let checker = flow(None).checker().spawn_bfs().join();
    // `assert_properties` fails on an `always` with a counterexample and on a `sometimes`
    // never witnessed (the witnesses show the properties are not vacuous).
    checker.assert_properties();
    assert!(
        checker.unique_state_count() > 1_000,
        "the model explores little: check its bounds"
    );
    println!(
        "gate flow: {} states, {} unique, depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
}

fn counterexample(bug: Bug, property: &'static str) {
    let checker = flow(Some(bug)).checker().spawn_bfs().join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("planted {bug:?} was not caught by \"{property}\""));
    println!("{bug:?} breaks \"{property}\": {:?}", path.into_actions());
}

#[test]
fn a_spend_that_checks_then_sets_is_caught() {
    counterexample(
        Bug::SpendCheckThenSet,
        "an allow once runs at most one call",
    );
}

#[test]
fn allowing_without_a_receipt_is_caught() {
    counterexample(
        Bug::AllowWithoutReceipt,
        "no call runs without an allowing decision receipt",
    );
}

#[test]
fn a_deny_not_remembered_is_caught() {
    counterexample(
        Bug::DenyNotRemembered,
        "a deny covers identical calls for the session",
    );
}
