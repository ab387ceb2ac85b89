//! The tools that run in a worker process (`fs_read`, `fs_list`, `fs_write`, `fs_edit`,
//! `shell`): their specs for toolfs's tree, and their implementations, which the worker binary
//! runs with only the tool's authority (its root fds). docs/tools.md says what each refuses.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Instant;

use serde_json::{Value, json};

mod atomic;
pub mod deny;
pub mod elision;
mod fs_edit;
mod fs_list;
pub mod fs_read;
mod fs_write;
mod resolve;
pub mod shell;
pub mod versions;

/// What toolfs serves for one tool: `tools` line, `<name>/doc`, `<name>/schema`.
pub struct ToolSpec {
    pub name: &'static str,
    /// read | write | exec | network | destructive
    pub tier: &'static str,
    pub description: &'static str,
    pub doc: &'static str,
    pub schema: Value,
}

/// The names the worker binary runs.
pub use warren_proto::worker::WORKER_TOOLS;

/// One root inside the worker: the path the tool sees and the directory fd it resolves from.
pub struct RootDir {
    pub path: String,
    pub fd: OwnedFd,
    pub writable: bool,
}

/// A tool's whole authority inside its worker.
pub struct ToolContext {
    pub roots: Vec<RootDir>,
    pub network: bool,
}

/// One call's result: `ok` false carries an error message naming the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub ok: bool,
    pub content: String,
}

impl ToolOutput {
    pub fn error(message: impl Into<String>) -> ToolOutput {
        ToolOutput {
            ok: false,
            content: message.into(),
        }
    }

    pub fn from_result(result: Result<String, String>) -> ToolOutput {
        match result {
            Ok(content) => ToolOutput { ok: true, content },
            Err(content) => ToolOutput { ok: false, content },
        }
    }
}

/// What one call knows beyond its arguments.
pub struct CallScope<'a> {
    /// When the call must have ended.
    pub deadline: Instant,
    /// The worker's socket to toolfs: its hangup means nobody waits for this call any more.
    pub caller: BorrowedFd<'a>,
    /// Hears of a process group the call creates (shell), so toolfs can kill it if the worker
    /// stops answering.
    pub on_started: &'a mut dyn FnMut(i32),
}

/// Runs one call of `tool` on its canonical JSON arguments.
pub fn run(tool: &str, ctx: &ToolContext, args: &str, scope: &mut CallScope<'_>) -> ToolOutput {
    match tool {
        "fs_read" => fs_read::run(ctx, args),
        "fs_list" => fs_list::run(ctx, args),
        "fs_write" => fs_write::run(ctx, args),
        "fs_edit" => fs_edit::run(ctx, args),
        "shell" => shell::run(ctx, args, scope),
        other => ToolOutput::error(format!("no tool named {other:?} runs in a worker")),
    }
}

/// The paragraph on paths every file tool's doc ends with.
macro_rules! path_doc {
    () => {
        "
Paths are read in fs_list's escaped form: \\\\ is a backslash, \\u{XXXX} a code point, \\x{HH} a
byte; any other backslash is an error. Absolute paths pick the root whose path is their longest
prefix; relative paths are relative to the first root. `..` and symlinks never leave a root (openat2 RESOLVE_IN_ROOT); a
final symlink is refused; only regular files and directories are touched. Names matching the
deny-list (*.key, *.pem, .env*, id_*, *.db*, *.sqlite*) are refused.
"
    };
}

