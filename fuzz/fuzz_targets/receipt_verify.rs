//! The offline receipt verifier (`warren_receiptd::verify`, what `warren verify` runs), on an
//! arbitrary export and key registry.
//!
//! Input: the registry's bytes, a NUL, then the export's bytes (no NUL: the whole input is the
//! export and the registry is empty). The seed corpus holds real exports with their registries,
//! so mutations start from exports that verify.
//! Checks: no panic; the outcome is one of the documented exit codes; a verified export holds
//! at least one entry and one checkpoint; and the last line of a verified export is a checkpoint
//! covering every entry, so the export without it never verifies.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_receiptd::verify::{
    EXIT_INVALID, EXIT_KEY_RETIRED, EXIT_UNKNOWN_KEY, EXIT_USAGE, EXIT_VERIFIED, verify,
};

fuzz_target!(|data: &[u8]| {
    let (registry, export) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&[][..], data),
    };
    let outcome = verify(export, registry);
    assert!(
        [
            EXIT_VERIFIED,
            EXIT_INVALID,
            EXIT_USAGE,
            EXIT_UNKNOWN_KEY,
            EXIT_KEY_RETIRED
        ]
        .contains(&outcome.code),
        "exit code {}: {}",
        outcome.code,
        outcome.message
    );
    if outcome.code != EXIT_VERIFIED {
        return;
    }
    assert!(
        outcome.entries >= 1 && outcome.checkpoints >= 1,
        "{outcome:?}"
    );
    // The export ends with a newline; cut its last line off.
    let body = &export[..export.len() - 1];
    let cut = body
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |at| at + 1);
    let shorter = verify(&export[..cut], registry);
    assert_ne!(
        shorter.code, EXIT_VERIFIED,
        "still verified without its last line: {}",
        shorter.message
    );
});
