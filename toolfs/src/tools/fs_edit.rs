//! `fs_edit {path, old, new}`: replaces the one occurrence of `old` with `new`. An absent match
//! and an ambiguous one (more than one occurrence) are refused, naming the count; the write goes
//! through the same atomic path as `fs_write`.

use serde::Deserialize;

use super::atomic::replace_file;
use super::fs_write::summary;
use super::resolve::Target;
use super::{ToolContext, ToolOutput};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    path: String,
    old: String,
    new: String,
}

pub fn run(ctx: &ToolContext, args: &str) -> ToolOutput {
    let args: Result<Args, String> =
        serde_json::from_str(args).map_err(|e| format!("fs_edit: bad arguments: {e}"));
    ToolOutput::from_result(args.and_then(|a| edit(ctx, &a)))
}

fn edit(ctx: &ToolContext, args: &Args) -> Result<String, String> {
    let target = Target::new(ctx, &args.path)?;
    if args.old.is_empty() {
        return Err("fs_edit: `old` is empty; say which text to replace".into());
    }
    let shown = target.shown.clone();
    let done = replace_file(&target, false, |current| {
        let Some(bytes) = current else {
            return Err(format!(
                "{shown}: no such file (fs_edit edits existing files; use fs_write to create one)"
            ));
        };
        let text = std::str::from_utf8(bytes).map_err(|e| {
            format!(
                "refused: {shown}: not UTF-8 text (invalid byte at offset {})",
                e.valid_up_to()
            )
        })?;
        match text.matches(args.old.as_str()).count() {
            0 => Err(format!(
                "refused: {shown}: `old` was not found in the file (0 occurrences)"
            )),
            1 => Ok((
                text.replacen(args.old.as_str(), &args.new, 1).into_bytes(),
                args.new.clone(),
            )),
            n => Err(format!(
                "refused: {shown}: `old` occurs {n} times; it must occur exactly once (include more context)"
            )),
        }
    })?;
    Ok(summary(&done))
}
