//! `warren sh`: the operator's own namespace — an interactive shell where the host stays visible
//! (less warren's own directories) and the daemons' trees are mounted through the bridge at
//! `/n/tool`, `/n/gate`, `/n/receipts` and `/n/ns`, each on a connection to the daemon's
//! operator socket made here with the operator's credentials. nsd builds it like any namespace
//! (an operator namespace: `specs/ns-tree.md`); the payload still never runs as uid 0.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use warren_daemon::Dirs;
use warren_ns::launch::client::{LaunchOptions, launch};

/// Top-level host directories not bound read-write: nsd makes its own `/proc`, `/dev`, `/tmp`
/// and the `/etc` files programs need; the system directories come read-only
/// (`warren_ns::SYSTEM_DIRS`); `/sys` and `/n` (ours) are not shown.
const NOT_BOUND: &[&str] = &[
    "proc",
    "sys",
    "dev",
    "tmp",
    "n",
    "usr",
    "bin",
    "sbin",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "etc",
    "boot",
    "lost+found",
];

/// The operator namespace's spec: every granted tool, the four operator mounts, and the host's
/// top-level directories, except those that hold one of warren's own (nsd would refuse them,
/// and they are what `/n/*` is for). Returns the spec text and the directories left out.
pub fn operator_spec(dirs: &Dirs, tools: &[String]) -> Result<(String, Vec<PathBuf>)> {
    let mut text = String::from("# warren sh: the operator's namespace\n");
    if !tools.is_empty() {
        text.push_str(&format!("mount tool /n/tool {}\n", tools.join(" ")));
    }
    for server in ["gate", "receipts", "ns"] {
        text.push_str(&format!("mount {server} /n/{server}\n"));
    }
    let ours: Vec<PathBuf> = [&dirs.runtime, &dirs.data, &dirs.secrets]
        .iter()
        .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.to_path_buf()))
        .collect();
    let mut left_out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir("/")
        .context("list /")?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // Directories only (merged-/usr symlinks come with nsd's defaults).
        if NOT_BOUND.contains(&name) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = Path::new("/").join(name);
        if ours.iter().any(|d| d.starts_with(&path)) {
            left_out.push(path);
            continue;
        }
        // nsd makes the payload's own HOME under /home: bind what is in it, not over it.
        let binds = if name == "home" {
            std::fs::read_dir(&path)
                .with_context(|| format!("list {}", path.display()))?
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        } else {
            vec![path]
        };
        for b in binds {
            text.push_str(&format!("bind -w {} {}\n", b.display(), b.display()));
        }
    }
    // The shell knows who it is for; HOME is the namespace's own (nsd makes it).
    for name in ["SHELL", "USER"] {
        if std::env::var_os(name).is_some() {
            text.push_str(&format!("env {name}\n"));
        }
    }
    Ok((text, left_out))
}

/// Every tool the operator's `/tool` lists (the operator sees them all).
fn every_tool(dirs: &Dirs) -> Result<Vec<String>> {
    crate::namespaces::block_on(async {
        let client = warren_9p::Client::connect_unix(dirs.socket("tool"))
            .await
            .with_context(|| crate::none_answers("toolfs", &dirs.socket("tool")))?;
        let root = client.attach("operator", "").await?;
        let fid = root.walk(&["tools"]).await?;
        fid.open(warren_9p::oflags::RDONLY).await?;
        let listing = fid.read_to_end(0).await?;
        Ok(String::from_utf8_lossy(&listing)
            .lines()
            .filter_map(|l| l.split('\t').next())
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect())
    })
}

/// `extra`: a spec file whose lines are added (e.g. `mount unix!/run/x.sock /n/x` for another
/// server); it goes through the same parser and nsd's checks as everything else.
pub fn sh(dirs: &Dirs, extra: Option<&Path>) -> Result<ExitCode> {
    let stdin = std::io::stdin();
    if !nix::unistd::isatty(&stdin).unwrap_or(false) {
        bail!("warren sh is the operator's interactive shell: run it on a terminal");
    }
    let tools = every_tool(dirs)?;
    let (mut text, left_out) = operator_spec(dirs, &tools)?;
    if let Some(path) = extra {
        text.push_str(
            &std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?,
        );
        text.push('\n');
    }
    // Plus the system directories every namespace gets (read-only), as `warren run` adds them.
    let spec = warren_ns::parse("<warren sh>", &text)
        .and_then(|own| warren_ns::spec_from_cli(Some(&own), &warren_ns::CliGrants::default()))
        .context("the operator namespace's spec")?;
    let shell = std::env::var("SHELL")
        .ok()
        .filter(|s| Path::new(s).is_absolute())
        .unwrap_or_else(|| "/bin/sh".into());
    eprintln!("warren sh: the operator's namespace.");
    eprintln!(
        "  /n/tool /n/gate /n/receipts /n/ns are the daemons' trees with YOUR authority: what you \
         start here holds operator authority (it can answer asks, read every receipt, list every \
         namespace)."
    );
    eprintln!(
        "  In /n/gate, ctl takes `allow once <fp>` and `deny`; `allow session`/`always` and rule \
         edits need `warren approvals` on its own terminal."
    );
    if !left_out.is_empty() {
        let names: Vec<String> = left_out.iter().map(|p| p.display().to_string()).collect();
        eprintln!(
            "  Not shown (they hold warren's own directories): {}",
            names.join(" ")
        );
    }
    let winsize = warren_jail::tty::get_winsize(stdin.as_fd()).unwrap_or_default();
    let opts = LaunchOptions {
        pty: Some(winsize),
        operator: true,
        ..LaunchOptions::default()
    };
    let (stdout, stderr) = (std::io::stdout(), std::io::stderr());
    let launched = launch(
        dirs,
        &spec,
        &[shell],
        &opts,
        [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
    )
    .context("start the operator's namespace")?;
    let master = launched
        .pty_master
        .as_ref()
        .context("nsd gave no terminal")?;
    // Window-size changes: SIGWINCH blocked here (before any thread, so every thread inherits
    // the mask) and taken by one thread that gives the pty the terminal's new size.
    let mut winch = nix::sys::signal::SigSet::empty();
    winch.add(nix::sys::signal::Signal::SIGWINCH);
    winch.thread_block()?;
    let resized = master.try_clone()?;
    std::thread::spawn(move || {
        while winch.wait().is_ok() {
            let _ = warren_ns::pty::sync_winsize(&resized);
        }
    });
    let code = {
        let _raw = warren_ns::pty::RawMode::enter()?;
        let _ = warren_ns::pty::sync_winsize(master);
        let output = warren_ns::pty::relay(master)?;
        let code = launched.wait();
        let _ = output.join();
        code
    };
    Ok(ExitCode::from(
        u8::try_from(code.context("the operator's shell")?).unwrap_or(255),
    ))
}
