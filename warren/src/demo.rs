//! `warren demo`: the main job on its embedded default — no config, no network, no setup.
//!
//! It starts the daemons in a fresh directory, then plays two acts. Act 1: a scripted agent (a
//! shell script) in a namespace that holds no authority of its own (three tools, no bind of the
//! repository they work on); a scripted operator answers the one ask through
//! `/gate/pending/<id>/ctl` exactly as a person would (the gate itself never answers an ask).
//! Act 2 (`agent_act`): warren's own agent, on `warren agent`'s code path, with its model served
//! as files by llmfs — a scripted compromised model unless `WARREN_LLM_URL` names a real one.
//! Each act ends by exporting its session's receipts and verifying them offline.

mod agent_act;

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, bail};
use warren_daemon::Dirs;
use warren_daemon::identity::Role;

/// The agent: a shell script, run confined. Each step says what it tries and what it sees.
const AGENT: &str = r#"
# Bold only on a terminal: a file or a pipe gets the words alone.
if [ -t 1 ]; then b='\033[1m' e='\033[0m'; else b='' e=''; fi
say() { printf "\n${b}agent:${e} %s\n" "$*"; }
show() { # print stdin with the shell alone (the namespace holds no cat)
  while IFS= read -r line || [ -n "$line" ]; do printf '%s\n' "$line"; done
}
call() { # call TOOL JSON: one open is one call; the reply is read on the same fd
  exec 3<>"/tool/$1/call"; printf '%s' "$2" >&3; show <&3; exec 3<&-
}
say "1. what can I do? cat /tool/tools"
show < /tool/tools
say "2. call echo"
call echo '{"text":"hello from inside"}'
say "3. is there a shell tool? open /tool/shell/call"
( : < /tool/shell/call ) 2>&1 || true
say "4. can I see the repository myself? open $REPO/notes.md"
( : < "$REPO/notes.md" ) 2>&1 || true
say "5. can I see the host's programs? open /usr/bin/env"
( : < /usr/bin/env ) 2>&1 || true
say "6. read notes.md through fs_read (read tier: allowed)"
call fs_read "{\"path\":\"$REPO/notes.md\"}"
say "7. write summary.md through fs_write (write tier: the gate asks the operator; I wait)"
call fs_write "{\"path\":\"$REPO/summary.md\",\"content\":\"reviewed by the demo agent\\n\"}"
say "done"
"#;

/// Read-only binds of `/bin/sh` and exactly the shared objects it loads (as `ldd` lists them),
/// each file on its own: the agent gets a shell and nothing else of the host's programs.
fn shell_binds() -> Result<String> {
    let shell = std::fs::canonicalize("/bin/sh").context("/bin/sh")?;
    let out = std::process::Command::new("ldd")
        .arg(&shell)
        .output()
        .context("run ldd (libc-bin) to list the shell's libraries")?;
    if !out.status.success() {
        bail!(
            "ldd {}: {}",
            shell.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut lines = vec![format!("bind -r {} /bin/sh", shell.display())];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // `libc.so.6 => /lib/…/libc.so.6 (0x…)` or `/lib64/ld-linux-x86-64.so.2 (0x…)`.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            continue; // the vDSO: no file
        };
        let source = std::fs::canonicalize(path).with_context(|| format!("library {path}"))?;
        lines.push(format!("bind -r {} {path}", source.display()));
    }
    Ok(lines.join("\n") + "\n")
}

/// `who:` in bold on a terminal; a file or a pipe gets the words alone.
fn speaker(who: &str) -> String {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        format!("\x1b[1m{who}:\x1b[0m")
    } else {
        format!("{who}:")
    }
}

fn step(msg: &str) {
    println!("\n{} {msg}", speaker("warren demo"));
}

