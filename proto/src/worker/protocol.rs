//! The toolfs ↔ worker wire format (normative text: specs/worker-protocol.md).
//!
//! A frame is a 4-byte little-endian length followed by that many bytes of JSON (one message).
//! JSON rather than postcard because every payload is already JSON or text and a frame dump is
//! then readable; the cost is irrelevant next to a process boundary.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Version carried in `Hello`; a worker refuses any other.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame either side accepts (arguments carry whole files for `fs_write`).
pub const MAX_FRAME: usize = 32 << 20;

/// The worker's argv: `[program, tool, socket_fd, root_fd...]`. The fds keep the numbers they
/// have in toolfs (only their close-on-exec flag is cleared in the child), so nothing std or
/// toolfs holds in the child between fork and exec is ever overwritten.
pub struct WorkerArgs {
    pub tool: String,
    pub socket_fd: i32,
    pub root_fds: Vec<i32>,
}

impl WorkerArgs {
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<WorkerArgs, String> {
        let mut args = args.into_iter().skip(1);
        let tool = args.next().ok_or("no tool name")?;
        let mut fd = |what: &str| -> Result<Option<i32>, String> {
            match args.next() {
                None => Ok(None),
                Some(n) => match n.parse::<i32>() {
                    Ok(fd) if fd > 2 => Ok(Some(fd)),
                    _ => Err(format!("bad {what} fd {n:?}")),
                },
            }
        };
        let socket_fd = fd("socket")?.ok_or("no socket fd")?;
        let mut root_fds = Vec::new();
        while let Some(root) = fd("root")? {
            root_fds.push(root);
        }
        Ok(WorkerArgs {
            tool,
            socket_fd,
            root_fds,
        })
    }
}

/// One root as the Hello names it; its directory fd is the argv's root fd of the same index.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RootConfig {
    pub path: String,
    pub writable: bool,
}

/// toolfs → worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToWorker {
    /// First frame, exactly once: who to become and what the inherited root fds are.
    Hello {
        version: u32,
        tool: String,
        uid: u32,
        gid: u32,
        network: bool,
        roots: Vec<RootConfig>,
    },
    /// One call. `args` is the canonical JSON text; `timeout_ms` bounds the call inside the worker.
    Call {
        id: u64,
        args: String,
        timeout_ms: u64,
    },
}

/// worker → toolfs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum FromWorker {
    /// Answer to Hello: the worker has dropped to these ids and closed every other fd.
    Ready { pid: i32, uid: u32, gid: u32 },
    /// Answer to Hello when the worker cannot start; it exits after sending it.
    Fatal { message: String },
    /// A call started a process group (shell); toolfs kills it if the worker stops answering.
    Started { id: u64, pgid: i32 },
    /// The end of call `id` (id 0: a frame that could not be parsed at all).
    Done { id: u64, ok: bool, content: String },
}

/// Encodes one message as a frame.
pub fn encode<T: Serialize>(message: &T) -> io::Result<Vec<u8>> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    if body.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("frame of {} bytes exceeds {MAX_FRAME}", body.len()),
        ));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Splits one complete frame off the front of `buf`, if there is one.
/// An over-long length is an error: the stream cannot be trusted after it.
pub fn take_frame(buf: &mut Vec<u8>) -> io::Result<Option<Vec<u8>>> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame length {len} exceeds {MAX_FRAME}"),
        ));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let body = buf[4..4 + len].to_vec();
    buf.drain(..4 + len);
    Ok(Some(body))
}

/// What a blocking reader got: a frame body, a frame too long to hold (already skipped), or EOF.
pub enum Incoming {
    Frame(Vec<u8>),
    Oversized(usize),
    Eof,
}

/// Blocking read of one frame. An oversized frame is read and discarded so the stream stays in
/// step and the caller can answer it with an error.
pub fn read_frame_blocking(stream: &mut impl Read) -> io::Result<Incoming> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Incoming::Eof),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        io::copy(&mut stream.take(len as u64), &mut io::sink())?;
        return Ok(Incoming::Oversized(len));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(Incoming::Frame(body))
}

/// Blocking write of one message.
pub fn write_message_blocking<T: Serialize>(
    stream: &mut impl Write,
    message: &T,
) -> io::Result<()> {
    stream.write_all(&encode(message)?)?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_split() {
        let a = encode(&FromWorker::Done {
            id: 7,
            ok: true,
            content: "x".into(),
        })
        .unwrap();
        let b = encode(&FromWorker::Started { id: 8, pgid: 9 }).unwrap();
        let mut buf = [a.clone(), b.clone()].concat();
        buf.push(1); // a partial third frame
        let first = take_frame(&mut buf).unwrap().unwrap();
        assert_eq!(
            serde_json::from_slice::<FromWorker>(&first).unwrap(),
            FromWorker::Done {
                id: 7,
                ok: true,
                content: "x".into()
            }
        );
        let second = take_frame(&mut buf).unwrap().unwrap();
        assert_eq!(
            serde_json::from_slice::<FromWorker>(&second).unwrap(),
            FromWorker::Started { id: 8, pgid: 9 }
        );
        assert!(take_frame(&mut buf).unwrap().is_none());
        assert_eq!(buf, vec![1]);
    }

    #[test]
    fn over_long_length_is_refused() {
        let mut buf = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        assert!(take_frame(&mut buf).is_err());
        let mut reader = io::Cursor::new([buf.clone(), vec![0u8; MAX_FRAME + 1]].concat());
        assert!(
            matches!(read_frame_blocking(&mut reader).unwrap(), Incoming::Oversized(n) if n == MAX_FRAME + 1)
        );
        assert!(matches!(
            read_frame_blocking(&mut reader).unwrap(),
            Incoming::Eof
        ));
    }

    #[test]
    fn argv_names_the_fds() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let parsed = WorkerArgs::parse(argv(&["w", "fs_read", "7", "9", "12"])).unwrap();
        assert_eq!(
            (parsed.tool.as_str(), parsed.socket_fd, parsed.root_fds),
            ("fs_read", 7, vec![9, 12])
        );
        assert!(WorkerArgs::parse(argv(&["w", "fs_read"])).is_err());
        assert!(WorkerArgs::parse(argv(&["w", "fs_read", "2"])).is_err());
        assert!(WorkerArgs::parse(argv(&["w", "fs_read", "5", "x"])).is_err());
    }

    #[test]
    fn unknown_fields_are_refused() {
        let bad = br#"{"type":"call","id":1,"args":"{}","timeout_ms":5,"extra":1}"#;
        assert!(serde_json::from_slice::<ToWorker>(bad).is_err());
    }
}
