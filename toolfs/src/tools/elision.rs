//! Elision markers: the lines a model writes instead of code it did not repeat
//! (`// ...`, `# ... rest unchanged`, `/* ... */`, `<!-- ... -->`, `...rest of the file`).
//! Writing one would silently delete what it stands for, so `fs_write` content and `fs_edit`
//! replacement text are refused when they carry a marker line the file did not already have.
//!
//! A line is a marker when, trimmed:
//! - it is a comment (opened by `//`, `#`, `/*`, `{/*`, `<!--`, `--`, `;`, `%` or `*`) whose text,
//!   with any closing `*/`, `*/}` or `-->` removed, starts with `...` or `…`, or contains one of
//!   [`PHRASES`]; or
//! - it contains `...rest of` / `... rest of` (or with `…`), comment or not.
//!
//! A bare `...` line is not a marker (Python's Ellipsis, prose).

const COMMENT_OPENERS: &[&str] = &["{/*", "//", "/*", "<!--", "--", "#", ";", "%", "*"];
const COMMENT_CLOSERS: &[&str] = &["*/}", "*/", "-->"];

/// Phrases that, inside a comment, stand for omitted code.
pub const PHRASES: &[&str] = &[
    "rest of the code",
    "rest of the file",
    "rest of file",
    "rest of code",
    "rest unchanged",
    "remains unchanged",
    "remain unchanged",
    "unchanged code",
    "existing code",
    "code omitted",
    "omitted for brevity",
    "same as before",
    "previous code",
];

const ANYWHERE: &[&str] = &["...rest of", "... rest of", "…rest of", "… rest of"];

/// Whether one line is an elision marker.
pub fn is_marker(line: &str) -> bool {
    let trimmed = line.trim();
    let lower = trimmed.to_lowercase();
    if ANYWHERE.iter().any(|p| lower.contains(p)) {
        return true;
    }
    let Some(opener) = COMMENT_OPENERS.iter().find(|o| lower.starts_with(**o)) else {
        return false;
    };
    let mut body = lower[opener.len()..].trim();
    for closer in COMMENT_CLOSERS {
        if let Some(stripped) = body.strip_suffix(closer) {
            body = stripped.trim();
            break;
        }
    }
    body.starts_with("...") || body.starts_with('…') || PHRASES.iter().any(|p| body.contains(p))
}

/// Refuses `new` if it has a marker line that `old` (the file's current text) lacks.
pub fn check(shown: &str, old: Option<&str>, new: &str) -> Result<(), String> {
    let old_lines: std::collections::HashSet<&str> =
        old.unwrap_or("").lines().map(str::trim).collect();
    for (number, line) in new.lines().enumerate() {
        if is_marker(line) && !old_lines.contains(line.trim()) {
            return Err(format!(
                "refused: {shown}: line {} of the new text, {:?}, looks like an elision marker that is not in the file; write the full text instead of eliding it",
                number + 1,
                line.trim()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_recognised() {
        for line in [
            "// ...",
            "    # ... rest unchanged",
            "/* ... */",
            "<!-- ... -->",
            "-- …",
            "{/* ... */}",
            "// rest of the code stays the same",
            "# existing code here",
            "...rest of the function",
            "fn x() { ... rest of body }",
        ] {
            assert!(is_marker(line), "{line}");
        }
        for line in [
            "...",
            "x = y  # compute",
            "// see the docs",
            "print('...')",
            "/* real comment */",
            "a...b",
        ] {
            assert!(!is_marker(line), "{line}");
        }
    }

    #[test]
    fn only_new_markers_are_refused() {
        let old = "fn a() {}\n// ...\n";
        assert!(check("f", Some(old), "fn b() {}\n  // ...\n").is_ok());
        let err = check("f", Some(old), "fn b() {}\n# ... rest unchanged\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        assert!(check("f", None, "// ...").is_err());
    }
}
