//! `warren demo`: the main job on its embedded default — no config, no network, no setup.
//!
//! It starts the daemons in a fresh directory, runs a scripted agent in a namespace that holds
//! no authority of its own (three tools, no bind of the repository they work on), lets a scripted
//! operator answer the one ask through `/gate/pending/<id>/ctl` exactly as a person would (the
//! gate itself never answers an ask), and ends by exporting the session's receipts and verifying
//! them offline.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, bail};
use warren_daemon::Dirs;
use warren_daemon::identity::Role;

/// The agent: a shell script, run confined. Each step says what it tries and what it sees.
const AGENT: &str = r#"
say() { printf '\n\033[1magent:\033[0m %s\n' "$*"; }
call() { # call TOOL JSON: one open is one call
  exec 3<>"/tool/$1/call"; printf '%s' "$2" >&3; cat <&3; exec 3<&-; echo
}
say "1. what can I do? cat /tool/tools"
cat /tool/tools
say "2. call echo"
call echo '{"text":"hello from inside"}'
say "3. is there a shell tool? ls /tool/shell"
ls /tool/shell 2>&1 || true
say "4. can I see the repository myself? ls $REPO"
ls "$REPO" 2>&1 || true
say "5. read notes.md through fs_read (read tier: allowed)"
call fs_read "{\"path\":\"$REPO/notes.md\"}"
say "6. write summary.md through fs_write (write tier: the gate asks the operator; I wait)"
call fs_write "{\"path\":\"$REPO/summary.md\",\"content\":\"reviewed by the demo agent\\n\"}"
say "done"
"#;

fn step(msg: &str) {
    println!("\n\x1b[1mwarren demo:\x1b[0m {msg}");
}

pub fn demo() -> Result<ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "warren demo needs root in this version (it starts the daemons and builds a namespace)"
        );
    }
    for (what, ok) in [
        ("FUSE (/dev/fuse)", Path::new("/dev/fuse").exists()),
        ("Landlock", crate::doctor::landlock_abi().is_some()),
        (
            "user and mount namespaces",
            Path::new("/proc/self/ns/mnt").exists(),
        ),
    ] {
        if !ok {
            bail!("this kernel lacks {what}, which warren needs; `warren doctor` says more");
        }
    }
    let base = tempfile::Builder::new()
        .prefix("warren-demo-")
        .tempdir_in("/tmp")?;
    let dirs = Dirs::under(base.path());
    step(&format!(
        "starting the daemons under {}",
        base.path().display()
    ));
    crate::supervise::up(&dirs)?;
    let result = run_demo(&dirs, base.path());
    step("stopping the daemons");
    let _ = crate::supervise::down(&dirs);
    result
}

