//! Rules of the repository itself, checked on its files: the README's test command is the one
//! `.ci/run` runs and sets up a fresh machine by itself, and no test returns early as a pass.

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
