//! `warren agent`: warren's own agent (`warren-agentd`) on a task, in a namespace nsd builds
//! exactly as for `warren run` (the same flags and code path), with the model mounted at
//! `/mnt/llm` (`mount llm`) and the agent's binary bound read-only. The agent holds nothing
//! else: its tools are the spec's, its asks are answered here (`--asks`), its model calls and
//! tool calls are receipted in the namespace's session. Progress on stderr, the final answer on
//! stdout; the exit status is the agent's (0 finished, 1 a budget spent, 3 the model failed,
//! 125 warren could not set the namespace up).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use warren_daemon::Dirs;
use warren_ns::cli::RunArgs;

use crate::asks::AsksMode;

/// Where the agent's binary is in the namespace.
pub const AGENTD_PATH: &str = "/warren/bin/warren-agentd";
/// Where the transcript file is bound in the namespace (with `--transcript`).
const TRANSCRIPT_PATH: &str = "/warren/transcript.jsonl";
/// Where the operator's spec is bound in the namespace, for the agent to tell its model.
const GRANT_PATH: &str = "/warren/grant.ns";

#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    /// A namespace spec file: what the agent may do (its tools and their roots).
    #[arg(long = "ns")]
    pub ns: Option<PathBuf>,
    /// Grant a tool: it appears under /tool (repeat for more).
    #[arg(long = "tool")]
    pub tools: Vec<String>,
    /// Mount the operator's MCP server NAME at /mnt/mcp/NAME (`NAME[:TOOL,…]`).
    #[arg(long = "mcp", value_name = "NAME[:TOOL,…]")]
    pub mcp: Vec<String>,
    /// Bind a host path read-only at the same path.
    #[arg(long = "ro")]
    pub ro: Vec<String>,
    /// Bind a host path read-write at the same path.
    #[arg(long = "rw")]
    pub rw: Vec<String>,
    /// The model's name (default: llmfs's, `WARREN_LLM_MODEL` of `warren up`).
    #[arg(long)]
    pub model: Option<String>,
    /// Turns (model asks) at most.
    #[arg(long, default_value_t = 20)]
    pub max_turns: u32,
    /// Tokens at most, summed over the turns.
    #[arg(long, default_value_t = 200_000)]
    pub max_tokens: u64,
    /// Seconds at most.
    #[arg(long, default_value_t = 600)]
    pub max_seconds: u64,
    /// Write the agent's transcript (JSON lines) to this host file (created or emptied).
    #[arg(long)]
    pub transcript: Option<PathBuf>,
    /// A host file given to the model as context, as untrusted data (bound read-only at the same
    /// path unless the spec already shows it there).
    #[arg(long)]
    pub context: Vec<String>,
    /// Accept a Landlock ruleset that is not fully enforced. Weaker confinement.
    #[arg(long = "weaker-landlock")]
    pub weaker_landlock: bool,
    /// The task.
    pub task: String,
}

impl AgentArgs {
    /// The agent's command line in the namespace.
    fn command(&self) -> Vec<String> {
        let mut cmd = vec![
            AGENTD_PATH.to_owned(),
            "--max-turns".into(),
            self.max_turns.to_string(),
            "--max-tokens".into(),
            self.max_tokens.to_string(),
            "--max-seconds".into(),
            self.max_seconds.to_string(),
            "--grant".into(),
            GRANT_PATH.into(),
        ];
        if let Some(m) = &self.model {
            cmd.extend(["--model".into(), m.clone()]);
        }
        if self.transcript.is_some() {
            cmd.extend(["--transcript".into(), TRANSCRIPT_PATH.into()]);
        }
        for c in &self.context {
            cmd.extend(["--context".into(), c.clone()]);
        }
        cmd.extend(["--".into(), self.task.clone()]);
        cmd
    }

    fn run_args(&self) -> RunArgs {
        RunArgs {
            ns: self.ns.clone(),
            tools: self.tools.clone(),
            mcp: self.mcp.clone(),
            imports: Vec::new(),
            net_proxy: Vec::new(),
            ro: self.ro.clone(),
            rw: self.rw.clone(),
            net: None,
            bare: false,
            weaker_landlock: self.weaker_landlock,
            uid: None,
            profile: None,
            cwd: None,
            print_spec: false,
            command: self.command(),
        }
    }
}

