//! Rules of the repository itself, checked on its files: the README's test command is the one
//! `.ci/run` runs and sets up a fresh machine by itself, no test returns early as a pass, the
//! tests that need FUSE are the ones scripts/test leaves out without it, and every crate but jail
//! and the probe forbids `unsafe` through the workspace lints; the docs' links and decision
//! citations resolve.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .into()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The README's "## Tests" block is one command; `.ci/run` runs exactly it; it installs the
/// peers and the test runner (only when missing) before it tests.
#[test]
fn the_readme_test_command_sets_up_a_fresh_machine_and_ci_runs_exactly_it() {
    let readme = read("README.md");
    let tests = readme
        .split("\n## Tests\n")
        .nth(1)
        .expect("README has a ## Tests section");
    let block = tests
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```sh block in ## Tests");
    let commands: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(commands.len(), 1, "one command: {commands:?}");
    let command = commands[0].trim();

    let ci = read(".ci/run");
    let ci_commands: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with('#') && !l.starts_with("set ") && !l.starts_with("cd ")
        })
        .collect();
    assert_eq!(ci_commands, [format!("exec {command}")], "{ci}");

    let script = read(command);
    let install = script
        .find("scripts/install-test-deps")
        .expect("the test command installs the peers");
    let nextest = script
        .find("cargo nextest run")
        .expect("the test command runs nextest");
    assert!(install < nextest, "installs before it tests");
    let deps = read("scripts/install-test-deps");
    assert!(
        deps.contains("cargo install cargo-nextest") && deps.contains("--locked"),
        "install-test-deps installs cargo-nextest"
    );
    assert!(
        deps.contains("if ! cargo nextest --version"),
        "and only when it is missing"
    );
}

/// No test prints a skip and returns as a pass: a missing peer fails, a missing kernel feature
/// is left out by scripts/test's filter (nextest: skipped).
#[test]
fn no_test_returns_early_as_a_pass() {
    let mut found = Vec::new();
    let mut stack = vec![repo_root()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    stack.push(path);
                }
                continue;
            }
            if !name.ends_with(".rs") || path.ends_with("warren/tests/repo.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, line) in text.lines().enumerate() {
                let l = line.to_ascii_lowercase();
                if l.contains("eprintln!") && (l.contains("\"skip") || l.contains("skipped")) {
                    found.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "skip-and-return paths:\n{}",
        found.join("\n")
    );
}

/// The tests that need FUSE are the ones scripts/test leaves out on a host without it: every
/// test binary that calls `require_fuse()` (test-support), directly or through a helper of its
/// crate's `tests/common`, is in scripts/test's FUSE filter, and every binary the filter names
/// exists. So a host without FUSE reports each such test as skipped, never as failed or passed.
#[test]
fn every_test_needing_fuse_is_in_scripts_tests_fuse_filter() {
    let script = read("scripts/test");
    let line = script
        .lines()
        .find_map(|l| l.strip_prefix("fuse_tests='"))
        .expect("scripts/test has its fuse_tests filter");
    let listed: std::collections::BTreeSet<String> = line
        .split("binary_id(")
        .skip(1)
        .map(|s| s.split(')').next().unwrap().to_string())
        .collect();
    let mut needing = std::collections::BTreeSet::new();
    let mut known = std::collections::BTreeSet::new();
    for tests in crate_test_dirs() {
        let (package, dir) = tests;
        // The helpers of this crate's tests/common that require FUSE.
        let mut helpers = vec!["require_fuse".to_string()];
        for common in rs_files(&dir.join("common")) {
            let text = std::fs::read_to_string(common).unwrap();
            for chunk in text.split("fn ").skip(1) {
                let name: String = chunk
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if chunk.contains("require_fuse()") && !name.is_empty() {
                    helpers.push(name);
                }
            }
        }
        for file in rs_files(&dir) {
            if file.ends_with("warren/tests/repo.rs") {
                continue;
            }
            let binary = file.file_stem().unwrap().to_string_lossy().into_owned();
            let id = format!("{package}::{binary}");
            known.insert(id.clone());
            let text = std::fs::read_to_string(&file).unwrap();
            if helpers.iter().any(|h| calls(&text, h)) {
                needing.insert(id);
            }
        }
    }
    let missing: Vec<_> = needing.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "these test binaries need FUSE but scripts/test's fuse_tests does not list them: {missing:?}"
    );
    let unknown: Vec<_> = listed.difference(&known).collect();
    assert!(
        unknown.is_empty(),
        "scripts/test's fuse_tests names test binaries that do not exist: {unknown:?}"
    );
}

/// Whether `text` calls `name(` (not as part of a longer name, not its definition).
fn calls(text: &str, name: &str) -> bool {
    let call = format!("{name}(");
    text.match_indices(&call).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && !text[..i].ends_with("fn ")
    })
}

/// Every workspace crate's package name and its `tests/` dir (the crates with one).
fn crate_test_dirs() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![repo_root()];
    while let Some(dir) = stack.pop() {
        let manifest = dir.join("Cargo.toml");
        if let Ok(text) = std::fs::read_to_string(&manifest)
            && let Some(name) = text
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))
                .map(|n| n.trim_end_matches('"').to_string())
            && dir.join("tests").is_dir()
        {
            out.push((name, dir.join("tests")));
        }
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() && !name.starts_with('.') && name != "target" && name != "fuzz" {
                stack.push(path);
            }
        }
    }
    out
}

/// The `.rs` files directly in `dir` (none if it does not exist).
fn rs_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect()
}

/// "All `unsafe` lives in warren-jail" is kept by the compiler, not by habit: the workspace
/// forbids `unsafe_code` and denies an `unsafe` block without a `// SAFETY:` line, and every
/// member takes those lints, but jail and the escape suite's probe, whose own tables are the
/// same less `unsafe_code`.
#[test]
fn every_crate_but_jail_and_the_probe_forbids_unsafe_by_the_workspace_lints() {
    const MAY_USE_UNSAFE: &[&str] = &["jail", "tests/probe"];
    let root = read("Cargo.toml");
    let table = |name: &str| {
        root.split(&format!("\n[{name}]\n"))
            .nth(1)
            .and_then(|t| t.split("\n[").next())
            .unwrap_or_else(|| panic!("Cargo.toml has no [{name}]"))
            .to_string()
    };
    assert!(
        table("workspace.lints.rust").contains("unsafe_code = \"forbid\""),
        "the workspace lints must forbid unsafe_code"
    );
    assert!(
        table("workspace.lints.clippy").contains("undocumented_unsafe_blocks = \"deny\""),
        "the workspace lints must deny an unsafe block without a SAFETY comment"
    );
    let members = root
        .split("members = [")
        .nth(1)
        .and_then(|m| m.split(']').next())
        .expect("Cargo.toml lists its members");
    let mut checked = 0;
    for member in members.split(',').map(|m| m.trim().trim_matches('"')) {
        if member.is_empty() {
            continue;
        }
        let manifest = read(&format!("{member}/Cargo.toml"));
        if MAY_USE_UNSAFE.contains(&member) {
            assert!(
                manifest.contains("undocumented_unsafe_blocks = \"deny\""),
                "{member}/Cargo.toml: its own lints must still deny an unsafe block without SAFETY"
            );
        } else {
            assert!(
                manifest.contains("\n[lints]\nworkspace = true"),
                "{member}/Cargo.toml must take the workspace's lints (`[lints] workspace = true`)"
            );
        }
        checked += 1;
    }
    assert!(checked > 20, "only {checked} members found");
}

/// Every link and repository path the docs name exists, and every citation of
/// docs/decisions.md names a section by its id, with a title that is that section's
/// (`scripts/check-doc-links`).
#[test]
fn doc_links_and_decision_citations_resolve() {
    let out = std::process::Command::new("python3")
        .arg(repo_root().join("scripts/check-doc-links"))
        .output()
        .expect("python3 runs scripts/check-doc-links");
    assert!(
        out.status.success(),
        "scripts/check-doc-links:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
