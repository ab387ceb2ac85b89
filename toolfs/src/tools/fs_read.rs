//! `fs_read {path, offset?, length?}`: a regular file's text, at most [`MAX_READ`] bytes a call.

use std::os::unix::fs::FileExt;

use serde::Deserialize;

use super::resolve::Target;
use super::{ToolContext, ToolOutput};

/// The most one call returns; a longer read says it was truncated and where to go on.
pub const MAX_READ: u64 = 1 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    path: String,
    #[serde(default)]
    offset: u64,
    length: Option<u64>,
}

pub fn run(ctx: &ToolContext, args: &str) -> ToolOutput {
    ToolOutput::from_result(parse(args).and_then(|a| read(ctx, &a)))
}

fn parse(args: &str) -> Result<Args, String> {
    serde_json::from_str(args).map_err(|e| format!("fs_read: bad arguments: {e}"))
}

fn read(ctx: &ToolContext, args: &Args) -> Result<String, String> {
    let target = Target::new(ctx, &args.path)?;
    let (file, st) = target.open_regular()?;
    let size = st.st_size as u64;
    let want = args.length.unwrap_or(MAX_READ).min(MAX_READ);
    let mut bytes = vec![0u8; want as usize];
    let mut got = 0usize;
    while got < bytes.len() {
        match file.read_at(&mut bytes[got..], args.offset.saturating_add(got as u64)) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{}: {e}", target.shown)),
        }
    }
    bytes.truncate(got);
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        // A read that stops inside a multi-byte character keeps the whole characters before it.
        Err(e) if e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).expect("prefix checked valid")
        }
        Err(e) => {
            return Err(format!(
                "{}: not UTF-8 text (invalid byte at offset {}); fs_read returns text only",
                target.shown,
                args.offset
                    .saturating_add(e.utf8_error().valid_up_to() as u64)
            ));
        }
    };
    let end = args.offset.saturating_add(text.len() as u64);
    let mut content = text;
    let requested_end = args
        .length
        .map_or(size, |l| args.offset.saturating_add(l))
        .min(size);
    if end < requested_end {
        content.push_str(&format!(
            "\n[fs_read: truncated: bytes {}..{end} of {size}; call again with offset {end}]",
            args.offset
        ));
    }
    Ok(content)
}
