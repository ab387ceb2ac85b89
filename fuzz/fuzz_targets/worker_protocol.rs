//! The toolfs ↔ worker protocol (`warren_toolfs::worker::protocol`): framing and message
//! decoding, on any byte stream either side may be sent.
//!
//! The first byte sets how many bytes arrive per read on toolfs's side; the rest is the stream.
//! Checks: no panic; toolfs's incremental `take_frame` (fed read by read) and the worker's
//! blocking `read_frame_blocking` cut the same frames; an over-long length is refused by one and
//! skipped whole by the other; every frame that decodes as a `ToWorker` or `FromWorker` encodes
//! back to a frame that decodes to the same message.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;
use warren_toolfs::worker::protocol::{
    FromWorker, Incoming, MAX_FRAME, ToWorker, encode, read_frame_blocking, take_frame,
};

fn round_trips<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(body: &[u8]) {
    let Ok(message) = serde_json::from_slice::<T>(body) else {
        return;
    };
    let mut frame = encode(&message).expect("a decoded message encodes");
    let again = take_frame(&mut frame)
        .expect("an encoded frame is in bounds")
        .expect("an encoded frame is whole");
    assert!(frame.is_empty(), "encode wrote more than one frame");
    let decoded: T = serde_json::from_slice(&again).expect("an encoded message decodes");
    assert_eq!(decoded, message);
}

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let chunk = chunk as usize + 1;

    // toolfs: bytes arrive `chunk` at a time; frames are split off as they complete.
    let mut toolfs_frames = Vec::new();
    let mut refused = false;
    let mut buffer = Vec::new();
    'reads: for piece in stream.chunks(chunk) {
        buffer.extend_from_slice(piece);
        loop {
            match take_frame(&mut buffer) {
                Ok(Some(body)) => toolfs_frames.push(body),
                Ok(None) => break,
                Err(_) => {
                    refused = true;
                    break 'reads;
                }
            }
        }
    }

    // The worker: blocking reads of the same stream.
    let mut worker_frames = Vec::new();
    let mut cursor = Cursor::new(stream);
    loop {
        match read_frame_blocking(&mut cursor) {
            Ok(Incoming::Frame(body)) => worker_frames.push(body),
            Ok(Incoming::Oversized(n)) => {
                assert!(n > MAX_FRAME, "a frame of {n} bytes called oversized");
                assert!(refused, "toolfs took a frame the worker calls oversized");
                assert_eq!(worker_frames, toolfs_frames);
                worker_frames.clear();
                break;
            }
            Ok(Incoming::Eof) | Err(_) => break,
        }
    }
    if !refused {
        assert_eq!(
            worker_frames, toolfs_frames,
            "the two sides cut frames differently"
        );
        let consumed: usize = toolfs_frames.iter().map(|f| 4 + f.len()).sum();
        assert_eq!(
            buffer.len(),
            stream.len() - consumed,
            "bytes lost between frames"
        );
    }

    for body in &toolfs_frames {
        assert!(body.len() <= MAX_FRAME);
        round_trips::<ToWorker>(body);
        round_trips::<FromWorker>(body);
    }
});
