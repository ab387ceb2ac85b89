//! `warren run --profile NAME`: a coding agent's namespace in one command. A profile is a spec
//! template (`specs/profiles/NAME.ns`, built in; `$WARREN_CONFIG_DIR/profiles/NAME.ns`
//! replaces it) with two lines of its own, `agent PROGRAM [ARG…]` and `set NAME=VALUE`, and
//! two names filled in before parsing, `${HOME}` and `${PROJECT}` (docs/agents.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::spec::{self, Spec};

/// The profiles shipped with warren.
const BUILT_IN: &[(&str, &str)] = &[
    ("claude", include_str!("../../specs/profiles/claude.ns")),
    ("codex", include_str!("../../specs/profiles/codex.ns")),
];

/// A profile's text and where it came from.
#[derive(Clone, Debug)]
pub struct Source {
    pub name: String,
    /// `built in` or the file's path.
    pub origin: String,
    pub text: String,
}

/// The operator's profile directory: `$WARREN_CONFIG_DIR/profiles` (default
/// `/etc/warren/profiles`).
pub fn user_dir() -> PathBuf {
    std::env::var_os("WARREN_CONFIG_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/etc/warren"), PathBuf::from)
        .join("profiles")
}

/// The profile NAME: the operator's file if there is one, else the built-in one.
pub fn load(name: &str) -> Result<Source, String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && !name.starts_with('.');
    if !valid {
        return Err(format!(
            "profile {name:?}: a profile name is [a-z0-9._-], at most 64 bytes, not starting with `.`"
        ));
    }
    let file = user_dir().join(format!("{name}.ns"));
    match std::fs::read(&file) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes)
                .map_err(|_| format!("profile {name}: {}: not UTF-8", file.display()))?;
            return Ok(Source {
                name: name.into(),
                origin: file.display().to_string(),
                text,
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("profile {name}: {}: {e}", file.display())),
    }
    BUILT_IN
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(n, text)| Source {
            name: (*n).into(),
            origin: "built in".into(),
            text: (*text).into(),
        })
        .ok_or_else(|| {
            let known: Vec<&str> = BUILT_IN.iter().map(|(n, _)| *n).collect();
            format!(
                "no profile {name}: built in are {}; an operator's is {}",
                known.join(", "),
                file.display()
            )
        })
}

/// What the template's names stand for.
#[derive(Clone, Debug)]
pub struct Vars {
    /// The operator's HOME (`None`: unset, and a profile naming it is refused).
    pub home: Option<String>,
    pub project: String,
}

/// A profile read: its spec (before `warren run`'s flags), its agent and its fixed values.
#[derive(Clone, Debug)]
pub struct Profile {
    pub spec: Spec,
    /// `agent PROGRAM [ARG…]`.
    pub agent: Vec<String>,
    /// `set NAME=VALUE` lines; each NAME is also among the spec's `env` names.
    pub set: BTreeMap<String, String>,
}

/// Reads a profile: `agent` and `set` lines taken out (as blank lines, so the spec parser's
/// line numbers stay the file's), `${HOME}` and `${PROJECT}` filled in, the rest parsed as a
/// spec.
pub fn read(source: &Source, vars: &Vars) -> Result<Profile, String> {
    let at = |n: usize, why: String| {
        format!(
            "profile {} ({}), line {n}: {why}",
            source.name, source.origin
        )
    };
    let mut agent: Option<Vec<String>> = None;
    let mut set = BTreeMap::new();
    let mut text = String::new();
    for (i, line) in source.text.split('\n').enumerate() {
        let n = i + 1;
        let trimmed = line.trim_start();
        let first = trimmed.split_whitespace().next().unwrap_or("");
        if first.starts_with('#') || first.is_empty() {
            text.push('\n');
            continue;
        }
        let line = expand(line, vars).map_err(|e| at(n, e))?;
        match first {
            "agent" => {
                if agent.is_some() {
                    return Err(at(n, "a second `agent` line".into()));
                }
                let words: Vec<String> =
                    line.split_whitespace().skip(1).map(String::from).collect();
                match words.first() {
                    None => return Err(at(n, "`agent` names no program".into())),
                    Some(p) if p.contains('/') => {
                        return Err(at(
                            n,
                            format!("agent {p}: a program name, found on PATH (no `/`)"),
                        ));
                    }
                    Some(_) => {}
                }
                agent = Some(words);
                text.push('\n');
            }
            "set" => {
                let rest = line.trim_start()["set".len()..].trim();
                let (name, value) = rest
                    .split_once('=')
                    .ok_or_else(|| at(n, "expected `set NAME=VALUE`".into()))?;
                if set.insert(name.to_string(), value.to_string()).is_some() {
                    return Err(at(n, format!("{name} is set twice")));
                }
                text.push('\n');
            }
            _ => {
                text.push_str(&line);
                text.push('\n');
            }
        }
    }
    text.pop();
    let mut spec = spec::parse(
        &format!("profile {} ({})", source.name, source.origin),
        &text,
    )
    .map_err(|e| e.to_string())?;
    let agent = agent.ok_or_else(|| {
        format!(
            "profile {} ({}): no `agent PROGRAM` line",
            source.name, source.origin
        )
    })?;
    for name in set.keys() {
        if !spec.env.contains(name) {
            spec.env.push(name.clone());
        }
    }
    Ok(Profile { spec, agent, set })
}

