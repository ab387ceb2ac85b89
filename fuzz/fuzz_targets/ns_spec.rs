//! The namespace spec parser (`warren_ns::parse`), on any bytes a spec file may hold.
//!
//! Checks: no panic; an error names a line of the text and a column on it (or just past its end); a parsed spec prints
//! (`Spec::to_text`) to text that parses back to an equal spec, and printing that is a fixed
//! point.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // nsd refuses a spec that is not UTF-8 before parsing; the parser sees text.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match warren_ns::parse("fuzz.ns", text) {
        Ok(spec) => {
            let printed = spec.to_text();
            let again = warren_ns::parse("printed.ns", &printed)
                .unwrap_or_else(|e| panic!("printed spec does not parse:\n{printed}\n{e}"));
            assert_eq!(again, spec, "print→parse changed the spec:\n{printed}");
            assert_eq!(again.to_text(), printed, "printing is not a fixed point");
        }
        Err(e) => {
            let lines = text.split('\n').count().max(1);
            assert!(
                (1..=lines).contains(&e.line),
                "error on line {} of {lines}: {e}",
                e.line
            );
            let width = e.source_line.chars().count();
            assert!(
                (1..=width + 1).contains(&e.column),
                "column {} on a line of {width} characters: {e}",
                e.column
            );
            // The rendering (what the user sees) must not panic either.
            let _ = e.to_string();
        }
    }
});