fn run_demo(dirs: &Dirs, base: &Path) -> Result<ExitCode> {
    // The repository the tools work on. The agent's own view never contains it.
    let repo = base.join("repo");
    std::fs::create_dir(&repo)?;
    std::fs::write(
        repo.join("notes.md"),
        "# notes\nwarren: authority is the namespace.\n",
    )?;
    let worker = Role::Worker.uid();
    for p in [&repo, &repo.join("notes.md")] {
        nix::unistd::chown(p.as_path(), Some(worker.into()), Some(worker.into()))?;
    }
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755))?;
    let repo_s = repo.to_str().context("repo path is not UTF-8")?;
    let spec_text = format!(
        "# the demo agent: three tools, and no authority of its own\n\
         mount tool /tool echo fs_read fs_write\n\
         tool fs_read -r {repo_s}\n\
         tool fs_write -w {repo_s}\n"
    );
    step("the agent's namespace spec (plus read-only /usr, /bin, /lib so a shell runs):");
    print!("{spec_text}");
    let base_spec = warren_ns::parse("demo.ns", &spec_text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let spec = warren_ns::spec_from_cli(Some(&base_spec), &warren_ns::CliGrants::default())
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    let bridge = crate::supervise::libexec_dir()?.join("warren-bridge");
    let served = Arc::new(warren_ns::ServedMounts::new(
        dirs.clone(),
        &spec,
        "demo",
        bridge,
    )?);
    let session = served.session().to_string();
    let opts = warren_ns::RunOptions {
        protected: dirs.clone(),
        mount_server: Some(served.clone()),
        ..warren_ns::RunOptions::default()
    };

    // The scripted operator: watches the gate's live event stream and answers each ask by
    // writing to its ctl file, as a person at `warren sh` would.
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let operator = {
        let dirs = dirs.clone();
        std::thread::spawn(move || scripted_operator(&dirs, stopped))
    };

    step(&format!("running the agent confined (session {session})"));
    let argv: Vec<String> = ["/bin/sh", "-c", AGENT]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut spec_env = spec.clone();
    spec_env.env.clear();
    let running = {
        // The agent learns where the repository is from its environment, not from a bind.
        // SAFETY: set before any other thread of ours reads the environment; the operator
        // thread only speaks 9P.
        unsafe { std::env::set_var("REPO", repo_s) };
        spec_env.env.push("REPO".into());
        warren_ns::spawn(&spec_env, &argv, &opts).context("build the agent's namespace")?
    };
    let status = running.wait().context("wait for the agent")?;
    let _ = stop.send(());
    let answered = operator
        .join()
        .map_err(|_| anyhow::anyhow!("operator thread panicked"))??;
    if status != 0 {
        bail!("the agent exited with status {status}");
    }
    let written = std::fs::read_to_string(repo.join("summary.md")).unwrap_or_default();
    step(&format!(
        "on the host, {repo_s}/summary.md now says: {:?} ({} ask answered by the operator)",
        written.trim(),
        answered
    ));

    step(&format!(
        "exporting the session's receipts (scope {session}) and verifying them offline"
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(checkpoint(dirs))?;
    let mut export = Vec::new();
    let n = rt.block_on(warren_receiptd::client::export(
        &dirs.socket("receipts"),
        &session,
        &mut export,
    ))?;
    let registry = rt.block_on(warren_receiptd::client::keys(&dirs.socket("receipts")))?;
    let outcome = warren_receiptd::verify(&export, &registry);
    println!("{n} receipts; warren verify: {}", outcome.message);
    if outcome.code != 0 {
        bail!("the receipt chain did not verify");
    }
    step(
        "done: the agent did only what it was granted, asked where the gate said so, and every decision and effect is a signed receipt",
    );
    Ok(ExitCode::SUCCESS)
}

async fn checkpoint(dirs: &Dirs) -> Result<()> {
    let client = warren_9p::Client::connect_unix(dirs.socket("receipts")).await?;
    let root = client.attach("demo", "").await?;
    let ctl = root.walk(&["ctl"]).await?;
    ctl.open(warren_9p::oflags::RDWR).await?;
    ctl.write_all(0, b"checkpoint").await?;
    Ok(())
}

/// Answers every ask with `allow once <fingerprint prefix>`, as the gate's live view shows them
/// (blocking reads of its `events` stream, never a poll), until `stop` fires; returns how many.
fn scripted_operator(dirs: &Dirs, stop: tokio::sync::oneshot::Receiver<()>) -> Result<usize> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = warren_9p::Client::connect_unix(dirs.socket("gate")).await?;
        let root = client.attach("operator", "").await?;
        let (shown_tx, mut shown_rx) = tokio::sync::mpsc::unbounded_channel();
        let view = warren_gate::approvals::approvals(
            &client,
            move |s| {
                let _ = shown_tx.send((s.id, s.request.clone()));
            },
            |_| true,
        );
        let answering = async {
            let mut answered = 0;
            while let Some((id, request)) = shown_rx.recv().await {
                let prefix = crate::approvals::fingerprint_prefix(&request).context("no fingerprint in the request")?;
                println!(
                    "\n\x1b[1moperator:\x1b[0m cat /gate/pending/{id}/request\n{}",
                    request.trim_end()
                );
                let verb = format!("allow once {prefix}");
                println!("\x1b[1moperator:\x1b[0m echo '{verb}' > /gate/pending/{id}/ctl");
                warren_gate::approvals::answer(&root, id, &verb).await.map_err(|e| anyhow::anyhow!(e))?;
                answered += 1;
                ANSWERED.store(answered, Ordering::SeqCst);
            }
            Ok::<usize, anyhow::Error>(answered)
        };
        tokio::select! {
            r = view => { r.context("the gate's event stream")?; Ok(ANSWERED.load(Ordering::SeqCst)) }
            r = answering => r,
            _ = stop => Ok(ANSWERED.load(Ordering::SeqCst)),
        }
    })
}

static ANSWERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
