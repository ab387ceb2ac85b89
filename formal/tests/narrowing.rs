//! Narrowing over handles, checked over every interleaving of two clones (at any depth, each
//! asking one directive of a menu in its parent's words), two adversary moves in the project
//! directory (renames and planted symlinks, between any check and build), receipts spent and
//! namespaces ended.

use stateright::{Checker, HasDiscoveries, Model};
use warren_formal::narrowing::{Bug, Narrowing, State, covers};

fn narrowing(bug: Option<Bug>) -> Narrowing {
    Narrowing {
        clones: 2,
        moves: 2,
        spends: 4,
        bug,
    }
}

#[test]
fn every_property_holds_and_none_is_vacuous() {
    let checker = narrowing(None).checker().spawn_bfs().join();
    checker.assert_properties();
    assert!(
        checker.unique_state_count() > 10_000,
        "the model explores little: check its bounds"
    );
    println!(
        "narrowing: {} states, {} unique, depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
}

fn counterexample(bug: Bug, property: &'static str) {
    let checker = narrowing(Some(bug))
        .checker()
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .spawn_bfs()
        .join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("planted {bug:?} was not caught by \"{property}\""));
    println!("{bug:?} breaks \"{property}\": {:?}", path.into_actions());
}

const WITHIN: &str = "a namespace reaches nothing its parent does not, with no more access";

#[test]
fn a_reopen_by_name_after_the_check_is_caught() {
    counterexample(Bug::ReopenByName, WITHIN);
    counterexample(
        Bug::ReopenByName,
        "no namespace reaches the secret or warren's own directory",
    );
}

#[test]
fn a_write_beneath_a_nested_read_is_caught() {
    counterexample(Bug::WriteBeneathNestedRead, WITHIN);
}

#[test]
fn nested_binds_found_by_their_target_names_are_caught() {
    counterexample(Bug::NestedByTargetName, WITHIN);
}

#[test]
fn a_child_mount_resolved_by_name_is_caught() {
    counterexample(
        Bug::MountByName,
        "a child's tools and servers are within its parent's",
    );
}

#[test]
fn a_clone_whose_budget_is_not_carved_from_its_subtree_is_caught() {
    counterexample(
        Bug::LimitsNotCarved,
        "a subtree never spends more than its root's budget",
    );
}

#[test]
fn a_clone_pin_not_checked_by_the_root_rules_is_caught() {
    counterexample(
        Bug::PinNotRechecked,
        "every pin passes the root's address rules",
    );
}

#[test]
fn grant_inflation_is_caught() {
    counterexample(
        Bug::GrantInflation,
        "a child's tools and servers are within its parent's",
    );
}

#[test]
fn a_subtree_outliving_its_root_is_caught() {
    counterexample(Bug::EndRootOnly, "a subtree ends with its root");
}

/// The model's `covers` is a partial order (reflexive, transitive, antisymmetric up to equal
/// reach and grants) over every namespace of every state the model reaches in a smaller run.
#[test]
fn covers_is_a_partial_order_over_the_namespaces_the_model_builds() {
    let model = Narrowing {
        clones: 2,
        moves: 1,
        spends: 0,
        bug: None,
    };
    let checker = model.clone().checker().spawn_bfs().join();
    let mut states: Vec<State> = Vec::new();
    // Every reachable state: walk the model ourselves (the checker keeps only fingerprints).
    let mut frontier = model.init_states();
    let mut seen = std::collections::HashSet::new();
    while let Some(s) = frontier.pop() {
        if !seen.insert(format!("{s:?}")) {
            continue;
        }
        let mut actions = Vec::new();
        model.actions(&s, &mut actions);
        for a in actions {
            if let Some(next) = model.next_state(&s, a) {
                frontier.push(next);
            }
        }
        states.push(s);
    }
    assert_eq!(states.len(), checker.unique_state_count());
    let mut triples = 0;
    for s in &states {
        let ns = &s.namespaces;
        for a in ns {
            assert!(covers(&s.host, a, a), "covers is not reflexive: {a:?}");
            for b in ns {
                if covers(&s.host, a, b) && covers(&s.host, b, a) {
                    assert_eq!(
                        warren_formal::narrowing::reach(&s.host, a),
                        warren_formal::narrowing::reach(&s.host, b),
                        "covers both ways but different reach"
                    );
                }
                for c in ns {
                    if covers(&s.host, a, b) && covers(&s.host, b, c) {
                        assert!(covers(&s.host, a, c), "covers is not transitive");
                        triples += 1;
                    }
                }
            }
        }
    }
    assert!(triples > 100, "too few chains to say anything: {triples}");
}
