//! Framing on top of rs9p's codec: size-prefixed frames, checked before anything is decoded.
//!
//! rs9p's decoder allocates from lengths it reads (`Data` does `vec![0; len]` on a peer-supplied
//! u32 before checking that the bytes exist, and its `RReaddir` decoder treats a byte count as an
//! entry count). So every frame is read whole first, bounded by the negotiated msize, and the
//! lengths rs9p would allocate from are checked against the frame before rs9p sees it.

use std::io::{self, Cursor};

use bytes::BytesMut;
use rs9p::serialize::{Decodable, Encodable};
use rs9p::{DirEntry, DirEntryData, FCall, Msg, MsgType};
use tokio::io::{AsyncRead, AsyncReadExt};

/// size[4] type[1] tag[2]: the smallest valid frame.
pub const HEADER_LEN: u32 = 7;
/// The header of Rread and Rreaddir: size[4] type[1] tag[2] count[4].
pub const RREAD_HEADER_LEN: u32 = 11;
/// Room for the Twrite/Tread header (size, type, tag, fid, offset, count), as diod reserves it.
pub const IOHDRSZ: u32 = 24;
/// The most names one Twalk may carry.
pub const MAXWELEM: usize = 16;
/// The smallest msize either side agrees to.
pub const MIN_MSIZE: u32 = 4096;

/// Why a connection is being dropped: the peer broke framing or the codec.
#[derive(Debug)]
pub enum FrameError {
    /// The transport failed (not the peer's fault as far as we can tell).
    Io(io::Error),
    /// The frame's size field is below the header or above the negotiated msize.
    BadSize { size: u32, max: u32 },
    /// The frame does not decode to a message we accept in this direction.
    Garbage(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "transport error: {e}"),
            FrameError::BadSize { size, max } => {
                write!(f, "frame size {size} outside [{HEADER_LEN}, {max}]")
            }
            FrameError::Garbage(why) => write!(f, "malformed frame: {why}"),
        }
    }
}

impl From<FrameError> for io::Error {
    fn from(e: FrameError) -> io::Error {
        match e {
            FrameError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
        }
    }
}

/// Reads whole frames from a stream. Cancel-safe: bytes read before a cancelled `next` stay
/// buffered for the next call, so the reader can sit in a `select!`.
pub struct FrameReader<R> {
    rd: R,
    buf: BytesMut,
}

/// How much the reader asks the kernel for at least, so small frames are read in batches.
const READ_CHUNK: usize = 16 * 1024;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(rd: R) -> FrameReader<R> {
        FrameReader {
            rd,
            buf: BytesMut::new(),
        }
    }

    /// The next whole frame (size field included). `Ok(None)` at a clean end of stream between
    /// frames. The size is checked against `max` before room for the frame is reserved.
    pub async fn next(&mut self, max: u32) -> Result<Option<BytesMut>, FrameError> {
        loop {
            let mut want = 4;
            if self.buf.len() >= 4 {
                let size = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes"));
                if !(HEADER_LEN..=max).contains(&size) {
                    return Err(FrameError::BadSize { size, max });
                }
                if self.buf.len() >= size as usize {
                    return Ok(Some(self.buf.split_to(size as usize)));
                }
                want = size as usize;
            }
            self.buf.reserve((want - self.buf.len()).max(READ_CHUNK));
            let n = self
                .rd
                .read_buf(&mut self.buf)
                .await
                .map_err(FrameError::Io)?;
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(FrameError::Garbage("end of stream inside a frame".into()))
                };
            }
        }
    }
}

/// Encodes a message as a whole frame, size field included.
pub fn encode(msg: &Msg) -> Vec<u8> {
    let mut buf = vec![0u8; 4];
    // Writing into a Vec cannot fail.
    msg.encode(&mut buf).expect("encoding into a Vec");
    let size = buf.len() as u32;
    buf[..4].copy_from_slice(&size.to_le_bytes());
    buf
}

/// The message type byte of a frame (frames are at least `HEADER_LEN` long).
fn frame_type(frame: &[u8]) -> u8 {
    frame[4]
}

/// 9P numbers each reply one above its request: requests are even, replies odd.
fn is_reply_type(typ: u8) -> bool {
    typ & 1 == 1
}

/// The tag of a frame.
pub fn frame_tag(frame: &[u8]) -> u16 {
    u16::from_le_bytes([frame[5], frame[6]])
}

