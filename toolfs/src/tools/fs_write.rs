//! `fs_write {path, content, create_dirs?}`: replaces (or creates) a file atomically, keeping the
//! old owner and mode and the old content in the version ring (see `atomic` and `versions`).

use serde::Deserialize;

use super::atomic::{Replaced, replace_file};
use super::resolve::Target;
use super::{ToolContext, ToolOutput};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    path: String,
    content: String,
    #[serde(default)]
    create_dirs: bool,
}

pub fn run(ctx: &ToolContext, args: &str) -> ToolOutput {
    let args: Result<Args, String> =
        serde_json::from_str(args).map_err(|e| format!("fs_write: bad arguments: {e}"));
    ToolOutput::from_result(args.and_then(|a| write(ctx, a)))
}

fn write(ctx: &ToolContext, args: Args) -> Result<String, String> {
    let target = Target::new(ctx, &args.path)?;
    let content = args.content;
    let done = replace_file(&target, args.create_dirs, |_old| {
        Ok((content.clone().into_bytes(), content.clone()))
    })?;
    Ok(summary(&done))
}

/// The result line both writing tools give: the path the file was written at, as resolved.
pub fn summary(done: &Replaced) -> String {
    let verb = if done.created { "created" } else { "replaced" };
    format!("{verb} {} ({} bytes)", done.path, done.bytes)
}