/// The spec the agent runs in: the operator's, plus the model (unless it mounts one already),
/// the agent's binary, the operator's spec as a file (`grant`), the transcript file and the
/// context files the spec does not show already.
fn agent_spec(
    run: &RunArgs,
    context: &[String],
    agentd: &Path,
    grant: &Path,
    transcript: Option<&Path>,
) -> Result<warren_ns::Spec, String> {
    let base = run.spec()?;
    let mut text = base.to_text();
    let has_llm = base.mounts.iter().any(|m| {
        m.server == warren_ns::spec::Server::Local(warren_ns::spec::LocalServer::Llm)
            && m.path == "/mnt/llm"
    });
    if !has_llm {
        text.push_str("mount llm /mnt/llm\n");
    }
    let quote = |p: &Path| warren_ns::spec::quote(&p.to_string_lossy());
    text.push_str(&format!("bind -r {} {AGENTD_PATH}\n", quote(agentd)));
    text.push_str(&format!("bind -r {} {GRANT_PATH}\n", quote(grant)));
    if let Some(t) = transcript {
        text.push_str(&format!("bind -w {} {TRANSCRIPT_PATH}\n", quote(t)));
    }
    for c in context {
        let shown = base
            .binds
            .iter()
            .any(|b| Path::new(c).starts_with(&b.path) && b.host == b.path);
        if !shown {
            text.push_str(&format!("bind -r {0} {0}\n", quote(Path::new(c))));
        }
    }
    warren_ns::spec::parse("<warren agent>", &text).map_err(|e| e.to_string())
}

pub fn agent(dirs: &Dirs, args: &AgentArgs, asks: AsksMode) -> Result<ExitCode> {
    agent_then(dirs, args, asks, |_| {})
}

/// [`agent`], telling `started` of the namespace once the agent runs (`warren demo` exports its
/// session's receipts afterwards).
pub fn agent_then(
    dirs: &Dirs,
    args: &AgentArgs,
    asks: AsksMode,
    started: impl FnOnce(&warren_ns::launch::client::Launched),
) -> Result<ExitCode> {
    let agentd = warren_supervisor::libexec_dir()?.join("warren-agentd");
    if !agentd.is_file() {
        eprintln!(
            "warren agent: {} is missing (build warren-agentd)",
            agentd.display()
        );
        return Ok(ExitCode::from(125));
    }
    // Refused now, before anything runs, if anything but a file of the operator's is there.
    let transcript = match &args.transcript {
        Some(t) => Some(Transcript::prepare(t)?),
        None => None,
    };
    let run = args.run_args();
    // The operator's spec, for the agent to tell its model (readable by the agent's uid).
    let operator_spec = match run.spec() {
        Ok(s) => s.to_text(),
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(2));
        }
    };
    let grant = tempfile::Builder::new()
        .prefix("warren-agent-grant")
        .tempfile_in(std::env::temp_dir())?;
    std::fs::write(grant.path(), operator_spec)?;
    std::fs::set_permissions(grant.path(), std::fs::Permissions::from_mode(0o644))?;
    let spec = match agent_spec(
        &run,
        &args.context,
        &agentd,
        grant.path(),
        transcript.as_ref().map(|t| t.bound.as_path()),
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(2));
        }
    };
    let status = crate::run::run_spec(dirs, &spec, &run, asks, |launched| {
        eprintln!(
            "warren agent: namespace {} (session {}): {}",
            launched.id,
            launched.session,
            warren_daemon::escape::escape(&args.task)
        );
        started(launched);
    });
    if let Some(t) = transcript {
        t.finish()?;
    }
    status
}

/// `--transcript FILE`. The agent runs as a uid of its own and appends to a file warren made
/// in a directory of its own (mkdtemp: 0700, root's), which is what the spec binds: nothing the
/// agent or anyone else can reach by name, so no symlink or swap in the operator's directory
/// can redirect the bind. The operator's FILE is opened at the start by
/// [`warren_daemon::dirs::create_operator_file`] (refused if anything but a file of the
/// operator's is there) and gets the transcript when the run ends; it is never opened to others.
struct Transcript {
    operator: std::fs::File,
    operator_path: PathBuf,
    /// The file the agent writes (0622: it may append, not read back), its name (what nsd
    /// binds) and its directory; `finish` reads it through `written`, never by name again.
    written: std::fs::File,
    bound: PathBuf,
    _private: tempfile::TempDir,
}

impl Transcript {
    fn prepare(path: &Path) -> Result<Transcript> {
        let operator = warren_daemon::dirs::create_operator_file(path, 0o600)?;
        let private = tempfile::Builder::new()
            .prefix("warren-agent-transcript")
            .tempdir_in(std::env::temp_dir())?;
        let bound = private.path().join("transcript.jsonl");
        let written = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&bound)
            .with_context(|| format!("create {}", bound.display()))?;
        // Set by the fd, past the umask.
        written.set_permissions(std::fs::Permissions::from_mode(0o622))?;
        Ok(Transcript {
            operator,
            operator_path: path.to_owned(),
            written,
            bound,
            _private: private,
        })
    }

    /// Copies what the agent wrote into the operator's file (through the fd opened at the start).
    fn finish(mut self) -> Result<()> {
        use std::io::Seek;
        self.written.rewind()?;
        std::io::copy(&mut self.written, &mut self.operator)
            .with_context(|| format!("write {}", self.operator_path.display()))?;
        Ok(())
    }
}
