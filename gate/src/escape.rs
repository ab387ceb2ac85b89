//! Showing untrusted text to a person: every non-printing, invisible, bidi-control or
//! look-alike-space code point is written as `\u{XXXX}`, and `\` as `\\`, so what the operator
//! reads is what would run. (A right-to-left override can make `rm -rf ~/x` read as something
//! else; a zero-width space can make two different arguments look identical.)

use std::fmt::Write;

/// Whether `c` must be escaped before a person sees it.
pub fn must_escape(c: char) -> bool {
    if c == '\\' || c.is_control() {
        return true;
    }
    matches!(c as u32,
        0x00A0 | 0x00AD | 0x034F | 0x061C | 0x115F | 0x1160 | 0x17B4 | 0x17B5 | 0x180E | 0x3164 | 0xFEFF | 0xFFA0
        | 0x0600..=0x0605 | 0x06DD | 0x070F | 0x08E2
        | 0x180B..=0x180F
        | 0x2000..=0x200F   // spaces of other widths, zero-width space/joiners, LRM, RLM
        | 0x2028..=0x202F   // line/paragraph separators, bidi embeddings and overrides, NNBSP
        | 0x205F..=0x206F   // math space, word joiner, invisible operators, bidi isolates
        | 0x3000
        | 0xFE00..=0xFE0F   // variation selectors
        | 0xFFF0..=0xFFFB   // interlinear annotation, specials
        | 0x1D173..=0x1D17A
        | 0xE0000..=0xE0FFF // tags and variation selectors supplement
        | 0xE000..=0xF8FF | 0xF0000..=0x10FFFF // private use
    )
}

/// `text` with every code point [`must_escape`] names written as `\u{XXXX}`.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if must_escape(c) {
            let _ = write!(out, "\\u{{{:04X}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn every_escaped_output_is_printable_ascii_or_unescaped() {
        let all: String = (0..0x3100u32).filter_map(char::from_u32).collect();
        assert!(escape(&all).chars().all(|c| !must_escape(c) || c == '\\'));
    }
}