pub fn demo() -> Result<ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "warren demo needs root in this version (it starts the daemons and builds a namespace)"
        );
    }
    for (what, ok) in [
        ("FUSE (/dev/fuse)", Path::new("/dev/fuse").exists()),
        (
            "Landlock",
            warren_jail::kernel_features::landlock_abi().is_some(),
        ),
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
    // The model first: llmfs, started with the daemons, is told its address.
    let act2 = agent_act::AgentAct::new(base.path());
    let model = act2.start_model()?;
    let env = model.env(base.path());
    let env: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    step(&format!(
        "starting the daemons under {}",
        base.path().display()
    ));
    match warren_supervisor::bring_up_with_env(&dirs, &env)? {
        warren_supervisor::Up::Started(pid) => println!("warren is up: supervisor pid {pid}"),
        warren_supervisor::Up::Already(_) => {
            bail!("{} has daemons up already", base.path().display())
        }
    }
    let result = run_demo(&dirs, base.path()).and_then(|_| act2.run(&dirs, &model));
    step("stopping the daemons");
    let _ = warren_supervisor::down_with(&dirs, true, crate::down::settle_namespaces);
    drop(model);
    result.map(|()| ExitCode::SUCCESS)
}

fn run_demo(dirs: &Dirs, base: &Path) -> Result<()> {
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
        "# the demo agent: three tools, a shell, and no authority of its own\n\
         mount tool /tool echo fs_read fs_write\n\
         tool fs_read -r {repo_s}\n\
         tool fs_write -w {repo_s}\n\
         {}",
        shell_binds()?
    );
    step(
        "act 1: a shell script as the agent; its namespace spec (no /usr, no writable bind; the shell and its libraries file by file):",
    );
    print!("{spec_text}");
    let spec = warren_ns::parse("demo.ns", &spec_text).map_err(|e| anyhow::anyhow!("{e}"))?;

    // The agent learns where the repository is from its environment (the spec's `env REPO`),
    // never from a bind.
    // Set before this process starts any thread (the operator's comes next).
    warren_jail::environment::set_var_single_threaded("REPO", repo_s)?;
    let mut spec = spec;
    spec.env.push("REPO".into());

    // The scripted operator: watches the gate's live event stream and answers each ask by
    // writing to its ctl file, as a person at `warren sh` would.
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let operator = {
        let dirs = dirs.clone();
        std::thread::spawn(move || scripted_operator(&dirs, stopped))
    };

    let argv: Vec<String> = ["/bin/sh", "-c", AGENT]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // nsd builds the namespace, as for `warren run`; this process only asks.
    step("asking nsd to build the agent's namespace and run it confined");
    let launched = warren_ns::launch::client::launch(
        dirs,
        &spec,
        &argv,
        &warren_ns::launch::client::LaunchOptions::default(),
        [
            std::io::stdin().as_fd(),
            std::io::stdout().as_fd(),
            std::io::stderr().as_fd(),
        ],
    )
    .context("nsd: build the agent's namespace")?;
    let session = launched.session.clone();
    let status = launched.wait().context("wait for the agent")?;
    let _ = stop.send(());
    let answered = operator
        .join()
        .map_err(|_| anyhow::anyhow!("operator thread panicked"))??;
    if status != 0 {
        bail!("the agent exited with status {status}");
    }
    let written = std::fs::read_to_string(repo.join("summary.md")).unwrap_or_default();
    if answered == 0 || written.is_empty() {
        bail!(
            "the agent's write did not happen: the demo expected one ask, answered by the operator"
        );
    }
    step(&format!(
        "on the host, {repo_s}/summary.md now says: {:?} ({} ask answered by the operator)",
        written.trim(),
        answered
    ));

    step(&format!(
        "exporting the receipts of namespace {}'s session (scope {session}) and verifying them offline",
        launched.id
    ));
    verify_session(dirs, &session, 0)?;
    step(
        "act 1 done: the agent did only what it was granted, asked where the gate said so, and every decision and effect is a signed receipt",
    );
    Ok(())
}