/// `${HOME}` and `${PROJECT}` filled in; any other `${…}` refused. A value that the spec
/// language would read as more than one word, or as a quote or comment, is refused rather than
/// quoted: it would change what the line means.
fn expand(line: &str, vars: &Vars) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| "`${` without its `}`".to_string())?;
        let name = &after[..end];
        let value = match name {
            "HOME" => vars.home.as_deref().ok_or_else(|| {
                "${HOME}: HOME is not set in warren run's environment".to_string()
            })?,
            "PROJECT" => vars.project.as_str(),
            _ => {
                return Err(format!(
                    "unknown name ${{{name}}}: a profile knows ${{HOME}} and ${{PROJECT}}"
                ));
            }
        };
        if !value.starts_with('/')
            || value
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || "'#$".contains(c))
        {
            return Err(format!(
                "${{{name}}} is {value:?}: not an absolute path this profile can name (a blank, \
                 quote, `#` or `$` in it); write a spec of your own (--ns)"
            ));
        }
        out.push_str(value.trim_end_matches('/'));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Where an agent is installed: its program found on the operator's PATH.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Install {
    /// The program, by the path it is run as (its bin directory resolved, the name kept).
    pub program: PathBuf,
    /// The directory holding its bin directory (`<prefix>/bin/NAME`, or an npm project's
    /// `node_modules/.bin/NAME`): bound read-only, it holds the package and, for an nvm-style
    /// install, node.
    pub prefix: PathBuf,
}

/// Finds `program` on `path` (the operator's PATH), as a shell would: the first directory
/// holding an executable file of that name. Its target (through symlinks) must lie beneath the
/// prefix, so binding the prefix is enough to run it.
pub fn find_install(program: &str, path: &str) -> Result<Install, String> {
    use std::os::unix::fs::PermissionsExt;
    let found = path
        .split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| Path::new(d).join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| {
            format!("agent {program}: not found on PATH ({path}): install it, or put it on PATH")
        })?;
    let bin = found
        .parent()
        .and_then(|b| b.canonicalize().ok())
        .ok_or_else(|| format!("agent {program}: {}: no directory", found.display()))?;
    let prefix = bin
        .parent()
        .filter(|p| *p != Path::new("/"))
        .ok_or_else(|| format!("agent {program}: {} has no prefix above /", bin.display()))?
        .to_path_buf();
    let program_path = bin.join(program);
    let target = program_path
        .canonicalize()
        .map_err(|e| format!("agent {program}: {}: {e}", program_path.display()))?;
    if !target.starts_with(&prefix) {
        return Err(format!(
            "agent {program}: {} is {}, outside its prefix {}: bind its installation with a \
             profile of your own ($WARREN_CONFIG_DIR/profiles)",
            program_path.display(),
            target.display(),
            prefix.display()
        ));
    }
    Ok(Install {
        program: program_path,
        prefix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars {
        Vars {
            home: Some("/home/op".into()),
            project: "/src/proj".into(),
        }
    }

    #[test]
    fn every_built_in_profile_reads_with_an_agent_and_the_project_writable() {
        for (name, _) in BUILT_IN {
            let p = read(&load(name).unwrap(), &vars()).unwrap();
            assert_eq!(p.agent[0], *name);
            assert!(
                p.spec.binds.iter().any(|b| b.host == "/src/proj"
                    && b.path == "/src/proj"
                    && b.access == spec::Access::Write),
                "{name}: {}",
                p.spec.to_text()
            );
            assert_eq!(p.spec.net(), spec::Net::Proxy, "{name}");
            for k in p.set.keys() {
                assert!(p.spec.env.contains(k), "{name}: {k}");
            }
        }
    }

    #[test]
    fn unknown_names_and_unsafe_values_are_refused() {
        let src = |text: &str| Source {
            name: "t".into(),
            origin: "test".into(),
            text: text.into(),
        };
        let e = read(&src("agent a\nbind -r ${USER} /x\n"), &vars()).unwrap_err();
        assert!(
            e.contains("unknown name ${USER}") && e.contains("line 2"),
            "{e}"
        );
        let spaced = Vars {
            home: Some("/home/a b".into()),
            project: "/p".into(),
        };
        let e = read(&src("agent a\nbind -r ${HOME} /x\n"), &spaced).unwrap_err();
        assert!(e.contains("not an absolute path"), "{e}");
        let e = read(&src("bind -r /p /p\n"), &vars()).unwrap_err();
        assert!(e.contains("no `agent PROGRAM` line"), "{e}");
        let unset = Vars {
            home: None,
            project: "/p".into(),
        };
        let e = read(&src("agent a\nbind -r ${HOME} /x\n"), &unset).unwrap_err();
        assert!(e.contains("HOME is not set"), "{e}");
        let e = load("../x").unwrap_err();
        assert!(e.contains("a profile name is"), "{e}");
    }
}
