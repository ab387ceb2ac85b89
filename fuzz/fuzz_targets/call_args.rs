//! A tool call's arguments: the strict parse, schema validation and RFC 8785 canonicalisation
//! (`warren_toolfs::args::prepare`, `warren_jcs::value_to_vec`), on any bytes a caller writes.
//!
//! The first byte picks a built-in tool (its schema); the rest is what the caller wrote.
//! Checks: no panic; whatever parses canonicalises, and warren-jcs writes exactly the bytes of
//! the reference canonicaliser (`serde_json_canonicalizer`); the canonical form parses strictly
//! again and canonicalises to itself (idempotent); arguments a schema accepts are accepted again
//! in their canonical form, with the same canonical bytes.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use warren_toolfs::args::{parse_strict, prepare};
use warren_toolfs::catalog::{Catalog, ToolDef};

static TOOLS: LazyLock<Vec<std::sync::Arc<ToolDef>>> = LazyLock::new(|| {
    let catalog = Catalog::builtin().expect("the built-in catalog");
    let names: Vec<String> = catalog.names().map(str::to_owned).collect();
    names
        .iter()
        .map(|n| catalog.get(n).expect("listed").clone())
        .collect()
});

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let Ok(value) = parse_strict(bytes) else {
        return;
    };
    let canonical =
        warren_jcs::value_to_vec(&value).expect("a strictly parsed value canonicalises");
    let reference = serde_json_canonicalizer::to_vec(&value).expect("reference canonicaliser");
    assert_eq!(
        canonical, reference,
        "warren-jcs and the reference disagree on {value}"
    );
    let reparsed = parse_strict(&canonical).unwrap_or_else(|e| {
        panic!(
            "canonical form {:?} does not parse strictly: {e}",
            String::from_utf8_lossy(&canonical)
        )
    });
    assert_eq!(
        warren_jcs::value_to_vec(&reparsed).expect("canonicalises"),
        canonical,
        "canonicalisation is not idempotent"
    );

    let tool = &TOOLS[pick as usize % TOOLS.len()];
    if let Ok(args) = prepare(bytes, &tool.validator) {
        assert_eq!(args.canonical, canonical);
        let again = prepare(&canonical, &tool.validator).unwrap_or_else(|e| {
            panic!(
                "{}: accepted {:?} but refuses its canonical form: {e}",
                tool.name,
                String::from_utf8_lossy(bytes)
            )
        });
        assert_eq!(again.canonical, canonical);
    }
});