/// Checks that the u32 count at `at` (from the frame start) equals the bytes after it.
fn check_count(frame: &[u8], at: usize, what: &str) -> Result<(), FrameError> {
    let Some(field) = frame.get(at..at + 4) else {
        return Err(FrameError::Garbage(format!("{what} truncated")));
    };
    let count = u32::from_le_bytes(field.try_into().expect("4 bytes")) as usize;
    let rest = frame.len() - at - 4;
    if count != rest {
        return Err(FrameError::Garbage(format!(
            "{what} count {count} but {rest} bytes follow"
        )));
    }
    Ok(())
}

/// Decodes with rs9p and insists the whole frame was consumed.
fn decode_whole(frame: &[u8]) -> Result<Msg, FrameError> {
    let mut cur = Cursor::new(&frame[4..]);
    let msg = Msg::decode(&mut cur).map_err(|e| FrameError::Garbage(e.to_string()))?;
    if cur.position() as usize != frame.len() - 4 {
        return Err(FrameError::Garbage(format!(
            "{} trailing bytes after {:?}",
            frame.len() - 4 - cur.position() as usize,
            MsgType::from(&msg.body)
        )));
    }
    Ok(msg)
}

/// Decodes a frame a client sent (a T-message). R-messages and unknown types are garbage.
pub fn decode_request(frame: &[u8]) -> Result<Msg, FrameError> {
    let typ = frame_type(frame);
    if is_reply_type(typ) || typ == MsgType::TlError as u8 {
        return Err(FrameError::Garbage(format!(
            "message type {typ} is not a request"
        )));
    }
    if typ == MsgType::TWrite as u8 {
        // type tag fid[4] offset[8] count[4] data[count]
        check_count(frame, 4 + 1 + 2 + 4 + 8, "Twrite")?;
    }
    decode_whole(frame)
}

/// Decodes a frame a server sent (an R-message). T-messages and unknown types are garbage.
pub fn decode_reply(frame: &[u8]) -> Result<Msg, FrameError> {
    let typ = frame_type(frame);
    if !is_reply_type(typ) {
        return Err(FrameError::Garbage(format!(
            "message type {typ} is not a reply"
        )));
    }
    if typ == MsgType::RRead as u8 {
        check_count(frame, 7, "Rread")?;
    }
    if typ == MsgType::RReadDir as u8 {
        // rs9p's RReaddir decoder reads the byte count as an entry count: parse it ourselves.
        check_count(frame, 7, "Rreaddir")?;
        let mut cur = Cursor::new(&frame[11..]);
        let mut data = DirEntryData::new();
        while (cur.position() as usize) < frame.len() - 11 {
            let entry =
                DirEntry::decode(&mut cur).map_err(|e| FrameError::Garbage(e.to_string()))?;
            data.push(entry);
        }
        return Ok(Msg {
            tag: frame_tag(frame),
            body: FCall::RReadDir { data },
        });
    }
    decode_whole(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rs9p::Data;

    #[test]
    fn twrite_count_must_match_frame() {
        let msg = Msg {
            tag: 1,
            body: FCall::TWrite {
                fid: 1,
                offset: 0,
                data: Data(vec![7; 10]),
            },
        };
        let mut frame = encode(&msg);
        assert_eq!(decode_request(&frame).unwrap(), msg);
        // Claim 4 GiB of data in a 33-byte frame: refused before rs9p could allocate it.
        frame[19..23].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
        assert!(matches!(
            decode_request(&frame),
            Err(FrameError::Garbage(_))
        ));
    }

    #[test]
    fn rread_count_must_match_frame() {
        let msg = Msg {
            tag: 1,
            body: FCall::RRead {
                data: Data(vec![1, 2, 3]),
            },
        };
        let mut frame = encode(&msg);
        assert_eq!(decode_reply(&frame).unwrap(), msg);
        frame[7..11].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_reply(&frame).is_err());
    }

    #[test]
    fn rreaddir_round_trips() {
        let entries = vec![
            DirEntry {
                name: "a".into(),
                offset: 1,
                ..Default::default()
            },
            DirEntry {
                name: "bb".into(),
                offset: 2,
                ..Default::default()
            },
        ];
        let msg = Msg {
            tag: 3,
            body: FCall::RReadDir {
                data: DirEntryData::with(entries),
            },
        };
        assert_eq!(decode_reply(&encode(&msg)).unwrap(), msg);
    }

    #[test]
    fn trailing_bytes_and_wrong_direction_are_garbage() {
        let mut frame = encode(&Msg {
            tag: 1,
            body: FCall::TClunk { fid: 3 },
        });
        assert!(decode_reply(&frame).is_err());
        frame.push(0);
        let size = frame.len() as u32;
        frame[..4].copy_from_slice(&size.to_le_bytes());
        assert!(decode_request(&frame).is_err());
    }
}
