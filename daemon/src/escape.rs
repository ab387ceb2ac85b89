//! The one escaping rule for untrusted text put in front of a person (or another namespace):
//! everything a namespace or a tool result wrote — command words, mount paths, file names,
//! arguments, error messages — shown by `warren ps`, `ns`, `log`, `approvals`, the gate's
//! `request` files, `warren run`'s prompt and `fs_list`.
//!
//! A code point is written as `\u{XXXX}` when [`must_escape`] names it: controls (Cc, so no
//! escape sequence reaches a terminal and no newline or tab forges a line or a column), format
//! and bidi controls (Cf: a right-to-left override makes `rm -rf ~/x` read as something else),
//! separators other than the plain space (Zs but U+0020, Zl, Zp: look-alike and invisible
//! spaces), private use (Co), unassigned code points (Cn: what a newer Unicode may make
//! invisible) and a few invisible letters and marks (Hangul fillers, variation selectors). A
//! `\` is written `\\`, so a literal `\u{202E}` in the text cannot pass for an escape, and
//! [`escape_bytes`] writes each byte that is not UTF-8 as `\x{HH}`. The form is reversible:
//! [`unescape`] gives back the exact bytes, which is how `fs_list`'s names are addressed again.
//!
//! Self-contained (no server crate, one crate for the Unicode tables), so every crate that shows
//! text can use it.

use std::fmt::Write;

use unicode_general_category::{GeneralCategory, get_general_category};

/// Whether `c` must be escaped before a person sees it (see the module doc).
pub fn must_escape(c: char) -> bool {
    c == '\\' || misleads(c)
}

/// Whether `c` can make text read as something it is not: every code point [`must_escape`]
/// names but `\` (which only matters inside an escaped text). Names, paths and words that a
/// namespace writes and that need not hold such a code point are refused with it.
pub fn misleads(c: char) -> bool {
    match get_general_category(c) {
        GeneralCategory::Control
        | GeneralCategory::Format
        | GeneralCategory::LineSeparator
        | GeneralCategory::ParagraphSeparator
        | GeneralCategory::PrivateUse
        | GeneralCategory::Surrogate
        | GeneralCategory::Unassigned => true,
        GeneralCategory::SpaceSeparator => c != ' ',
        _ => invisible(c),
    }
}

/// Letters, marks and symbols that draw nothing (not in Cf, so named one by one).
fn invisible(c: char) -> bool {
    matches!(c as u32,
        0x034F                // combining grapheme joiner
        | 0x115F | 0x1160 | 0x3164 | 0xFFA0 // Hangul fillers
        | 0x17B4 | 0x17B5     // Khmer inherent vowels
        | 0x180B..=0x180F     // Mongolian variation selectors
        | 0x2800              // braille blank
        | 0xFE00..=0xFE0F     // variation selectors
        | 0xE0100..=0xE01EF   // variation selectors supplement
    )
}

/// `text` with every code point [`must_escape`] names written as `\u{XXXX}` (and `\` as `\\`).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    push_escaped(&mut out, text);
    out
}

/// [`escape`] for bytes that may not be UTF-8 (a file name): each byte of an invalid sequence
/// is written `\x{HH}`.
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        push_escaped(&mut out, chunk.valid());
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{{{b:02X}}}");
        }
    }
    out
}

fn push_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if must_escape(c) {
            let _ = write!(out, "\\u{{{:04X}}}", c as u32);
        } else {
            out.push(c);
        }
    }
}

/// Text a trusted producer already escaped with this rule, made of lines (a gate `request`
/// file, a spec): shown with its line breaks, and anything the producer left that must still
/// be escaped escaped after all (a `\` is left alone: it starts the producer's escapes). For a
/// person only; not reversible.
pub fn escaped_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\n' || c == '\\' || !must_escape(c) {
            out.push(c);
        } else {
            let _ = write!(out, "\\u{{{:04X}}}", c as u32);
        }
    }
    out
}

/// Why an escaped text does not read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadEscape {
    /// Byte offset of the `\` that starts the bad escape.
    pub at: usize,
    pub why: &'static str,
}

impl std::fmt::Display for BadEscape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bad escape at byte {}: {} (a `\\` starts `\\\\`, `\\u{{XXXX}}` or `\\x{{HH}}`)",
            self.at, self.why
        )
    }
}

impl std::error::Error for BadEscape {}

/// The bytes an escaped text stands for: `\\` is `\`, `\u{X…}` a code point (UTF-8), `\x{HH}`
/// one byte; every other character stands for itself. The inverse of [`escape`] and
/// [`escape_bytes`].
pub fn unescape(text: &str) -> Result<Vec<u8>, BadEscape> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('\\') {
        out.extend_from_slice(&rest.as_bytes()[..i]);
        let at = text.len() - rest.len() + i;
        let bad = |why| BadEscape { at, why };
        let after = &rest[i + 1..];
        let (kind, tail) = match after.chars().next() {
            Some('\\') => {
                out.push(b'\\');
                rest = &after[1..];
                continue;
            }
            Some(k @ ('u' | 'x')) => (k, &after[1..]),
            _ => return Err(bad("unknown escape")),
        };
        let body = tail
            .strip_prefix('{')
            .and_then(|t| t.split_once('}'))
            .ok_or(bad("expected `{…}`"))?;
        let (digits, tail) = body;
        let max = if kind == 'u' { 6 } else { 2 };
        if digits.is_empty() || digits.len() > max || !digits.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(bad("expected hex digits"));
        }
        let n = u32::from_str_radix(digits, 16).map_err(|_| bad("expected hex digits"))?;
        if kind == 'u' {
            let c = char::from_u32(n).ok_or(bad("not a Unicode scalar value"))?;
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        } else {
            out.push(n as u8);
        }
        rest = tail;
    }
    out.extend_from_slice(rest.as_bytes());
    Ok(out)
}

