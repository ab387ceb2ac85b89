//! The namespace spec language (normative text: `specs/namespace.md`).
//!
//! One directive a line; `#` starts a comment at the start of a word; words are separated by
//! blanks; a word may be single-quoted (`'a b'`, with `''` for a literal quote), rc-style, or
//! written `$'…'` in the escaping rule's form (`\\`, `\u{XXXX}`: `warren_daemon::escape`).
//! Errors name the file, line and column and show the offending line.
//!
//! Why one file: one grammar — its types, word splitting, quoting and parser share the line context
//! every error is reported with; a quarter of the length is its tests.

use std::fmt;

use warren_daemon::escape::{escape, misleads, unescape_str};

/// Read-only or read-write access, as `-r` / `-w` say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Read,
    Write,
}

impl Access {
    fn flag(self) -> &'static str {
        match self {
            Access::Read => "-r",
            Access::Write => "-w",
        }
    }
}

/// `bind [-r|-w] [-R] HOSTPATH PATH`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    pub access: Access,
    pub recursive: bool,
    pub host: String,
    pub path: String,
}

/// The server half of a `mount` directive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Server {
    /// A local warren server by name: `tool`, `gate`, `receipts`, `ns`, `llm`.
    Local(LocalServer),
    /// `unix!/path`
    Unix(String),
    /// `tcp!host!port`
    Tcp { host: String, port: u16 },
    /// `mcp:NAME`: the operator's MCP server NAME, served by mcpfs (`docs/mcp.md`).
    Mcp(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalServer {
    Tool,
    Gate,
    Receipts,
    Ns,
    /// The model served as files (llmfs, `docs/llm.md`): sessions tied to the namespace's own
    /// connection, receipted in its session.
    Llm,
}

impl LocalServer {
    pub fn name(self) -> &'static str {
        match self {
            LocalServer::Tool => "tool",
            LocalServer::Gate => "gate",
            LocalServer::Receipts => "receipts",
            LocalServer::Ns => "ns",
            LocalServer::Llm => "llm",
        }
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Server::Local(l) => f.write_str(l.name()),
            Server::Unix(p) => write!(f, "unix!{p}"),
            Server::Tcp { host, port } => write!(f, "tcp!{host}!{port}"),
            Server::Mcp(name) => write!(f, "mcp:{name}"),
        }
    }
}

/// `mount [-k PEER] SERVER PATH [SPEC…]`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub key: Option<String>,
    /// `--insecure-plain`: plain 9P (no authentication, no encryption) to a `tcp!` server that
    /// is not on this host. Without it nsd refuses such a mount.
    pub insecure_plain: bool,
    pub server: Server,
    pub path: String,
    /// For `tool`: the granted tool names. Otherwise passed to the server as its attach spec.
    pub spec: Vec<String>,
}

/// `tool NAME -r|-w HOSTPATH…`: a tool's own authority (its worker's binds), not the agent's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolAuthority {
    pub name: String,
    pub access: Access,
    pub host_paths: Vec<String>,
}

/// `tool NAME net proxy [PATTERN…]`: a tool's worker gets the network through the egress proxy,
/// for `proxy`, never wider than the namespace's list. Both are settled when the spec is parsed:
/// a line that lists none gets the namespace's own `net proxy` patterns there, once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolNet {
    pub name: String,
    pub proxy: Vec<warren_proto::net::Pattern>,
}

/// The tools whose worker may be given the network: those that exec programs.
pub const NETWORK_TOOLS: &[&str] = &["shell"];

/// `net none|loopback|proxy`, ordered from narrowest to widest. Under `Proxy` the
/// destinations are the spec's [`Spec::proxy`] patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Net {
    #[default]
    None,
    Loopback,
    /// `lo` up and the egress proxy's listener at `127.0.0.1:`[`PROXY_PORT`].
    Proxy,
}

/// The port of the egress proxy's listener inside a `net proxy` namespace.
pub const PROXY_PORT: u16 = 3128;

/// `limit mem= pids= cpu= wall= clones=`; `None` is "no limit" (for `clones`:
/// [`DEFAULT_CLONES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Limits {
    /// bytes
    pub mem: Option<u64>,
    pub pids: Option<u64>,
    /// total CPU seconds
    pub cpu: Option<u64>,
    /// wall-clock seconds
    pub wall: Option<u64>,
    /// live namespaces in this one's subtree (itself not counted), cloned through its `/ns`
    pub clones: Option<u64>,
    /// Budgets of the namespace's subtree (its clones' use counts against it): receipts per
    /// second, receipt bytes in total, open asks at once, bytes llmfs holds for its sessions.
    pub receipts: Option<u64>,
    pub receipt_bytes: Option<u64>,
    pub asks: Option<u64>,
    pub llm_bytes: Option<u64>,
}

/// Live clones a namespace's subtree may hold when its spec sets no `clones`: far more than an
/// agent fanning out work needs, few enough that a clone loop stops at once.
pub const DEFAULT_CLONES: u64 = 16;

impl Limits {
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// The live clones its subtree may hold.
    pub fn clones(&self) -> u64 {
        self.clones.unwrap_or(DEFAULT_CLONES)
    }
}

/// A parsed namespace spec. Holds env NAMES only: values come from the launcher at run time,
/// so no printing of a spec can ever show one.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Spec {
    pub binds: Vec<Bind>,
    pub mounts: Vec<Mount>,
    pub tools: Vec<ToolAuthority>,
    /// `None` when the spec does not say; treated as `net none`.
    pub net: Option<Net>,
    /// `net proxy PATTERN…`: the destinations, as `warren_proto::net::Pattern` parses them; empty
    /// unless `net` is `Some(Net::Proxy)`.
    pub proxy: Vec<warren_proto::net::Pattern>,
    /// `tool NAME net proxy …` lines: the tools whose workers get the network.
    pub tool_nets: Vec<ToolNet>,
    pub env: Vec<String>,
    pub limits: Limits,
}

/// Trees the confinement itself builds; no bind or mount may land in them.
pub const RESERVED_TREES: &[&str] = &["/proc", "/dev", "/etc"];
/// Mount points the confinement owns, though binds may land beneath them (after them).
pub const RESERVED_POINTS: &[&str] = &["/tmp", crate::HOME];

/// A parse or validation error with its position (1-based line and column, in characters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub width: usize,
    pub message: String,
    pub source_line: String,
}

impl fmt::Display for SpecError {
    /// The message and the line as a person may safely read them (every control, bidi and
    /// invisible code point escaped: `warren_daemon::escape`), the caret under the escaped word.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gutter = self.line.to_string().len();
        let pad = " ".repeat(gutter);
        let chars: Vec<char> = self.source_line.chars().collect();
        let start = self.column.saturating_sub(1).min(chars.len());
        let end = start.saturating_add(self.width).min(chars.len());
        let shown = |cs: &[char]| escape(&cs.iter().collect::<String>());
        let (before, under) = (shown(&chars[..start]), shown(&chars[start..end]));
        writeln!(f, "error: {}", escape(&self.message))?;
        writeln!(
            f,
            "{pad}--> {}:{}:{}",
            escape(&self.file),
            self.line,
            self.column
        )?;
        writeln!(f, "{pad} |")?;
        writeln!(f, "{} | {}", self.line, escape(&self.source_line))?;
        // Past the line's end (a missing word) the caret stands where the word would.
        let at = before.chars().count() + self.column.saturating_sub(1).saturating_sub(start);
        let width = if start < end {
            under.chars().count()
        } else {
            self.width.max(1)
        };
        write!(f, "{pad} | {}{}", " ".repeat(at), "^".repeat(width))
    }
}

