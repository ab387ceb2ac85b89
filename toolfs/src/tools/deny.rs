//! The deny-list: file names no file tool reads or writes, whatever its roots allow. A tripwire
//! over names (secrets have conventional names), applied on top of the roots, not instead of them.

/// Whether a lower-cased file name matches a rule.
type Matcher = fn(&str) -> bool;

/// `(rule as documented, matcher)`; names are compared ASCII-case-insensitively.
const RULES: &[(&str, Matcher)] = &[
    ("*.key", |n| n.ends_with(".key")),
    ("*.pem", |n| n.ends_with(".pem")),
    (".env*", |n| n.starts_with(".env")),
    ("id_*", |n| n.starts_with("id_")),
    ("*.db*", |n| n.contains(".db")),
    ("*.sqlite*", |n| n.contains(".sqlite")),
];

/// The rule a single file name matches, if any.
pub fn rule_for(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    RULES
        .iter()
        .find(|(_, matches)| matches(&lower))
        .map(|(rule, _)| *rule)
}

/// Refuses a path any of whose components (below the root) matches a rule, naming the rule.
pub fn check(shown: &str, components: &[std::ffi::OsString]) -> Result<(), String> {
    for name in components {
        if let Some(rule) = rule_for(&name.to_string_lossy()) {
            let name = warren_daemon::escape::escape_bytes(name.as_encoded_bytes());
            return Err(format!(
                "refused: {shown}: the name \"{name}\" matches the deny-list rule `{rule}` (file tools never read or write likely secrets)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::rule_for;

    #[test]
    fn each_rule_matches_and_ordinary_names_pass() {
        for (name, rule) in [
            ("server.key", "*.key"),
            ("cert.PEM", "*.pem"),
            (".env", ".env*"),
            (".env.local", ".env*"),
            ("id_ed25519", "id_*"),
            ("app.db", "*.db*"),
            ("app.db-wal", "*.db*"),
            ("x.sqlite3", "*.sqlite*"),
        ] {
            assert_eq!(rule_for(name), Some(rule), "{name}");
        }
        for name in ["main.rs", "keys.md", "environment", "idea", "dbx", "README"] {
            assert_eq!(rule_for(name), None, "{name}");
        }
    }
}
