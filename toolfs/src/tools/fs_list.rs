//! `fs_list {path}`: a directory's entries, one a line: `name<TAB>type<TAB>size`, sorted by name.
//! Entries are stat'ed without following symlinks, so a symlink is listed as one. Names are
//! written in the escaping rule's form (`warren_daemon::escape`: a control, bidi or invisible
//! code point as `\u{XXXX}`, a byte that is not UTF-8 as `\x{HH}`, `\` as `\\`), so a name can
//! neither forge a line or a column nor hide, and every file tool takes the name back as it is
//! listed.

use std::os::fd::AsFd;

use nix::dir::Dir;
use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;
use serde::Deserialize;
use warren_daemon::escape::escape_bytes;

use super::resolve::{Target, describe, type_name};
use super::{ToolContext, ToolOutput};

/// The most entries one listing shows; a larger directory says so.
pub const MAX_ENTRIES: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    path: String,
}

pub fn run(ctx: &ToolContext, args: &str) -> ToolOutput {
    let args: Result<Args, String> =
        serde_json::from_str(args).map_err(|e| format!("fs_list: bad arguments: {e}"));
    ToolOutput::from_result(args.and_then(|a| list(ctx, &a)))
}

fn list(ctx: &ToolContext, args: &Args) -> Result<String, String> {
    let target = Target::new(ctx, &args.path)?;
    let mut dir = Dir::from_fd(target.open_directory()?).map_err(|e| describe(e, &target.shown))?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|e| describe(e, &target.shown))?;
        let name = entry.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            names.push(name);
        }
    }
    names.sort();
    let total = names.len();
    let mut out = String::new();
    for name in names.iter().take(MAX_ENTRIES) {
        let shown = escape_bytes(name.to_bytes());
        match fstatat(dir.as_fd(), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => out.push_str(&format!("{shown}\t{}\t{}\n", type_name(&st), st.st_size)),
            // Removed between readdir and stat.
            Err(_) => out.push_str(&format!("{shown}\tgone\t0\n")),
        }
    }
    if total > MAX_ENTRIES {
        out.push_str(&format!(
            "[fs_list: {total} entries; the first {MAX_ENTRIES} shown]\n"
        ));
    }
    Ok(out)
}