/// Exports `session`'s receipts and verifies them offline, once its record is whole: every
/// allowed call's effect receipt and `model_calls` model-call receipts (llmfs's `query`) in.
/// Prints what the export holds.
fn verify_session(dirs: &Dirs, session: &str, model_calls: usize) -> Result<()> {
    let socket = dirs.socket("receipts");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let is_model_call = |e: &crate::log::Entry| e.kind == "query" && e.body["appender"] == "llmfs";
    // Effect and model-call receipts are queued off the call's path: the last may still be on
    // its way. Every allowed call ran, so each allowing decision must get its effect.
    let (pending, queries) = rt.block_on(async {
        let (mut pending, mut queries) = (0, 0);
        for _ in 0..500 {
            pending = crate::log::effects_pending(&socket, session).await?;
            queries = crate::log::entries(&socket, session)
                .await?
                .iter()
                .filter(|e| is_model_call(e))
                .count();
            if pending == 0 && queries >= model_calls {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        anyhow::Ok((pending, queries))
    })?;
    if pending > 0 {
        bail!("{pending} allowed call(s) of the session have no effect receipt after 5 s");
    }
    if queries < model_calls {
        bail!("{model_calls} model calls, {queries} receipted by llmfs after 5 s");
    }
    let mut export = Vec::new();
    let (_, n) = rt.block_on(warren_receiptd::client::export(
        &socket,
        session,
        &mut export,
    ))?;
    let registry = rt.block_on(warren_receiptd::client::keys(&socket))?;
    // The export's entries (its last line is the checkpoint), decoded to say what they are.
    let entries: Vec<crate::log::Entry> = export
        .split(|&b| b == b'\n')
        .filter_map(|l| crate::log::Entry::parse(l).ok())
        .collect();
    let count = |f: &dyn Fn(&crate::log::Entry) -> bool| entries.iter().filter(|e| f(e)).count();
    if model_calls > 0 {
        println!(
            "{} model calls (receipted by llmfs, each admitted by one of {} gate decisions on `llm`), {} gate decisions on tool calls ({} of them the operator's answers), {} tool runs (receipted by toolfs)",
            count(&|e| is_model_call(e)),
            count(&|e| e.kind == "decision" && e.subject()["tool"] == "llm"),
            count(&|e| e.kind == "decision" && e.subject()["tool"] != "llm"),
            count(&|e| e.kind == "decision" && !e.subject()["answered_by"].is_null()),
            count(&|e| e.body["appender"] == "toolfs" && e.kind != "withdrawn"),
        );
    }
    let outcome = warren_receiptd::verify(&export, &registry);
    println!("{n} receipts; warren verify: {}", outcome.message);
    if outcome.code != 0 {
        bail!("the receipt chain did not verify");
    }
    Ok(())
}

/// Answers every ask with `allow once <fingerprint prefix>`, as the gate's live view shows them
/// (blocking reads of its `events` stream, never a poll), until `stop` fires; returns how many.
fn scripted_operator(dirs: &Dirs, stop: tokio::sync::oneshot::Receiver<()>) -> Result<usize> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Counted as they happen: a stop while an answer is under way still reports the earlier ones.
    let answered = AtomicUsize::new(0);
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
            while let Some((id, request)) = shown_rx.recv().await {
                let prefix = crate::approvals::fingerprint_prefix(&request).context("no fingerprint in the request")?;
                println!(
                    "\n{} cat /gate/pending/{id}/request\n{}",
                    speaker("operator"),
                    request.trim_end()
                );
                let verb = format!("allow once {prefix}");
                println!("{} echo '{verb}' > /gate/pending/{id}/ctl", speaker("operator"));
                warren_gate::approvals::answer(&root, id, &verb).await.map_err(|e| anyhow::anyhow!(e))?;
                answered.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<usize, anyhow::Error>(answered.load(Ordering::SeqCst))
        };
        tokio::select! {
            r = view => { r.context("the gate's event stream")?; Ok(answered.load(Ordering::SeqCst)) }
            r = answering => r,
            _ = stop => Ok(answered.load(Ordering::SeqCst)),
        }
    })
}