impl std::error::Error for SpecError {}

#[derive(Debug, Clone)]
struct Word {
    text: String,
    column: usize,
    width: usize,
}

struct LineCtx<'a> {
    file: &'a str,
    number: usize,
    source: &'a str,
}

impl LineCtx<'_> {
    fn err_at(&self, column: usize, width: usize, message: impl Into<String>) -> SpecError {
        SpecError {
            file: self.file.to_string(),
            line: self.number,
            column,
            width,
            message: message.into(),
            source_line: self.source.to_string(),
        }
    }
    fn err(&self, w: &Word, message: impl Into<String>) -> SpecError {
        self.err_at(w.column, w.width, message)
    }
    fn end(&self) -> usize {
        self.source.chars().count() + 1
    }
}

fn split_words(ctx: &LineCtx<'_>) -> Result<Vec<Word>, SpecError> {
    let chars: Vec<char> = ctx.source.chars().collect();
    let mut words = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == ' ' || c == '\t' || c == '\r' {
            i += 1;
            continue;
        }
        if c == '#' {
            break;
        }
        let start = i;
        let mut text = String::new();
        // `$'…'`: a quoted word in the escaping rule's form (what `quote` writes for a word
        // holding a control, bidi or invisible code point).
        let escaped = c == '$' && chars.get(i + 1) == Some(&'\'');
        if escaped {
            i += 1;
        }
        if c == '\'' || escaped {
            i += 1;
            loop {
                match chars.get(i) {
                    None => {
                        return Err(ctx.err_at(start + 1, i - start, "unterminated quoted word"));
                    }
                    Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                        text.push('\'');
                        i += 2;
                    }
                    Some('\'') => {
                        i += 1;
                        break;
                    }
                    Some(&ch) => {
                        text.push(ch);
                        i += 1;
                    }
                }
            }
            if let Some(&next) = chars.get(i)
                && !matches!(next, ' ' | '\t' | '\r')
            {
                return Err(ctx.err_at(i + 1, 1, "a quoted word must be followed by a blank"));
            }
            if escaped {
                text = unescape_str(&text)
                    .map_err(|e| ctx.err_at(start + 1, i - start, format!("in $'…': {e}")))?;
            }
        } else {
            while i < chars.len() && !matches!(chars[i], ' ' | '\t' | '\r') {
                if chars[i] == '\'' {
                    return Err(ctx.err_at(
                        i + 1,
                        1,
                        "quote inside a word: quote the whole word ('a''b' is a'b)",
                    ));
                }
                text.push(chars[i]);
                i += 1;
            }
        }
        if text.contains('\0') {
            return Err(ctx.err_at(start + 1, i - start, "NUL byte in a word"));
        }
        words.push(Word {
            text,
            column: start + 1,
            width: i - start,
        });
    }
    Ok(words)
}

/// Splits one line into words with the spec language's quoting (for ctl commands).
pub fn split_command(line: &str) -> Result<Vec<String>, SpecError> {
    let ctx = LineCtx {
        file: "<ctl>",
        number: 1,
        source: line,
    };
    Ok(split_words(&ctx)?.into_iter().map(|w| w.text).collect())
}

/// Quotes a word when it would not read back as itself. A word holding a code point the
/// escaping rule names (a control, bidi or invisible one: `warren_daemon::escape`) is written
/// `$'…'` with that rule's escapes, so the quoted word is one printable line that reads back
/// exactly; any other word that needs it is written `'…'`. Either doubles a `'`.
pub fn quote(word: &str) -> String {
    if word.chars().any(misleads) {
        return format!("$'{}'", escape(word).replace('\'', "''"));
    }
    let plain = !word.is_empty()
        && !word.starts_with('#')
        && !word.chars().any(|c| c == '\'' || c.is_whitespace());
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "''"))
    }
}

/// Refuses a word that holds a code point the escaping rule names: a path, key file or mount
/// word is shown to the operator and other namespaces, and a bidi or invisible code point would
/// make it read as another.
fn check_shown(ctx: &LineCtx<'_>, w: &Word, what: &str) -> Result<(), SpecError> {
    match w.text.chars().find(|&c| misleads(c)) {
        Some(c) => Err(ctx.err(
            w,
            format!(
                "{what} contains U+{:04X}, a control, format (bidi) or invisible code point",
                c as u32
            ),
        )),
        None => Ok(()),
    }
}