/// [`unescape`], for text that must come back as UTF-8.
pub fn unescape_str(text: &str) -> Result<String, BadEscape> {
    String::from_utf8(unescape(text)?).map_err(|e| BadEscape {
        at: e.utf8_error().valid_up_to(),
        why: "`\\x{…}` bytes that are not UTF-8",
    })
}

/// A JSON value as one line with every code point [`must_escape`] names (but `\`, which JSON
/// escapes its own way) written as a JSON `\uXXXX` escape: the same value for a program, nothing
/// hidden or moving for a person reading it on a terminal.
pub fn json_line(value: &serde_json::Value) -> String {
    let text = serde_json::to_string(value).unwrap_or_default();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        // Outside strings JSON has only ASCII punctuation, digits and letters, so every such
        // code point is inside a string, where a `\u` escape means the same.
        if c != '\\' && must_escape(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{u:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hostile strings every view is tested with.
    const HOSTILE: &[&str] = &[
        "\x1b[2K\x1b[1A\rforged row",
        "ok.txt\nid_rsa\tfile\t1675",
        "/tmp/\u{202E}txt.exe",
        "a\u{200B}b\u{2066}c\u{FEFF}d\u{00A0}e\u{2028}f\u{E000}g\u{3164}h",
    ];

    #[test]
    fn bidi_and_invisible_code_points_are_escaped() {
        assert_eq!(escape("a\u{202E}b"), "a\\u{202E}b");
        assert_eq!(
            escape("x\u{200B}y\u{2066}z\u{FEFF}"),
            "x\\u{200B}y\\u{2066}z\\u{FEFF}"
        );
        assert_eq!(escape("tab\there\n"), "tab\\u{0009}here\\u{000A}");
        assert_eq!(escape("\u{7F}\u{85}"), "\\u{007F}\\u{0085}");
        assert_eq!(escape("\u{E0041}"), "\\u{E0041}");
        assert_eq!(
            escape("\u{2029}\u{3000}\u{F8FF}"),
            "\\u{2029}\\u{3000}\\u{F8FF}"
        );
        assert_eq!(
            escape(r"a\u{202E}"),
            r"a\\u{202E}",
            "a literal escape cannot pass for one"
        );
    }

    #[test]
    fn ordinary_text_is_unchanged() {
        for s in [
            "rm -rf ./build",
            "naïve café",
            "日本語",
            "{\"path\":\"notes.md\"}",
            "emoji 😀",
        ] {
            assert_eq!(escape(s), s);
        }
    }

    #[test]
    fn every_escaped_output_is_printable() {
        let all: String = (0..0x3_0000u32).filter_map(char::from_u32).collect();
        assert!(escape(&all).chars().all(|c| !must_escape(c) || c == '\\'));
        for h in HOSTILE {
            let e = escape(h);
            assert!(
                !e.contains(['\n', '\t', '\x1b', '\u{202E}', '\u{00A0}']),
                "{e}"
            );
        }
    }

    #[test]
    fn escaped_bytes_read_back_exactly() {
        let mut names: Vec<Vec<u8>> = HOSTILE.iter().map(|s| s.as_bytes().to_vec()).collect();
        names.push(b"bad\xff\xfe name".to_vec());
        names.push(b"back\\slash \\u{41}".to_vec());
        names.push(b"\xe2\x80".to_vec()); // a cut UTF-8 sequence
        for n in names {
            let e = escape_bytes(&n);
            assert!(!e.chars().any(|c| c != '\\' && must_escape(c)), "{e}");
            assert_eq!(unescape(&e).unwrap(), n, "{e}");
        }
        assert_eq!(escape_bytes(b"a\xffb"), "a\\x{FF}b");
        assert_eq!(unescape("plain/path.txt").unwrap(), b"plain/path.txt");
        assert_eq!(unescape("raw\ttab").unwrap(), b"raw\ttab");
    }

    #[test]
    fn malformed_escapes_are_refused() {
        for bad in [
            r"a\b",
            r"a\",
            r"\u{}",
            r"\u{110000}",
            r"\u{D800}",
            r"\x{100}",
            r"\u{41",
        ] {
            assert!(unescape(bad).is_err(), "{bad}");
        }
        assert!(unescape_str(r"\x{FF}").is_err());
        assert_eq!(unescape_str(r"\x{41}\u{42}").unwrap(), "AB");
    }

    #[test]
    fn escaped_lines_keep_lines_and_escapes() {
        assert_eq!(
            escaped_lines("args {\"c\":\"\\u{001B}\"}\nnext\x1b[1A\u{202E}\n"),
            "args {\"c\":\"\\u{001B}\"}\nnext\\u{001B}[1A\\u{202E}\n"
        );
    }

    #[test]
    fn json_lines_hide_nothing_and_mean_the_same() {
        let v = serde_json::json!({"argv": HOSTILE});
        let line = json_line(&v);
        assert!(!line.chars().any(|c| c != '\\' && must_escape(c)), "{line}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&line).unwrap(), v);
    }
}
