//! warren-verify EXPORT --keys REGISTRY: verifies a receipts export offline.
//! Exit 0 verified, 1 invalid, 2 usage, 5 unknown key, 6 key used after its retirement.

use std::process::ExitCode;

use warren_receiptd::verify::{EXIT_USAGE, verify};

const USAGE: &str = "usage: warren-verify EXPORT --keys REGISTRY";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (export, keys) = match args.as_slice() {
        [e, flag, k] if flag == "--keys" => (e, k),
        [flag, k, e] if flag == "--keys" => (e, k),
        _ => return usage(USAGE.into()),
    };
    let export = match std::fs::read(export) {
        Ok(b) => b,
        Err(e) => return usage(format!("{export}: {e}")),
    };
    let keys = match std::fs::read(keys) {
        Ok(b) => b,
        Err(e) => return usage(format!("{keys}: {e}")),
    };
    let outcome = verify(&export, &keys);
    if outcome.code == 0 {
        println!("{}", outcome.message);
    } else {
        eprintln!("warren-verify: {}", outcome.message);
    }
    ExitCode::from(outcome.code as u8)
}

fn usage(msg: String) -> ExitCode {
    eprintln!("warren-verify: {msg}");
    ExitCode::from(EXIT_USAGE as u8)
}