/// The specs of the worker tools. (`echo` runs inside toolfs, which serves its spec itself.)
pub fn tool_specs() -> Vec<ToolSpec> {
    let path = json!({"type": "string", "minLength": 1, "maxLength": 4096});
    vec![
        ToolSpec {
            name: "fs_read",
            tier: "read",
            description: "reads a text file (at most 1 MiB a call; offset/length to page)",
            doc: FS_READ_DOC,
            schema: object(
                json!({
                    "path": path,
                    "offset": {"type": "integer", "minimum": 0, "maximum": 9007199254740991u64},
                    "length": {"type": "integer", "minimum": 1, "maximum": fs_read::MAX_READ},
                }),
                &["path"],
            ),
        },
        ToolSpec {
            name: "fs_list",
            tier: "read",
            description: "lists a directory: name, type and size of each entry",
            doc: FS_LIST_DOC,
            schema: object(json!({"path": path}), &["path"]),
        },
        ToolSpec {
            name: "fs_write",
            tier: "write",
            description: "writes a whole file atomically, keeping owner, mode and the last 5 versions",
            doc: FS_WRITE_DOC,
            schema: object(
                json!({
                    "path": path,
                    "content": {"type": "string"},
                    "create_dirs": {"type": "boolean", "default": false},
                }),
                &["path", "content"],
            ),
        },
        ToolSpec {
            name: "fs_edit",
            tier: "write",
            description: "replaces the one exact occurrence of a string in a file",
            doc: FS_EDIT_DOC,
            schema: object(
                json!({
                    "path": path,
                    "old": {"type": "string", "minLength": 1},
                    "new": {"type": "string"},
                }),
                &["path", "old", "new"],
            ),
        },
        ToolSpec {
            name: "shell",
            tier: "exec",
            description: "runs a /bin/sh command (timeout default 120 s, at most 600 s; output capped at 1 MiB)",
            doc: SHELL_DOC,
            schema: object(
                json!({
                    "command": {"type": "string", "minLength": 1},
                    "timeout_s": {"type": "integer", "minimum": 1, "maximum": shell::MAX_TIMEOUT_S, "default": shell::DEFAULT_TIMEOUT_S},
                    "cwd": path,
                }),
                &["command"],
            ),
        },
    ]
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

const FS_READ_DOC: &str = concat!(
    "\
fs_read {path, offset?, length?} — returns the UTF-8 text of a regular file from byte `offset`
(default 0), at most `length` bytes and never more than 1 MiB a call. A shortened read ends with
a line `[fs_read: truncated: bytes A..B of N; call again with offset B]`. Non-UTF-8 files are
refused.",
    path_doc!()
);

const FS_LIST_DOC: &str = concat!(
    "\
fs_list {path} — one line per entry: name<TAB>type<TAB>size, sorted by name; type is file, dir,
symlink, fifo, socket, chardev or blockdev (symlinks are not followed). At most 10000 entries.
Names are escaped: a control, format (bidi), invisible, private-use or unassigned code point is
written \\u{XXXX}, a byte that is not UTF-8 \\x{HH}, a backslash \\\\; so no name spans two lines
or columns, and every file tool takes a name back exactly as listed.",
    path_doc!()
);

const FS_WRITE_DOC: &str = concat!(
    "\
fs_write {path, content, create_dirs?} — replaces the file with `content` atomically (a temp file
beside it, fsync, rename): readers see the old or the new file, never part of one. An existing
file keeps its owner and permission bits; its old content joins a ring of the last 5 versions
under <root>/.warren-versions/. `create_dirs` (default false) creates missing parent
directories. Content with an elision marker line (`// ...`, `# ... rest unchanged`, …) that the
file did not already have is refused: write the whole file. It writes as the owner of the
directory it was granted (uid and gid): a new file belongs to that user, and it can write wherever
that user can. Never as root: in a directory root owns it writes as warren's worker uid, so only
where the directory's mode lets that uid in (making it so is the operator's explicit choice).",
    path_doc!()
);

const FS_EDIT_DOC: &str = concat!(
    "\
fs_edit {path, old, new} — replaces the single occurrence of `old` with `new`; refused when `old`
occurs 0 times or more than once (the count is named). Same atomic write, owner/mode and version
ring as fs_write; a `new` with an elision marker line new to the file is refused.",
    path_doc!()
);

const SHELL_DOC: &str = "\
shell {command, timeout_s?, cwd?} — runs `/bin/sh -c command` in a new process group, as the
worker's unprivileged uid, stdin /dev/null, environment reduced to PATH, HOME, LANG, LC_ALL,
TERM, TMPDIR, USER. `cwd` (default: the first root) must be a directory in a root, named as
the file tools name paths (fs_list's escaped form).
The result is stdout and stderr interleaved, capped at 1 MiB (the first and last 512 KiB kept,
with a marker), then `[exit status N]`. At `timeout_s` (default 120, at most 600) the command's
whole process group is killed and the result says so; the group is killed at the end of every
call, so background jobs do not outlive it.
Limits per command (lowered to the calling namespace's `limit pids= mem= cpu=` where those are
lower): at most 256 processes at once (counted with every other command of the namespace's
subtree: they share one uid), 8 GiB of address space and 600 s of CPU time per process, and
64 MiB of output, past which the command is killed and the result says so. A fork or an
allocation past a limit fails inside the command (EAGAIN, ENOMEM); CPU past it is SIGKILL.
It runs in the worker's own namespaces: its roots, /usr, /bin, /lib, a /tmp and home; only lo.
";
