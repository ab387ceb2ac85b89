//! `warren mcp list|check|accept`: the operator's MCP servers (docs/mcp.md).
//!
//! A server is defined by `$WARREN_CONFIG_DIR/mcp/<name>.toml` (default `/etc/warren`); the
//! tool definitions the operator accepted are pinned beside it in `<name>.pins`. `check` starts
//! a stdio server the only way warren ever starts one — in a namespace of its own that nsd
//! builds from the file's `spec`, speaking MCP on pipes — lists its tools with their tier and
//! digest and says where each stands against the pins. `accept` pins only what the operator
//! was shown: a `TOOL@sha256:…` token `check` printed, or a digest from `check`'s record of what
//! it showed (`<name>.checked`), and only while the server still lists that very definition.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use warren_daemon::Dirs;
use warren_mcpfs::config::Transport;
use warren_mcpfs::pins::Shown;
use warren_mcpfs::{Definition, Pins, ServerConfig, Session, Standing};

/// How long a server has to answer the handshake and its listing.
const DEADLINE: Duration = Duration::from_secs(30);

use warren_mcpfs::config::{config_dir, pins_path, shown_path};

/// `warren mcp list`: each defined server, how it is reached, and how many tools are pinned.
pub fn list() -> Result<ExitCode> {
    let dir = config_dir();
    let mut names: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".toml").map(str::to_string)
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    names.sort();
    if names.is_empty() {
        eprintln!("no MCP servers are defined in {}", dir.display());
    }
    let mut out = std::io::stdout().lock();
    for name in names {
        match ServerConfig::load(&dir, &name) {
            Ok(c) => {
                let how = match &c.transport {
                    Transport::Stdio { command, .. } => format!("stdio {}", command.join(" ")),
                    Transport::Http { url } => format!("http {url}"),
                };
                let pinned = Pins::load(&pins_path(&dir, &name))
                    .map(|p| p.accepted().count())
                    .unwrap_or(0);
                writeln!(
                    out,
                    "{name}\t{}\t{pinned} pinned",
                    warren_daemon::escape::escape(&how)
                )?;
            }
            Err(e) => writeln!(out, "{name}\tinvalid: {e}")?,
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `warren mcp add NAME FILE`: checks the definition as nsd and mcpfs will read it, then
/// installs it (0644, written whole) as `<config>/mcp/NAME.toml`.
pub fn add(name: &str, definition: &std::path::Path, replace: bool) -> Result<ExitCode> {
    let text = std::fs::read_to_string(definition)
        .with_context(|| format!("reading {}", definition.display()))?;
    let config = ServerConfig::parse(name, &definition.display().to_string(), &text)?;
    if let Transport::Stdio { spec, .. } = &config.transport {
        warren_ns::parse(&format!("{} spec", definition.display()), spec)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let dir = config_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let target = dir.join(format!("{name}.toml"));
    if target.exists() && !replace {
        bail!(
            "{} exists: `warren mcp add --replace` replaces it",
            target.display()
        );
    }
    let tmp = dir.join(format!(".{name}.toml.tmp"));
    std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    std::fs::rename(&tmp, &target).with_context(|| format!("installing {}", target.display()))?;
    println!(
        "defined {name} in {}; `warren mcp check {name}` lists its tools, `warren mcp accept {name}` pins what it showed",
        target.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The server's tools as it lists them now, from a session started the way mcpfs starts it:
/// nsd reads the definition and runs the server in the namespace its `spec` names, with the
/// values of its `env` names from the secrets dir.
fn listing(dirs: &Dirs, config: &ServerConfig) -> Result<Vec<Definition>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listed = match &config.transport {
        Transport::Stdio { .. } => listing_stdio(dirs, config, &rt)?,
        // An HTTP server runs elsewhere: the operator's own connection reaches it.
        Transport::Http { url } => rt.block_on(async {
            let session = Session::http(url, DEADLINE).await?;
            let tools = session.tools(DEADLINE).await;
            session.close().await;
            anyhow::Ok(tools?)
        }),
    };
    let listed = listed.with_context(|| format!("MCP server {}", config.name))?;
    let mut defs = Vec::new();
    for d in listed {
        match d {
            Ok(d) => defs.push(d),
            Err(e) => eprintln!("warren: mcp: {}: not served: {e}", config.name),
        }
    }
    Ok(defs)
}

/// A stdio server's listing: nsd starts it as mcpfs would (the definition's namespace, its env
/// values from the secrets dir); it ends when its session closes.
fn listing_stdio(
    dirs: &Dirs,
    config: &ServerConfig,
    rt: &tokio::runtime::Runtime,
) -> Result<Result<Vec<Result<Definition, warren_mcpfs::definition::Unservable>>>> {
    // The server's stdin and stdout: pipes whose far ends nsd gives the confined server.
    let (server_in, to_server) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (from_server, server_out) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let stderr: OwnedFd = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")?
        .into();
    let launched = warren_proto::launch::start_server(
        &dirs.control(warren_proto::launch::MCP_CONTROL),
        &config.name,
        [server_in.as_fd(), server_out.as_fd(), stderr.as_fd()],
        DEADLINE,
    )
    .with_context(|| format!("starting MCP server {} through nsd", config.name))?;
    drop((server_in, server_out, stderr));
    let listed = rt.block_on(async {
        let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(from_server)?;
        let writer = tokio::net::unix::pipe::Sender::from_owned_fd(to_server)?;
        let session = Session::over(reader, writer, DEADLINE).await?;
        let tools = session.tools(DEADLINE).await;
        session.close().await;
        anyhow::Ok(tools?)
    });
    // The server sees its stdin close and ends; nsd tears its namespace down with it.
    let _ = launched.signal(libc::SIGTERM);
    let _ = launched.wait();
    Ok(listed)
}

fn standing_word(s: &Standing) -> &'static str {
    match s {
        Standing::Accepted => "accepted",
        Standing::Changed { .. } => "CHANGED (held)",
        Standing::New { .. } => "new (held)",
    }
}

/// The token naming one definition of a tool, as `check` prints it and `accept` takes it.
fn token(d: &Definition) -> String {
    format!("{}@{}", d.name, d.digest())
}

/// `TOOL@sha256:<64 hex digits>` as (tool, digest); a bare `TOOL` as (tool, None).
fn parse_token(arg: &str) -> Result<(&str, Option<&str>)> {
    let Some((tool, digest)) = arg.split_once('@') else {
        return Ok((arg, None));
    };
    let hex = digest.strip_prefix("sha256:").unwrap_or_default();
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        bail!(
            "{:?} is not TOOL@sha256:<64 hex digits> (the token `warren mcp check` prints)",
            warren_daemon::escape::escape(arg)
        );
    }
    Ok((tool, Some(digest)))
}

/// `warren mcp check NAME`: start it confined, list
/// `tool<TAB>tier<TAB>standing<TAB>tool@digest<TAB>summary`, and record what was shown (for
/// `accept` with bare tool names). With `full`, each row is followed by the tool's whole
/// pinned definition, escaped and indented: the summary is one line of the description, but
/// the digest `accept` pins covers every byte of it, the input schema and the annotations.
pub fn check(dirs: &Dirs, name: &str, full: bool) -> Result<ExitCode> {
    let dir = config_dir();
    let config = ServerConfig::load(&dir, name)?;
    let pins = Pins::load(&pins_path(&dir, name))?;
    let defs = listing(dirs, &config)?;
    // Recorded before it is shown: nothing is shown that `accept` could not check against.
    let record = shown_path(&dir, name);
    if let Err(e) = Shown::of(&defs).save(&record) {
        eprintln!(
            "warren: mcp: {name}: what is shown is not recorded ({}: {e}); `warren mcp accept` takes TOOL@sha256:… tokens",
            record.display()
        );
    }
    let mut out = std::io::stdout().lock();
    let mut held = 0;
    for d in &defs {
        let standing = pins.standing(d);
        held += usize::from(!standing.is_served());
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}",
            warren_daemon::escape::escape(&d.name),
            d.tier(config.tier_of(&d.name)).as_str(),
            standing_word(&standing),
            warren_daemon::escape::escape(&token(d)),
            warren_daemon::escape::escape(&d.summary()),
        )?;
        if full {
            let pinned = warren_daemon::escape::escape_bytes(&d.pinned_bytes());
            writeln!(out, "\t{pinned}")?;
        }
    }
    if held > 0 {
        eprintln!(
            "warren: mcp: {name}: {held} held; `warren mcp accept {name} TOOL@sha256:…` accepts the definitions named, `warren mcp accept {name}` every one shown above, each only if the server still lists it as shown"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `warren mcp accept NAME [TOOL@sha256:… | TOOL]…`: pin definitions the operator was shown —
/// each token's digest, or for a bare name (and for every tool when none is named) the digest
/// `check` last showed — and only if the server lists exactly those now. Anything else (a
/// definition changed since it was shown, a tool `check` never showed, a tool no longer listed)
/// refuses the whole acceptance, naming both digests; nothing is pinned.
pub fn accept(dirs: &Dirs, name: &str, tools: &[String]) -> Result<ExitCode> {
    let dir = config_dir();
    let config = ServerConfig::load(&dir, name)?;
    let path = pins_path(&dir, name);
    let mut pins = Pins::load(&path)?;
    let record = || -> Result<Shown> {
        let path = shown_path(&dir, name);
        Shown::load(&path)?.with_context(|| {
            format!(
                "`warren mcp check {name}` has shown nothing to accept ({} is missing): run it, or name each TOOL@sha256:… it printed",
                path.display()
            )
        })
    };
    // What the operator was shown, tool by tool.
    let mut wanted: Vec<(String, String)> = Vec::new();
    let mut shown = None;
    for arg in tools {
        let (tool, digest) = parse_token(arg)?;
        let digest = match digest {
            Some(d) => d.to_string(),
            None => {
                let shown = match &mut shown {
                    Some(s) => s,
                    None => shown.insert(record()?),
                };
                shown
                    .digest(tool)
                    .with_context(|| {
                        format!(
                            "`warren mcp check {name}` did not show {}: nothing accepted",
                            warren_daemon::escape::escape(tool)
                        )
                    })?
                    .to_string()
            }
        };
        wanted.push((tool.to_string(), digest));
    }
    let every_shown = tools.is_empty();
    if every_shown {
        wanted = record()?
            .tools()
            .map(|(t, d)| (t.to_string(), d.to_string()))
            .collect();
    }
    let defs = listing(dirs, &config)?;
    let mut differs = Vec::new();
    for (tool, shown) in &wanted {
        let named = warren_daemon::escape::escape(tool);
        match defs.iter().find(|d| d.name == *tool) {
            None => differs.push(format!(
                "{named}: shown as {shown}; the server lists no servable {named} now"
            )),
            Some(d) if d.digest() != *shown => differs.push(format!(
                "{named}: shown as {shown}; the server lists {} now",
                d.digest()
            )),
            Some(_) => {}
        }
    }
    if every_shown {
        for d in defs
            .iter()
            .filter(|d| !wanted.iter().any(|(t, _)| *t == d.name))
        {
            differs.push(format!(
                "{}: the server lists {} now, which `check` did not show",
                d.name,
                d.digest()
            ));
        }
    }
    if !differs.is_empty() {
        bail!(
            "nothing accepted: {name} does not list what was shown:\n  {}\n`warren mcp check {name}` shows what it lists now",
            differs.join("\n  ")
        );
    }
    let accepted: Vec<&Definition> = defs
        .iter()
        .filter(|d| wanted.iter().any(|(t, _)| *t == d.name))
        .filter(|d| !pins.standing(d).is_served())
        .collect();
    // Receipted before it is pinned: no definition is served that the chain does not show
    // accepted, and by whom.
    receipt_acceptances(dirs, name, &accepted)?;
    let mut out = std::io::stdout().lock();
    for d in accepted {
        pins.accept(&d.name, &d.digest());
        writeln!(out, "accepted {}\t{}", d.name, d.digest())?;
    }
    pins.save(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// The scope acceptances are receipted in.
pub const ACCEPT_SCOPE: &str = "mcp";

/// One `accept` receipt per definition, in scope `mcp`: the server, the tool, the digest.
fn receipt_acceptances(dirs: &Dirs, server: &str, accepted: &[&Definition]) -> Result<()> {
    if accepted.is_empty() {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let appender = warren_proto::receipts::Appender::connect(&dirs.socket("receipts"))
            .await
            .context("receiptd, to receipt the acceptance (nothing was accepted)")?;
        for d in accepted {
            let request = serde_json::json!({
                "scope": ACCEPT_SCOPE,
                "kind": "accept",
                "subject": {"server": server, "tool": d.name, "digest": d.digest()},
                "digests": {"definition": d.digest()},
            });
            appender
                .append(&serde_json::to_vec(&request)?)
                .await
                .with_context(|| {
                    format!(
                        "receipting the acceptance of {} (nothing was accepted)",
                        d.name
                    )
                })?;
        }
        anyhow::Ok(())
    })
}