fn check_abs_path(ctx: &LineCtx<'_>, w: &Word, what: &str) -> Result<String, SpecError> {
    let p = &w.text;
    if !p.starts_with('/') {
        return Err(ctx.err(w, format!("{what} must be an absolute path, got `{p}`")));
    }
    check_shown(ctx, w, what)?;
    if p != "/" {
        if p.ends_with('/') {
            return Err(ctx.err(w, format!("{what} `{p}` has a trailing `/`")));
        }
        for comp in p[1..].split('/') {
            match comp {
                "" => return Err(ctx.err(w, format!("{what} `{p}` has an empty component (`//`)"))),
                "." | ".." => {
                    return Err(ctx.err(
                        w,
                        format!("{what} `{p}` has a `{comp}` component; write the path plainly"),
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(p.clone())
}

pub fn is_tool_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
        && s != "."
        && s != ".."
}

/// The name of an operator's MCP server: its config file's stem and a gate-name component.
fn is_mcp_server_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn is_env_name(s: &str) -> bool {
    let mut cs = s.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_server(ctx: &LineCtx<'_>, w: &Word) -> Result<Server, SpecError> {
    let t = w.text.as_str();
    match t {
        "tool" => return Ok(Server::Local(LocalServer::Tool)),
        "gate" => return Ok(Server::Local(LocalServer::Gate)),
        "receipts" => return Ok(Server::Local(LocalServer::Receipts)),
        "ns" => return Ok(Server::Local(LocalServer::Ns)),
        "llm" => return Ok(Server::Local(LocalServer::Llm)),
        _ => {}
    }
    if let Some(name) = t.strip_prefix("mcp:") {
        if !is_mcp_server_name(name) {
            return Err(ctx.err(
                w,
                format!(
                    "`{name}` is not an MCP server name (letters, digits, `-` and `_`, at most 64)"
                ),
            ));
        }
        return Ok(Server::Mcp(name.to_string()));
    }
    if let Some(path) = t.strip_prefix("unix!") {
        let pw = Word {
            text: path.to_string(),
            ..w.clone()
        };
        return Ok(Server::Unix(check_abs_path(ctx, &pw, "unix socket path")?));
    }
    if let Some(rest) = t.strip_prefix("tcp!") {
        let mut parts = rest.split('!');
        let (host, port) = (parts.next(), parts.next());
        if parts.next().is_some() {
            return Err(ctx.err(w, "tcp server is `tcp!host!port`: too many `!`"));
        }
        let (Some(host), Some(port)) = (host, port) else {
            return Err(ctx.err(w, "tcp server is `tcp!host!port`: missing port"));
        };
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'))
        {
            return Err(ctx.err(w, format!("bad host `{host}` in tcp server")));
        }
        let port: u16 = match port.parse() {
            Ok(p) if p > 0 && !port.starts_with('+') && !port.starts_with('0') => p,
            _ => return Err(ctx.err(w, format!("bad port `{port}` (1–65535)"))),
        };
        return Ok(Server::Tcp {
            host: host.to_ascii_lowercase(),
            port,
        });
    }
    Err(ctx.err(
        w,
        format!(
            "unknown server `{t}`: expected tool, gate, receipts, ns, llm, mcp:NAME, unix!/path or tcp!host!port"
        ),
    ))
}

fn parse_number(digits: &str) -> Option<u64> {
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `512M`, `1G`, `4096` (binary multiples).
fn parse_size(s: &str) -> Option<u64> {
    let (digits, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1u64 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        'T' | 't' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    parse_number(digits)?.checked_mul(mult)
}

/// `30`, `30s`, `5m`, `2h` → seconds.
fn parse_duration(s: &str) -> Option<u64> {
    let (digits, mult) = match s.chars().last()? {
        's' => (&s[..s.len() - 1], 1u64),
        'm' => (&s[..s.len() - 1], 60),
        'h' => (&s[..s.len() - 1], 3600),
        _ => (s, 1),
    };
    parse_number(digits)?.checked_mul(mult)
}

/// The largest spec accepted, in bytes: it travels to nsd inside one run request, whose record
/// is at most `warren_daemon::handoff::MAX_RECORD` with the command and environment too.
pub const MAX_SPEC_BYTES: usize = 256 << 10;

/// [`parse`] of a spec file's bytes: over [`MAX_SPEC_BYTES`], or not UTF-8, is an error that
/// says where (the line and column where the limit is crossed, or of the first bad byte).
pub fn parse_bytes(file: &str, bytes: &[u8]) -> Result<Spec, SpecError> {
    let at = |offset: usize, message: String| {
        let before = &bytes[..offset];
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1);
        let line_end = bytes[offset..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |p| offset + p);
        SpecError {
            file: file.to_string(),
            line: before.iter().filter(|&&b| b == b'\n').count() + 1,
            column: String::from_utf8_lossy(&bytes[line_start..offset])
                .chars()
                .count()
                + 1,
            width: 1,
            message,
            source_line: String::from_utf8_lossy(&bytes[line_start..line_end]).into_owned(),
        }
    };
    if bytes.len() > MAX_SPEC_BYTES {
        return Err(at(
            MAX_SPEC_BYTES,
            format!(
                "the spec is {} bytes, over the limit of {MAX_SPEC_BYTES} bytes (it is crossed here)",
                bytes.len()
            ),
        ));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| at(e.valid_up_to(), "not UTF-8: a spec is UTF-8 text".into()))?;
    parse(file, text)
}

/// Parses spec text. `file` is only used in error messages.
pub fn parse(file: &str, text: &str) -> Result<Spec, SpecError> {
    let mut spec = Spec::default();
    // Positions of what must be unique, for "first defined here" style messages.
    let mut net_line: Option<usize> = None;
    let mut targets: Vec<(String, usize)> = Vec::new();
    let mut pending_tools: Vec<(String, usize, Word, String)> = Vec::new();
    let mut pending_nets: Vec<(usize, Word, String)> = Vec::new();
    for (idx, source) in text.split('\n').enumerate() {
        let ctx = LineCtx {
            file,
            number: idx + 1,
            source,
        };
        let words = split_words(&ctx)?;
        let Some((head, args)) = words.split_first() else {
            continue;
        };
        match head.text.as_str() {
            "bind" => {
                let mut access = None;
                let mut recursive = false;
                let mut rest = args;
                while let Some((w, tail)) = rest.split_first() {
                    match w.text.as_str() {
                        "-r" | "-w" => {
                            let a = if w.text == "-r" {
                                Access::Read
                            } else {
                                Access::Write
                            };
                            if access.is_some() {
                                return Err(ctx.err(w, "bind takes one of -r or -w, once"));
                            }
                            access = Some(a);
                        }
                        "-R" => {
                            if recursive {
                                return Err(ctx.err(w, "-R given twice"));
                            }
                            recursive = true;
                        }
                        f if f.starts_with('-') && f.len() > 1 => {
                            return Err(ctx.err(
                                w,
                                format!("unknown bind flag `{f}` (expected -r, -w or -R)"),
                            ));
                        }
                        _ => break,
                    }
                    rest = tail;
                }
                let [host, path] = rest else {
                    let col = rest.first().map_or(ctx.end(), |w| w.column);
                    return Err(ctx.err_at(
                        col,
                        1,
                        format!("bind needs HOSTPATH and PATH, got {} word(s)", rest.len()),
                    ));
                };
                let host_p = check_abs_path(&ctx, host, "HOSTPATH")?;
                let path_p = check_abs_path(&ctx, path, "PATH")?;
                claim_target(&ctx, path, &path_p, &mut targets)?;
                spec.binds.push(Bind {
                    access: access.unwrap_or(Access::Read),
                    recursive,
                    host: host_p,
                    path: path_p,
                });
            }
            "mount" => {
                let mut rest = args;
                let mut key = None;
                let mut plain: Option<&Word> = None;
                while let Some((w, tail)) = rest.split_first() {
                    match w.text.as_str() {
                        "-k" if key.is_none() => {
                            let Some((k, tail2)) = tail.split_first() else {
                                return Err(
                                    ctx.err(w, "-k needs a PEER (a name in the peers file)")
                                );
                            };
                            check_shown(&ctx, k, "PEER")?;
                            if !warren_proto::export::peers::valid_name(&k.text) {
                                return Err(ctx.err(
                                    k,
                                    format!(
                                        "`{}` is not a peer name (lowercase letters, digits, `._-`)",
                                        k.text
                                    ),
                                ));
                            }
                            key = Some(k.text.clone());
                            rest = tail2;
                        }
                        "--insecure-plain" if plain.is_none() => {
                            plain = Some(w);
                            rest = tail;
                        }
                        "-k" | "--insecure-plain" => {
                            return Err(ctx.err(w, format!("`{}` given twice", w.text)));
                        }
                        _ => break,
                    }
                }
                if let (Some(w), Some(_)) = (plain, &key) {
                    return Err(ctx.err(
                        w,
                        "--insecure-plain and -k PEER exclude each other: a keyed mount is \
                         authenticated and encrypted",
                    ));
                }
                let Some((server_w, tail)) = rest.split_first() else {
                    return Err(ctx.err_at(ctx.end(), 1, "mount needs SERVER and PATH"));
                };
                if server_w.text.starts_with('-') {
                    return Err(ctx.err(
                        server_w,
                        format!(
                            "unknown mount flag `{}` (expected -k PEER or --insecure-plain)",
                            server_w.text
                        ),
                    ));
                }
                let server = parse_server(&ctx, server_w)?;
                if let Some(w) = plain
                    && !matches!(server, Server::Tcp { .. })
                {
                    return Err(ctx.err(
                        w,
                        "--insecure-plain is for a tcp!HOST!PORT server (plain 9P over the network)",
                    ));
                }
                let Some((path_w, spec_words)) = tail.split_first() else {
                    return Err(ctx.err_at(ctx.end(), 1, "mount needs a PATH after SERVER"));
                };
                let path = check_abs_path(&ctx, path_w, "PATH")?;
                claim_target(&ctx, path_w, &path, &mut targets)?;
                let mut names: Vec<String> = Vec::new();
                if server == Server::Local(LocalServer::Llm)
                    && let Some(w) = spec_words.first()
                {
                    return Err(ctx.err(w, "`mount llm PATH` takes no words after PATH"));
                }
                for w in spec_words {
                    check_shown(&ctx, w, "a mount word")?;
                    if server == Server::Local(LocalServer::Tool)
                        || matches!(server, Server::Mcp(_))
                    {
                        if !is_tool_name(&w.text) {
                            return Err(ctx.err(w, format!("`{}` is not a tool name", w.text)));
                        }
                        if names.contains(&w.text) {
                            return Err(ctx.err(w, format!("tool `{}` granted twice", w.text)));
                        }
                    }
                    names.push(w.text.clone());
                }
                if key.is_some() {
                    if !matches!(server, Server::Tcp { .. }) {
                        return Err(
                            ctx.err(server_w, "-k PEER names a peer reached over tcp!HOST!PORT")
                        );
                    }
                    if names.len() > 1
                        || names
                            .iter()
                            .any(|t| !warren_proto::export::peers::valid_name(t))
                    {
                        return Err(ctx.err_at(
                            ctx.end(),
                            1,
                            "mount -k PEER tcp!HOST!PORT PATH takes at most one word: the \
                             peer's tree (default `tool`)",
                        ));
                    }
                }
                if let Some(peer) = &key {
                    // A namespace that calls a peer's tools and answers that peer's asks would
                    // approve its own calls: the two trees of one peer never meet in one spec.
                    let this = names.first().map_or("tool", String::as_str);
                    let other = match this {
                        "asks" => Some("tool"),
                        "tool" => Some("asks"),
                        _ => None,
                    };
                    if let Some(other) = other
                        && spec.mounts.iter().any(|m| {
                            m.key.as_ref() == Some(peer)
                                && m.spec.first().map_or("tool", String::as_str) == other
                        })
                    {
                        return Err(ctx.err(
                            server_w,
                            format!(
                                "peer `{peer}`'s `tool` and `asks` trees may not be mounted in one \
                                 namespace: it would answer the asks of its own calls"
                            ),
                        ));
                    }
                }
                if server == Server::Local(LocalServer::Tool) && names.is_empty() {
                    return Err(ctx.err(
                        server_w,
                        "`mount tool` must list the granted tool names (none are implied)",
                    ));
                }
                spec.mounts.push(Mount {
                    key,
                    insecure_plain: plain.is_some(),
                    server,
                    path,
                    spec: names,
                });
            }
            "tool" => {
                let Some((name_w, tail)) = args.split_first() else {
                    return Err(ctx.err_at(ctx.end(), 1, "tool needs NAME -r|-w HOSTPATH…"));
                };
                if !is_tool_name(&name_w.text) {
                    return Err(ctx.err(name_w, format!("`{}` is not a tool name", name_w.text)));
                }
                let Some((mode_w, paths)) = tail.split_first() else {
                    return Err(ctx.err_at(ctx.end(), 1, "tool needs -r or -w after NAME"));
                };
                if mode_w.text == "net" {
                    let (kind, patterns) = match paths.split_first() {
                        Some((k, rest)) if k.text == "proxy" => (k, rest),
                        Some((k, _)) => {
                            return Err(ctx.err(
                                k,
                                format!("expected `net proxy [PATTERN…]`, got `net {}`", k.text),
                            ));
                        }
                        None => {
                            return Err(ctx.err_at(
                                ctx.end(),
                                1,
                                "tool NAME net takes `proxy [PATTERN…]`",
                            ));
                        }
                    };
                    if !NETWORK_TOOLS.contains(&name_w.text.as_str()) {
                        return Err(ctx.err(
                            name_w,
                            format!(
                                "tool `{}` cannot be given the network: only {} runs programs",
                                name_w.text,
                                NETWORK_TOOLS.join(", ")
                            ),
                        ));
                    }
                    if spec.tool_nets.iter().any(|t| t.name == name_w.text) {
                        return Err(ctx.err(
                            kind,
                            format!("tool `{}` is given the network twice", name_w.text),
                        ));
                    }
                    let mut proxy = Vec::new();
                    for p in patterns {
                        proxy.push(p.text.parse().map_err(|e: String| ctx.err(p, e))?);
                    }
                    pending_tools.push((
                        name_w.text.clone(),
                        ctx.number,
                        name_w.clone(),
                        source.to_string(),
                    ));
                    pending_nets.push((ctx.number, name_w.clone(), source.to_string()));
                    spec.tool_nets.push(ToolNet {
                        name: name_w.text.clone(),
                        proxy,
                    });
                    continue;
                }
                let access = match mode_w.text.as_str() {
                    "-r" => Access::Read,
                    "-w" => Access::Write,
                    other => {
                        return Err(ctx.err(mode_w, format!("expected -r or -w, got `{other}`")));
                    }
                };
                if paths.is_empty() {
                    return Err(ctx.err_at(ctx.end(), 1, "tool needs at least one HOSTPATH"));
                }
                let mut host_paths = Vec::new();
                for w in paths {
                    host_paths.push(check_abs_path(&ctx, w, "HOSTPATH")?);
                }
                pending_tools.push((
                    name_w.text.clone(),
                    ctx.number,
                    name_w.clone(),
                    source.to_string(),
                ));
                spec.tools.push(ToolAuthority {
                    name: name_w.text.clone(),
                    access,
                    host_paths,
                });
            }
            "net" => {
                let Some((w, rest)) = args.split_first() else {
                    return Err(ctx.err(head, "net takes one of: none, loopback, proxy PATTERN…"));
                };
                let net = match w.text.as_str() {
                    "none" | "loopback" if !rest.is_empty() => {
                        return Err(
                            ctx.err(&rest[0], format!("net {} takes no more words", w.text))
                        );
                    }
                    "none" => Net::None,
                    "loopback" => Net::Loopback,
                    "proxy" => {
                        if rest.is_empty() {
                            return Err(ctx.err(
                                w,
                                "net proxy needs at least one HOST[:PORT][=ADDR,…] pattern",
                            ));
                        }
                        for p in rest {
                            // The proxy's own parser: what nsd hands it is what it would parse.
                            let pattern: warren_proto::net::Pattern =
                                p.text.parse().map_err(|e: String| ctx.err(p, e))?;
                            spec.proxy.push(pattern);
                        }
                        Net::Proxy
                    }
                    "host" => {
                        return Err(ctx.err(
                            w,
                            "`net host` is not supported in this version (see docs/gaps.md)",
                        ));
                    }
                    other => {
                        return Err(ctx.err(
                            w,
                            format!("unknown net `{other}`: expected none, loopback or proxy"),
                        ));
                    }
                };
                if let Some(prev) = net_line {
                    return Err(ctx.err(head, format!("net already set on line {prev}")));
                }
                net_line = Some(ctx.number);
                spec.net = Some(net);
            }
            "env" => {
                if args.is_empty() {
                    return Err(ctx.err_at(ctx.end(), 1, "env needs a NAME"));
                }
                for w in args {
                    if w.text.contains('=') {
                        return Err(ctx.err(
                            w,
                            "env takes a NAME only; the value comes from the launcher",
                        ));
                    }
                    if !is_env_name(&w.text) {
                        return Err(ctx.err(w, format!("`{}` is not an environment name", w.text)));
                    }
                    if spec.env.contains(&w.text) {
                        return Err(ctx.err(w, format!("env `{}` given twice", w.text)));
                    }
                    spec.env.push(w.text.clone());
                }
            }
            "limit" => {
                if args.is_empty() {
                    return Err(ctx.err_at(
                        ctx.end(),
                        1,
                        "limit needs KEY=VALUE (mem=, pids=, cpu=, wall=, clones=)",
                    ));
                }
                for w in args {
                    let Some((k, v)) = w.text.split_once('=') else {
                        return Err(ctx.err(w, "limit takes KEY=VALUE"));
                    };
                    let (slot, value) = match k {
                        "mem" => (&mut spec.limits.mem, parse_size(v)),
                        "pids" => (&mut spec.limits.pids, parse_number(v)),
                        "cpu" => (&mut spec.limits.cpu, parse_duration(v)),
                        "wall" => (&mut spec.limits.wall, parse_duration(v)),
                        "clones" => (&mut spec.limits.clones, parse_number(v)),
                        "receipts" => (&mut spec.limits.receipts, parse_number(v)),
                        "receipt-bytes" => (&mut spec.limits.receipt_bytes, parse_size(v)),
                        "asks" => (&mut spec.limits.asks, parse_number(v)),
                        "llm-bytes" => (&mut spec.limits.llm_bytes, parse_size(v)),
                        _ => {
                            return Err(ctx.err(
                                w,
                                format!(
                                    "unknown limit `{k}`: expected mem, pids, cpu, wall, clones, receipts, receipt-bytes, asks or llm-bytes"
                                ),
                            ));
                        }
                    };
                    let Some(value) = value.filter(|&n| n > 0) else {
                        return Err(ctx.err(
                            w,
                            format!(
                                "bad value `{v}` for {k} (mem, receipt-bytes, llm-bytes: 512M/1G/bytes; pids, clones, receipts (per second), asks: count; cpu, wall: 30s/5m/2h), must be > 0"
                            ),
                        ));
                    };
                    if slot.is_some() {
                        return Err(ctx.err(w, format!("limit {k} given twice")));
                    }
                    *slot = Some(value);
                }
            }
            other => {
                return Err(ctx.err(
                    head,
                    format!(
                        "unknown directive `{other}`: expected bind, mount, tool, net, env or limit"
                    ),
                ));
            }
        }
    }
    let granted = spec.tool_grants();
    for (name, line, word, source) in pending_tools {
        if !granted.contains(&name) {
            let ctx = LineCtx {
                file,
                number: line,
                source: &source,
            };
            return Err(ctx.err(
                &word,
                format!("authority for tool `{name}`, which no `mount tool` line grants"),
            ));
        }
    }
    // A tool's network is never wider than its namespace's.
    let (net, namespace) = (
        spec.net(),
        warren_proto::net::Policy::new(spec.proxy.clone()),
    );
    for ((line, word, source), tool) in pending_nets.into_iter().zip(&mut spec.tool_nets) {
        let ctx = LineCtx {
            file,
            number: line,
            source: &source,
        };
        if net != Net::Proxy {
            return Err(ctx.err(
                &word,
                format!(
                    "tool `{}` net proxy needs the namespace's own `net proxy` line: a tool's \
                     network is never wider than its namespace's",
                    tool.name
                ),
            ));
        }
        if tool.proxy.is_empty() {
            tool.proxy = namespace.patterns.clone();
            continue;
        }
        let widened = namespace.widenings(&warren_proto::net::Policy::new(tool.proxy.clone()));
        if let Some(why) = widened.first() {
            return Err(ctx.err(
                &word,
                format!(
                    "tool `{}` net proxy {why} (the namespace's `net proxy` line)",
                    tool.name
                ),
            ));
        }
    }
    Ok(spec)
}

fn claim_target(
    ctx: &LineCtx<'_>,
    w: &Word,
    path: &str,
    targets: &mut Vec<(String, usize)>,
) -> Result<(), SpecError> {
    for reserved in RESERVED_TREES.iter().chain(RESERVED_POINTS) {
        let under = RESERVED_TREES.contains(reserved) && path.starts_with(&format!("{reserved}/"));
        if path == *reserved || under {
            return Err(ctx.err(
                w,
                format!("`{path}` is reserved: the confinement provides {reserved} itself"),
            ));
        }
    }
    if let Some((_, line)) = targets.iter().find(|(t, _)| t == path) {
        return Err(ctx.err(w, format!("`{path}` is already a target on line {line}")));
    }
    targets.push((path.to_string(), ctx.number));
    Ok(())
}

impl Spec {
    /// Every tool name granted by a `mount tool` line, in order, without repeats.
    pub fn tool_grants(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for m in &self.mounts {
            if m.server == Server::Local(LocalServer::Tool) {
                for n in &m.spec {
                    if !out.contains(n) {
                        out.push(n.clone());
                    }
                }
            }
        }
        out
    }

    pub fn net(&self) -> Net {
        self.net.unwrap_or_default()
    }

    /// The destinations `tool`'s worker may reach through the egress proxy: none unless a
    /// `tool NAME net proxy` line names it under a `net proxy` namespace (its list as parsed).
    pub fn tool_proxy(&self, tool: &str) -> Option<&[warren_proto::net::Pattern]> {
        if self.net() != Net::Proxy {
            return None;
        }
        let line = self.tool_nets.iter().find(|t| t.name == tool)?;
        Some(&line.proxy)
    }

    /// The spec as text that parses back to an equal spec. It holds env NAMES only: a `Spec`
    /// never carries an env value, so none can be printed.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for b in &self.binds {
            out.push_str("bind ");
            out.push_str(b.access.flag());
            if b.recursive {
                out.push_str(" -R");
            }
            out.push_str(&format!(" {} {}\n", quote(&b.host), quote(&b.path)));
        }
        for m in &self.mounts {
            out.push_str("mount");
            if let Some(k) = &m.key {
                out.push_str(&format!(" -k {}", quote(k)));
            }
            if m.insecure_plain {
                out.push_str(" --insecure-plain");
            }
            out.push_str(&format!(
                " {} {}",
                quote(&m.server.to_string()),
                quote(&m.path)
            ));
            for s in &m.spec {
                out.push(' ');
                out.push_str(&quote(s));
            }
            out.push('\n');
        }
        for t in &self.tools {
            out.push_str(&format!("tool {} {}", quote(&t.name), t.access.flag()));
            for p in &t.host_paths {
                out.push(' ');
                out.push_str(&quote(p));
            }
            out.push('\n');
        }
        for t in &self.tool_nets {
            out.push_str(&format!("tool {} net proxy", quote(&t.name)));
            for p in &t.proxy {
                out.push(' ');
                out.push_str(&quote(&p.to_string()));
            }
            out.push('\n');
        }
        if let Some(net) = self.net {
            out.push_str(match net {
                Net::None => "net none",
                Net::Loopback => "net loopback",
                Net::Proxy => "net proxy",
            });
            for p in &self.proxy {
                out.push(' ');
                out.push_str(&quote(&p.to_string()));
            }
            out.push('\n');
        }
        for e in &self.env {
            out.push_str(&format!("env {e}\n"));
        }
        if !self.limits.is_empty() {
            out.push_str("limit");
            let l = &self.limits;
            if let Some(v) = l.mem {
                out.push_str(&format!(" mem={v}"));
            }
            if let Some(v) = l.pids {
                out.push_str(&format!(" pids={v}"));
            }
            if let Some(v) = l.cpu {
                out.push_str(&format!(" cpu={v}s"));
            }
            if let Some(v) = l.wall {
                out.push_str(&format!(" wall={v}s"));
            }
            if let Some(v) = l.clones {
                out.push_str(&format!(" clones={v}"));
            }
            if let Some(v) = l.receipts {
                out.push_str(&format!(" receipts={v}"));
            }
            if let Some(v) = l.receipt_bytes {
                out.push_str(&format!(" receipt-bytes={v}"));
            }
            if let Some(v) = l.asks {
                out.push_str(&format!(" asks={v}"));
            }
            if let Some(v) = l.llm_bytes {
                out.push_str(&format!(" llm-bytes={v}"));
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A spec file that is not UTF-8 is refused at the line and column of its first bad byte; one
    /// over the size limit names the file and the limit, never a transport error.
    #[test]
    fn bad_bytes_and_oversized_specs_say_where_and_why() {
        let bytes = b"net none\nbind -r /usr /\xffusr\n";
        let e = parse_bytes("bad.ns", bytes).unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.line, e.column),
            ("bad.ns", 2, 15),
            "{e}"
        );
        assert!(e.message.contains("not UTF-8"), "{e}");
        assert!(e.to_string().contains("--> bad.ns:2:15"), "{e}");

        let big = "# padding\n".repeat(100_000);
        let e = parse_bytes("big.ns", big.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("--> big.ns:"), "{e}");
        assert!(
            e.message
                .contains(&format!("over the limit of {MAX_SPEC_BYTES} bytes")),
            "{e}"
        );
        assert_eq!(e.line, MAX_SPEC_BYTES / 10 + 1, "{e}");
    }

    #[test]
    fn parses_the_design_example() {
        let text = "# a reviewer: may read the repo through its tools, nothing else\n\
            mount tool /tool fs_read fs_list\n\
            tool fs_read  -r /home/me/repo          # the tools' own authority\n\
            tool fs_list  -r /home/me/repo\n\
            mount -k gpu1 tcp!gpu1!5640 /mnt/llm\n\
            net none\n";
        let s = parse("reviewer.ns", text).unwrap();
        assert_eq!(s.tool_grants(), vec!["fs_read", "fs_list"]);
        assert_eq!(s.tools.len(), 2);
        assert_eq!(
            s.mounts[1].server,
            Server::Tcp {
                host: "gpu1".into(),
                port: 5640
            }
        );
        assert_eq!(s.mounts[1].key.as_deref(), Some("gpu1"));
        assert_eq!(s.net, Some(Net::None));
    }

    #[test]
    fn insecure_plain_is_a_tcp_mounts_flag_and_excludes_a_key() {
        let s = parse("x", "mount --insecure-plain tcp!10.0.0.2!564 /n/d /srv\n").unwrap();
        assert!(s.mounts[0].insecure_plain && s.mounts[0].key.is_none());
        assert!(
            s.to_text()
                .contains("mount --insecure-plain tcp!10.0.0.2!564 /n/d /srv\n")
        );
        assert_eq!(parse("x", &s.to_text()).unwrap(), s);
        assert!(!parse("x", "mount tcp!h!564 /n/d").unwrap().mounts[0].insecure_plain);
        for (line, why) in [
            (
                "mount --insecure-plain unix!/s /n/d",
                "for a tcp!HOST!PORT server",
            ),
            (
                "mount --insecure-plain -k b tcp!h!1 /n/d",
                "exclude each other",
            ),
            (
                "mount -k b --insecure-plain tcp!h!1 /n/d",
                "exclude each other",
            ),
            (
                "mount --insecure-plain --insecure-plain tcp!h!1 /n/d",
                "given twice",
            ),
            (
                "mount --plain tcp!h!1 /n/d",
                "expected -k PEER or --insecure-plain",
            ),
        ] {
            let e = parse("x", line).unwrap_err();
            assert!(e.message.contains(why), "{line}: {e}");
        }
    }

    #[test]
    fn bind_flags_and_defaults() {
        let s = parse("x", "bind /usr /usr\nbind -w -R /a /b\nbind -R -r /c /d").unwrap();
        assert_eq!(s.binds[0].access, Access::Read);
        assert!(!s.binds[0].recursive);
        assert_eq!(s.binds[1].access, Access::Write);
        assert!(s.binds[1].recursive);
        assert_eq!(s.binds[2].access, Access::Read);
    }

    #[test]
    fn limits_and_env() {
        let s = parse(
            "x",
            "limit mem=512M pids=64\nlimit cpu=2m wall=30 clones=3\nenv TERM _X1",
        )
        .unwrap();
        assert_eq!(s.limits.clones, Some(3));
        assert_eq!(parse("x", "").unwrap().limits.clones(), DEFAULT_CLONES);
        assert_eq!(s.limits.mem, Some(512 << 20));
        assert_eq!(s.limits.pids, Some(64));
        assert_eq!(s.limits.cpu, Some(120));
        assert_eq!(s.limits.wall, Some(30));
        assert_eq!(s.env, vec!["TERM", "_X1"]);
    }

    #[test]
    fn subtree_budgets_parse_and_print_back() {
        let s = parse(
            "x",
            "limit receipts=500 receipt-bytes=64M asks=8 llm-bytes=16M",
        )
        .unwrap();
        assert_eq!(s.limits.receipts, Some(500));
        assert_eq!(s.limits.receipt_bytes, Some(64 << 20));
        assert_eq!(s.limits.asks, Some(8));
        assert_eq!(s.limits.llm_bytes, Some(16 << 20));
        assert_eq!(parse("x", &s.to_text()).unwrap(), s);
        for bad in [
            "limit receipts=0",
            "limit asks=many",
            "limit asks=1 asks=2",
            "limit llm-bytes=0",
        ] {
            assert!(parse("x", bad).is_err(), "{bad}");
        }
    }

    fn err(text: &str) -> SpecError {
        parse("t.ns", text).unwrap_err()
    }

    #[test]
    fn errors_name_file_line_and_column() {
        let e = err("net none\n\n  bnd /a /b\n");
        assert_eq!((e.file.as_str(), e.line, e.column), ("t.ns", 3, 3));
        assert!(e.message.contains("unknown directive `bnd`"), "{e}");
        let shown = e.to_string();
        assert!(shown.contains("--> t.ns:3:3"), "{shown}");
        assert!(shown.contains("  bnd /a /b"), "{shown}");
        assert!(shown.contains("^^^"), "{shown}");

        let e = err("bind -r /usr usr");
        assert_eq!((e.line, e.column), (1, 14));
        assert!(e.message.contains("absolute"), "{e}");
    }

    #[test]
    fn an_mcp_mount_names_its_server_and_optionally_its_tools() {
        let spec = parse(
            "t",
            "mount mcp:everything /mnt/mcp/everything echo add\nmount mcp:fs /mnt/fs",
        )
        .unwrap();
        assert_eq!(spec.mounts[0].server, Server::Mcp("everything".into()));
        assert_eq!(spec.mounts[0].spec, ["echo", "add"]);
        assert!(
            spec.mounts[1].spec.is_empty(),
            "no names: every tool the operator allowed"
        );
        assert_eq!(parse("t", &spec.to_text()).unwrap(), spec);
        // Not `/tool` grants: a `tool` line cannot give an MCP tool a root.
        assert!(spec.tool_grants().is_empty());
    }

    #[test]
    fn rejects_bad_input_clearly() {
        for (text, needle) in [
            ("bind -r -w /a /b", "one of -r or -w"),
            ("bind -x /a /b", "unknown bind flag"),
            ("bind /a", "HOSTPATH and PATH"),
            ("bind /a /b/../c", "`..` component"),
            ("bind /a /b/", "trailing"),
            ("bind /a /proc/x", "reserved"),
            ("bind /a /x\nbind /b /x", "already a target on line 1"),
            ("mount tool /tool", "must list"),
            ("mount tool /tool a a", "granted twice"),
            ("mount tool /tool 'a b'", "not a tool name"),
            ("mount ftp!x /m", "unknown server"),
            ("mount mcp: /m", "not an MCP server name"),
            ("mount llm /mnt/llm gpt", "takes no words"),
            ("mount mcp:a/b /m", "not an MCP server name"),
            ("mount mcp:e /m echo echo", "granted twice"),
            ("mount mcp:e /m 'a b'", "not a tool name"),
            ("mount tcp!h /m", "missing port"),
            ("mount tcp!h!0 /m", "bad port"),
            ("mount tcp!h!70000 /m", "bad port"),
            ("mount unix!rel /m", "absolute"),
            ("mount -k", "PEER"),
            ("mount -k Gpu tcp!h!1 /m", "not a peer name"),
            (
                "mount -k b tcp!h!1 /n/b\nmount -k b tcp!h!1 /n/b-asks asks",
                "may not be mounted in one namespace",
            ),
            (
                "mount -k b tcp!h!1 /n/a asks\nmount -k b tcp!h!1 /n/b tool",
                "may not be mounted in one namespace",
            ),
            ("mount -k gpu unix!/s /m", "tcp!HOST!PORT"),
            ("mount -k gpu tcp!h!1 /m tool dir", "at most one word"),
            ("tool x -r /a", "no `mount tool` line grants"),
            ("mount tool /t x\ntool x -x /a", "expected -r or -w"),
            ("mount tool /t x\ntool x -r", "at least one HOSTPATH"),
            ("net wide", "unknown net"),
            ("net host", "not supported"),
            ("net proxy", "at least one"),
            ("net proxy api.test:0", "port 0"),
            ("net proxy 'a b'", "not a host name"),
            ("net proxy *.", "must be followed"),
            ("net loopback api.test", "takes no more words"),
            ("net none\nnet loopback", "already set on line 1"),
            ("env A=b", "NAME only"),
            ("env 1A", "not an environment name"),
            ("env A A", "twice"),
            ("limit mem=lots", "bad value"),
            ("limit pids=0", "bad value"),
            ("limit clones=0", "bad value"),
            ("limit pids=1 pids=2", "twice"),
            ("limit disk=1", "unknown limit"),
            ("bind 'unterminated /a", "unterminated"),
            ("bind a'b /a", "quote inside a word"),
            ("bind 'a'b /x", "followed by a blank"),
        ] {
            let e = err(text);
            assert!(
                e.message.contains(needle),
                "{text:?}: expected {needle:?} in {:?}",
                e.message
            );
        }
    }

    /// A word holding an escape sequence, a newline or a bidi override is quoted as one
    /// printable line (so an `info` line or a `warren ps` row cannot be forged) that reads back
    /// as the same word.
    #[test]
    fn hostile_words_quote_to_one_printable_line_and_read_back() {
        for word in [
            "\x1b[2K\x1b[1A\r1     running 0s      /tool            shell                sh",
            "ok.txt\nid_rsa\tfile\t1675",
            "/tmp/\u{202E}txt.exe",
            "it's a\u{00A0}b\u{200B}c\\u{41}",
            "$'x'",
            "plain",
            "has space",
        ] {
            let q = quote(word);
            assert!(
                !q.chars().any(misleads),
                "{word:?} quoted as {q:?} still holds a hidden code point"
            );
            assert_eq!(split_command(&q).unwrap(), vec![word.to_owned()], "{q}");
            let two = format!("{q} {}", quote("next"));
            assert_eq!(split_command(&two).unwrap(), vec![word, "next"], "{two}");
        }
        assert_eq!(quote("/tmp/\u{202E}x"), "$'/tmp/\\u{202E}x'");
        assert!(split_command(r"$'\q'").is_err());
    }

    /// A path, key file or mount word with a format (bidi) or invisible code point is refused:
    /// it would be shown reversed or as another in `warren ns` and `warren ps`.
    #[test]
    fn paths_with_bidi_or_invisible_code_points_are_refused() {
        for (text, needle) in [
            ("mount gate /n/\u{202E}etag", "U+202E"),
            ("bind /a\u{200B}b /x", "U+200B"),
            ("bind /a /x\u{00A0}y", "U+00A0"),
            ("bind /a /x\u{E000}", "U+E000"),
            ("mount -k /k\u{2066} gate /g", "U+2066"),
            ("mount gate /g a\u{2028}b", "U+2028"),
            ("bind $'/a\\u{001B}[2J' /x", "U+001B"),
        ] {
            let e = err(text);
            assert!(e.message.contains(needle), "{text:?}: {:?}", e.message);
            let shown = e.to_string();
            assert!(
                !shown.chars().any(|c| c != '\n' && misleads(c)),
                "the error shows a hidden code point: {shown:?}"
            );
        }
    }

    #[test]
    fn quoting_and_comments() {
        let s = parse("x", "bind '/a b' '/it''s' # trailing\n# whole line\n\n").unwrap();
        assert_eq!(s.binds[0].host, "/a b");
        assert_eq!(s.binds[0].path, "/it's");
        assert_eq!(parse("x", &s.to_text()).unwrap(), s);
        // `#` inside a word is not a comment
        let s = parse("x", "bind /a#b /c").unwrap();
        assert_eq!(s.binds[0].host, "/a#b");
    }

    #[test]
    fn to_text_holds_env_names_never_values() {
        // SAFETY-free: only a name goes in; the launcher's value must not appear.
        let s = parse("x", "env WARREN_SECRET_PROBE").unwrap();
        let t = s.to_text();
        assert_eq!(t, "env WARREN_SECRET_PROBE\n");
        assert!(!t.contains('='));
    }

    fn path_strategy() -> impl Strategy<Value = String> {
        prop::collection::vec("[a-zA-Z0-9 _'#.-]{1,6}", 1..4).prop_map(|comps| {
            let comps: Vec<String> = comps
                .into_iter()
                .map(|c| if c == "." || c == ".." { "x".into() } else { c })
                .collect();
            format!("/srv/{}", comps.join("/"))
        })
    }

    fn tool_name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9_:.-]{0,10}"
    }

    fn spec_strategy() -> impl Strategy<Value = Spec> {
        let bind = (any::<bool>(), any::<bool>(), path_strategy()).prop_map(|(w, r, p)| Bind {
            access: if w { Access::Write } else { Access::Read },
            recursive: r,
            host: p.clone(),
            path: p,
        });
        let server = prop_oneof![
            Just(Server::Local(LocalServer::Gate)),
            Just(Server::Local(LocalServer::Receipts)),
            Just(Server::Local(LocalServer::Ns)),
            "/[a-z]{1,8}".prop_map(Server::Unix),
            ("[a-z0-9.-]{1,8}", 1u16..).prop_map(|(host, port)| Server::Tcp { host, port }),
        ];
        let other_mount = (
            prop::option::of("[a-z0-9][a-z0-9._-]{0,7}"),
            server,
            // Mount words hold no control, bidi or invisible code point (those are refused).
            prop::collection::vec("[^\n\r\0]{0,5}", 0..3).prop_map(|words| {
                words
                    .into_iter()
                    .map(|w| w.chars().filter(|&c| !misleads(c)).collect())
                    .collect::<Vec<String>>()
            }),
        );
        (
            prop::collection::vec(bind, 0..4),
            prop::collection::btree_set(tool_name(), 1..4),
            prop::collection::vec(other_mount, 0..3),
            any::<(bool, bool)>(),
            prop::collection::btree_set("[A-Z_][A-Z0-9_]{0,6}", 0..3),
            prop::array::uniform4(prop::option::of(1u64..1_000_000)),
            prop::collection::vec(
                prop::sample::select(vec![
                    "api.example.org",
                    "*.pypi.org",
                    "api.test:8080=127.0.0.1",
                    "git.corp:22=10.0.0.5,10.0.0.6",
                    "192.0.2.7:22",
                    "[2001:db8::1]:443",
                    "h.test=[::1]",
                ]),
                0..4,
            ),
        )
            .prop_map(|(binds, tools, others, (net_set, lo), env, lim, proxy)| {
                let mut binds = binds;
                binds.sort_by(|a, b| a.path.cmp(&b.path));
                binds.dedup_by(|a, b| a.path == b.path);
                let names: Vec<String> = tools.into_iter().collect();
                let mut mounts = vec![Mount {
                    key: None,
                    insecure_plain: false,
                    server: Server::Local(LocalServer::Tool),
                    path: "/tool".into(),
                    spec: names.clone(),
                }];
                for (i, (key, server, spec)) in others.into_iter().enumerate() {
                    // A keyed mount is a peer's tcp! server with at most one tree word.
                    let keyed = matches!(server, Server::Tcp { .. })
                        && spec.len() <= 1
                        && spec
                            .iter()
                            .all(|w| warren_proto::export::peers::valid_name(w));
                    let plain = key.is_none() && matches!(server, Server::Tcp { .. }) && i % 2 == 0;
                    mounts.push(Mount {
                        key: key.filter(|_| keyed),
                        insecure_plain: plain,
                        server,
                        path: format!("/mnt/m{i}"),
                        spec,
                    });
                }
                let tools = names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| ToolAuthority {
                        name: n.clone(),
                        access: if i % 2 == 0 {
                            Access::Read
                        } else {
                            Access::Write
                        },
                        host_paths: (0..=i % 3).map(|k| format!("/srv/data{k}")).collect(),
                    })
                    .collect();
                Spec {
                    binds,
                    mounts,
                    tools,
                    net: net_set.then_some(if !proxy.is_empty() {
                        Net::Proxy
                    } else if lo {
                        Net::Loopback
                    } else {
                        Net::None
                    }),
                    proxy: if net_set {
                        proxy.iter().map(|p| p.parse().unwrap()).collect()
                    } else {
                        Vec::new()
                    },
                    tool_nets: Vec::new(),
                    env: env.into_iter().collect(),
                    limits: Limits {
                        mem: lim[0],
                        pids: lim[1],
                        cpu: lim[2],
                        wall: lim[3],
                        clones: lim[1].map(|n| n % 40 + 1),
                        ..Limits::default()
                    },
                }
            })
    }

    #[test]
    fn net_proxy_parses_the_proxys_patterns_and_prints_back() {
        let s = parse(
            "p.ns",
            "net proxy api.test:8080=127.0.0.1 '*.pypi.org' [2001:db8::1]\n",
        )
        .unwrap();
        assert_eq!(s.net(), Net::Proxy);
        let shown: Vec<String> = s.proxy.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            ["api.test:8080=127.0.0.1", "*.pypi.org", "[2001:db8::1]"]
        );
        assert_eq!(
            s.to_text(),
            "net proxy api.test:8080=127.0.0.1 *.pypi.org [2001:db8::1]\n"
        );
        assert_eq!(parse("p.ns", &s.to_text()).unwrap(), s);
        // Names are the proxy's: lowercased, a trailing dot dropped.
        let s = parse("p.ns", "net proxy API.Test.\n").unwrap();
        assert_eq!(s.proxy[0].to_string(), "api.test");
        assert!(Net::None < Net::Loopback && Net::Loopback < Net::Proxy);
    }

    /// `tool shell net proxy [PATTERN…]`: the namespace's list, or a narrower one, printed
    /// back; never wider than the namespace's, never without its `net proxy` line, never for a
    /// tool that runs no programs.
    #[test]
    fn a_tools_network_is_within_its_namespaces() {
        let base = "mount tool /tool shell fs_read\nnet proxy api.test '*.pypi.org'\n";
        let all = parse("t.ns", &format!("{base}tool shell net proxy\n")).unwrap();
        let shown = |p: Option<&[warren_proto::net::Pattern]>| {
            p.map(|v| v.iter().map(ToString::to_string).collect::<Vec<_>>())
        };
        assert_eq!(
            shown(all.tool_proxy("shell")),
            Some(vec!["api.test".into(), "*.pypi.org".into()])
        );
        assert_eq!(all.tool_proxy("fs_read"), None);
        let narrow = parse(
            "t.ns",
            &format!("{base}tool shell net proxy files.pypi.org:443\n"),
        )
        .unwrap();
        assert_eq!(
            shown(narrow.tool_proxy("shell")),
            Some(vec!["files.pypi.org:443".into()])
        );
        for s in [&all, &narrow] {
            assert_eq!(&parse("t.ns", &s.to_text()).unwrap(), s);
        }
        assert_eq!(parse("t.ns", base).unwrap().tool_proxy("shell"), None);
        for (text, want) in [
            (
                format!("{base}tool shell net proxy other.test\n"),
                "other.test:80 is not in the parent's list",
            ),
            (
                "mount tool /tool shell\ntool shell net proxy\n".to_string(),
                "needs the namespace's own `net proxy` line",
            ),
            (
                "mount tool /tool shell\nnet loopback\ntool shell net proxy\n".to_string(),
                "needs the namespace's own `net proxy` line",
            ),
            (
                format!("{base}tool fs_read net proxy\n"),
                "only shell runs programs",
            ),
            (
                format!("{base}tool shell net proxy\ntool shell net proxy\n"),
                "the network twice",
            ),
            (
                format!("{base}tool shell net loopback\n"),
                "expected `net proxy",
            ),
            (
                "net proxy api.test\ntool shell net proxy\n".to_string(),
                "no `mount tool` line grants",
            ),
        ] {
            let e = parse("t.ns", &text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    proptest! {
        #[test]
        fn print_parse_round_trip(spec in spec_strategy()) {
            let text = spec.to_text();
            let back = parse("gen.ns", &text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
            prop_assert_eq!(back, spec);
        }

        #[test]
        fn garbage_never_panics(text in "[ -~\t\n'#!/=-]{0,200}") {
            let _ = parse("g.ns", &text);
        }

        #[test]
        fn arbitrary_unicode_never_panics(text in any::<String>()) {
            if let Err(e) = parse("u.ns", &text) {
                let _ = e.to_string();
            }
        }

        #[test]
        fn mutated_valid_specs_never_panic(spec in spec_strategy(), cut in any::<prop::sample::Index>(), junk in "[ -~]{0,4}") {
            let mut text = spec.to_text();
            let mut at = cut.index(text.len() + 1);
            while !text.is_char_boundary(at) { at -= 1; }
            text.insert_str(at, &junk);
            let _ = parse("m.ns", &text);
        }
    }
}
