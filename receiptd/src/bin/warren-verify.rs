//! warren-verify EXPORT --keys REGISTRY [--head CHECKPOINT [--proof CONSISTENCY]] [--size N] [--entry SEQ:HASH]:
//! verifies a receipts export offline. Exit 0 verified, 1 invalid, 2 usage, 3 incomplete (ends before --head or
//! --size), 5 unknown key, 6 key used after its retirement. What it checks: `specs/receipts.md`.

use std::process::ExitCode;

use warren_receiptd::verify::{EXIT_USAGE, Require, verify_with};

const USAGE: &str = "usage: warren-verify EXPORT --keys REGISTRY [--head CHECKPOINT [--proof CONSISTENCY]] [--size N] [--entry SEQ:HASH]";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut export, mut keys, mut head, mut size, mut proof, mut entry) =
        (None, None, None, None, None, None);
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "--keys" => &mut keys,
            "--head" => &mut head,
            "--size" => &mut size,
            "--proof" => &mut proof,
            "--entry" => &mut entry,
            _ if export.is_none() && !arg.starts_with("--") => {
                export = Some(arg);
                continue;
            }
            _ => return usage(USAGE.into()),
        };
        match args.next() {
            Some(value) if slot.is_none() => *slot = Some(value),
            _ => return usage(USAGE.into()),
        }
    }
    let (Some(export), Some(keys)) = (export, keys) else {
        return usage(USAGE.into());
    };
    let read = |path: &str| std::fs::read(path).map_err(|e| format!("{path}: {e}"));
    let (export, keys) = match (read(&export), read(&keys)) {
        (Ok(e), Ok(k)) => (e, k),
        (Err(e), _) | (_, Err(e)) => return usage(e),
    };
    if proof.is_some() && head.is_none() {
        return usage("--proof goes with --head".into());
    }
    let text = |path: Option<String>, flag: &str| match path.as_deref().map(read).transpose() {
        Ok(bytes) => bytes
            .map(String::from_utf8)
            .transpose()
            .map_err(|_| format!("{flag}: not UTF-8 text")),
        Err(e) => Err(e),
    };
    let (head, proof) = match (text(head, "--head"), text(proof, "--proof")) {
        (Ok(h), Ok(p)) => (h, p),
        (Err(e), _) | (_, Err(e)) => return usage(e),
    };
    let size = match size.map(|s| s.parse::<u64>()).transpose() {
        Ok(s) => s,
        Err(e) => return usage(format!("--size: {e}")),
    };
    let entry = match entry.as_deref().map(parse_entry).transpose() {
        Ok(e) => e,
        Err(e) => return usage(e),
    };
    let require = Require {
        head: head.as_deref(),
        size,
        proof: proof.as_deref(),
        entry,
    };
    let outcome = verify_with(&export, &keys, require);
    if outcome.code == 0 {
        println!("{}", outcome.message);
    } else {
        eprintln!("warren-verify: {}", outcome.message);
    }
    ExitCode::from(outcome.code as u8)
}

fn parse_entry(arg: &str) -> Result<(u64, &str), String> {
    warren_receiptd::verify::parse_entry(arg).map_err(|e| format!("--entry: {e}"))
}

fn usage(msg: String) -> ExitCode {
    eprintln!("warren-verify: {msg}");
    ExitCode::from(EXIT_USAGE as u8)
}
