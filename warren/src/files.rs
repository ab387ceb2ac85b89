//! `warren ls|cat|write|call`: a plain 9P client on the operator sockets. What a file holds goes
//! out byte for byte to a pipe or a file (a program's input); on a terminal it is shown with every
//! control, bidi and invisible code point escaped (`warren_daemon::escape`), since a file may hold
//! what a namespace wrote.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use warren_9p::{Client, Fid, oflags};
use warren_daemon::Dirs;
use warren_daemon::escape::{escape, escaped_lines};

/// `data` as it goes to stdout: exact for a program, escaped (lines kept) for a person.
fn for_stdout(data: &[u8], terminal: bool) -> std::borrow::Cow<'_, [u8]> {
    if terminal {
        escaped_lines(&String::from_utf8_lossy(data))
            .into_bytes()
            .into()
    } else {
        data.into()
    }
}

fn print_out(data: &[u8]) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    stdout.lock().write_all(&for_stdout(data, terminal))
}

/// Runs one client operation on a current-thread runtime.
pub fn run(fut: impl std::future::Future<Output = Result<ExitCode>>) -> Result<ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(fut)
}

/// Splits `/tool/echo/call` into the server (`tool`) and the path inside it (`echo/call`).
fn split(path: &str) -> Result<(&str, &str)> {
    let trimmed = path.trim_start_matches('/');
    let (server, rest) = trimmed.split_once('/').unwrap_or((trimmed, ""));
    if server.is_empty()
        || !server
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        bail!("{path:?}: a path starts with a server name, like /tool or /receipts");
    }
    Ok((server, rest))
}

async fn walk(dirs: &Dirs, path: &str) -> Result<Fid> {
    let (server, rest) = split(path)?;
    let sock = dirs.socket(server);
    let client = Client::connect_unix(&sock)
        .await
        .with_context(|| crate::none_answers(&format!("server {server:?}"), &sock))?;
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map_or_else(|| "operator".to_string(), |u| u.name);
    let root = client
        .attach(&user, "")
        .await
        .with_context(|| format!("attach to {server}"))?;
    if rest.is_empty() {
        return Ok(root);
    }
    root.walk_path(rest).await.with_context(|| path.to_string())
}

pub async fn ls(dirs: &Dirs, path: &str) -> Result<ExitCode> {
    let fid = walk(dirs, path).await?;
    let (qid, _) = fid.getattr().await.with_context(|| path.to_string())?;
    if !qid.typ.contains(warren_9p::QIdType::DIR) {
        println!("{}", escape(path.rsplit('/').next().unwrap_or(path)));
        return Ok(ExitCode::SUCCESS);
    }
    fid.open(oflags::RDONLY)
        .await
        .with_context(|| path.to_string())?;
    let mut names: Vec<String> = fid
        .readdir_all()
        .await
        .with_context(|| path.to_string())?
        .into_iter()
        .filter(|e| e.name != "." && e.name != "..")
        .map(|e| {
            if e.qid.typ.contains(warren_9p::QIdType::DIR) {
                format!("{}/", escape(&e.name))
            } else {
                escape(&e.name)
            }
        })
        .collect();
    names.sort();
    let mut out = std::io::stdout().lock();
    for n in names {
        writeln!(out, "{n}")?;
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn cat(dirs: &Dirs, path: &str) -> Result<ExitCode> {
    let fid = walk(dirs, path).await?;
    fid.open(oflags::RDONLY)
        .await
        .with_context(|| path.to_string())?;
    let data = fid.read_to_end(0).await.with_context(|| path.to_string())?;
    print_out(&data)?;
    Ok(ExitCode::SUCCESS)
}

pub async fn write(dirs: &Dirs, path: &str, data: Option<String>) -> Result<ExitCode> {
    let data = match data {
        Some(d) => d.into_bytes(),
        None => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf)?;
            buf
        }
    };
    let fid = walk(dirs, path).await?;
    fid.open(oflags::RDWR)
        .await
        .with_context(|| path.to_string())?;
    fid.write_all(0, &data)
        .await
        .with_context(|| path.to_string())?;
    // rpc-style files (append, decide, ctl) answer on the same open; plain files read back empty
    // or refuse the read, neither of which is an error of the write.
    if let Ok(reply) = fid.read_to_end(0).await {
        print_out(&reply)?;
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn call(dirs: &Dirs, tool: &str, json: &str) -> Result<ExitCode> {
    if tool.is_empty() || tool.contains('/') {
        bail!("{tool:?} is not a tool name");
    }
    let root = walk(dirs, "/tool").await?;
    let reply = warren_toolfs::client::call_bytes(&root, tool, json.as_bytes())
        .await
        .with_context(|| format!("/tool/{tool}/call"))?;
    print_out(&reply)?;
    if !reply.ends_with(b"\n") {
        println!();
    }
    use warren_toolfs::envelope::Status;
    Ok(
        match warren_toolfs::Envelope::parse(&reply).map(|e| e.status) {
            Ok(Status::Ok) => ExitCode::SUCCESS,
            Ok(Status::Denied) => ExitCode::from(3),
            _ => ExitCode::from(1),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::{for_stdout, split};

    /// On a terminal a file's ESC sequences and bidi overrides are shown escaped, its lines kept;
    /// to a pipe it goes out exact.
    #[test]
    fn file_bytes_are_exact_for_programs_and_escaped_for_people() {
        let data = "{\"content\":\"ok\"}\n\x1b[2J\u{202E}txt\r\n".as_bytes();
        assert_eq!(&*for_stdout(data, false), data);
        let shown = String::from_utf8(for_stdout(data, true).into_owned()).unwrap();
        assert_eq!(
            shown,
            "{\"content\":\"ok\"}\n\\u{001B}[2J\\u{202E}txt\\u{000D}\n"
        );
    }

    #[test]
    fn first_element_names_the_server() {
        assert_eq!(split("/tool/echo/call").unwrap(), ("tool", "echo/call"));
        assert_eq!(split("/tool").unwrap(), ("tool", ""));
        assert_eq!(split("receipts/x").unwrap(), ("receipts", "x"));
        assert!(split("/").is_err());
        assert!(split("/../etc").is_err());
    }
}
