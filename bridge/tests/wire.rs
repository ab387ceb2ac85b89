//! The bridge's side of the FUSE protocol, driven by a scripted "kernel": a SOCK_SEQPACKET
//! socketpair stands in for /dev/fuse (one message per read, as the device gives), so the tests
//! can send what a kernel rarely does on cue (an INTERRUPT for an unknown request, a malformed
//! request) and check every byte of the answers. The 9P side is the real test tree.

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Server, client_for, wait_until};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use polyfuse_kernel as abi;
use zerocopy::{FromBytes, IntoBytes};

/// The interrupt bit of an INTERRUPT's own unique (linux/fuse.h FUSE_INT_REQ_BIT).
const FUSE_INT_REQ_BIT: u64 = 1;

struct FakeKernel {
    /// Our end of the device stand-in; dropped to hang up.
    sock: Option<OwnedFd>,
    rt: tokio::runtime::Runtime,
    server: std::sync::Arc<Server>,
    bridge: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl FakeKernel {
    fn start() -> FakeKernel {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let server = Server::new(Duration::from_millis(1));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(client_for(&server)).unwrap();
        let bridge = rt.spawn(warren_bridge::serve(
            theirs,
            client,
            warren_bridge::BridgeOptions::default(),
        ));
        FakeKernel {
            sock: Some(ours),
            rt,
            server,
            bridge: Some(bridge),
        }
    }

    fn sock(&self) -> &OwnedFd {
        self.sock.as_ref().expect("not hung up")
    }

    fn send(&self, opcode: u32, unique: u64, nodeid: u64, body: &[u8]) {
        let header = abi::fuse_in_header {
            len: (size_of::<abi::fuse_in_header>() + body.len()) as u32,
            opcode,
            unique,
            nodeid,
            ..Default::default()
        };
        let mut msg = header.as_bytes().to_vec();
        msg.extend_from_slice(body);
        assert_eq!(nix::unistd::write(self.sock(), &msg).unwrap(), msg.len());
    }

    /// The next reply, within a generous bound: (unique, error, body).
    fn recv(&self) -> (u64, i32, Vec<u8>) {
        self.recv_within(Duration::from_secs(10))
            .expect("no reply within 10 s")
    }

    fn recv_within(&self, bound: Duration) -> Option<(u64, i32, Vec<u8>)> {
        let mut fds = [PollFd::new(self.sock().as_fd(), PollFlags::POLLIN)];
        let ready = poll(&mut fds, PollTimeout::try_from(bound).unwrap()).unwrap();
        if ready == 0 {
            return None;
        }
        let mut buf = vec![0u8; 1 << 20];
        let n = nix::unistd::read(self.sock(), &mut buf).unwrap();
        let (header, body) = abi::fuse_out_header::read_from_prefix(&buf[..n]).unwrap();
        assert_eq!(header.len as usize, n, "the reply's length is its size");
        Some((header.unique, header.error, body.to_vec()))
    }

    fn init(&self) -> abi::fuse_init_out {
        let init = abi::fuse_init_in {
            major: 7,
            minor: 40,
            max_readahead: 131072,
            flags: u32::MAX,
        };
        self.send(abi::FUSE_INIT, 2, 0, init.as_bytes());
        let (unique, error, body) = self.recv();
        assert_eq!((unique, error), (2, 0));
        abi::fuse_init_out::read_from_prefix(&body).unwrap().0
    }

    fn lookup(&self, unique: u64, name: &str) -> (i32, Option<abi::fuse_entry_out>) {
        self.send(abi::FUSE_LOOKUP, unique, 1, format!("{name}\0").as_bytes());
        let (got, error, body) = self.recv();
        assert_eq!(got, unique);
        (
            error,
            (error == 0).then(|| abi::fuse_entry_out::read_from_prefix(&body).unwrap().0),
        )
    }

    fn open(&self, unique: u64, nodeid: u64) -> abi::fuse_open_out {
        let open = abi::fuse_open_in {
            flags: libc::O_RDONLY as u32,
            unused: 0,
        };
        self.send(abi::FUSE_OPEN, unique, nodeid, open.as_bytes());
        let (got, error, body) = self.recv();
        assert_eq!((got, error), (unique, 0));
        abi::fuse_open_out::read_from_prefix(&body).unwrap().0
    }

    /// A read(2) of a direct-I/O file, as the kernel sends it: naming its reader.
    fn read(&self, unique: u64, nodeid: u64, fh: u64) {
        self.read_with(unique, nodeid, fh, abi::FUSE_READ_LOCKOWNER);
    }

    /// `read_flags` 0 is a page-cache read (splice, sendfile, mmap): no reader named.
    fn read_with(&self, unique: u64, nodeid: u64, fh: u64, read_flags: u32) {
        let read = abi::fuse_read_in {
            fh,
            offset: 0,
            size: 4096,
            read_flags,
            lock_owner: if read_flags == 0 { 0 } else { 0x2b9d },
            ..Default::default()
        };
        self.send(abi::FUSE_READ, unique, nodeid, read.as_bytes());
    }

    /// Hangs up like an unmount; serve() must return Ok.
    fn hang_up(mut self) {
        let bridge = self.bridge.take().unwrap();
        self.sock = None;
        let served = self
            .rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), bridge).await });
        served
            .expect("serve() returned after the hang-up")
            .unwrap()
            .unwrap();
    }
}

impl Drop for FakeKernel {
    fn drop(&mut self) {
        self.server.kill();
    }
}

#[test]
fn init_takes_only_the_flags_the_bridge_wants_at_minor_31() {
    let k = FakeKernel::start();
    let out = k.init();
    assert_eq!((out.major, out.minor), (7, 31));
    assert_eq!(
        out.flags,
        abi::FUSE_ASYNC_READ | abi::FUSE_BIG_WRITES | abi::FUSE_PARALLEL_DIROPS
    );
    assert_eq!(out.max_write, 128 * 1024);
    assert_eq!(out.max_readahead, 131072);
    k.hang_up();
}

#[test]
fn an_interrupt_for_an_unknown_request_is_answered_eagain_never_enosys() {
    let k = FakeKernel::start();
    k.init();
    let interrupt = abi::fuse_interrupt_in { unique: 1000 };
    k.send(
        abi::FUSE_INTERRUPT,
        1000 | FUSE_INT_REQ_BIT,
        0,
        interrupt.as_bytes(),
    );
    assert_eq!(k.recv(), (1000 | FUSE_INT_REQ_BIT, -libc::EAGAIN, vec![]));
    k.hang_up();
}

/// A page-cache read (sendfile, splice, mmap: no reader named) of a direct-I/O file is refused
/// with EIO and never reaches the server: it comes at a page-aligned offset, which on a call
/// file would run the call at the wrong o₀. (busybox `cat` then falls back to read(2).)
#[test]
fn a_page_cache_read_of_a_direct_io_file_is_refused_before_the_server() {
    let k = FakeKernel::start();
    k.init();
    let (error, entry) = k.lookup(4, "slow");
    assert_eq!(error, 0);
    let node = entry.unwrap().nodeid;
    let open = k.open(6, node);
    assert_ne!(open.open_flags & abi::FOPEN_DIRECT_IO, 0);
    k.read_with(8, node, open.fh, 0);
    assert_eq!(k.recv(), (8, -libc::EIO, vec![]));
    let stats = k.server.shared.stats.clone();
    assert_eq!(stats.slow_reads_started.load(Ordering::SeqCst), 0);
    k.hang_up();
}

#[test]
fn an_interrupted_read_is_answered_eintr_once_and_flushed_in_the_server() {
    let k = FakeKernel::start();
    k.init();
    let (error, entry) = k.lookup(4, "slow");
    assert_eq!(error, 0);
    let node = entry.unwrap().nodeid;
    let open = k.open(6, node);
    assert_ne!(open.open_flags & abi::FOPEN_DIRECT_IO, 0);
    assert_eq!(
        open.open_flags & (abi::FOPEN_NONSEEKABLE | abi::FOPEN_STREAM | abi::FOPEN_KEEP_CACHE),
        0
    );
    k.read(8, node, open.fh);
    let stats = k.server.shared.stats.clone();
    assert!(wait_until(Duration::from_secs(10), || stats
        .slow_reads_started
        .load(Ordering::SeqCst)
        == 1));

    let interrupt = abi::fuse_interrupt_in { unique: 8 };
    k.send(
        abi::FUSE_INTERRUPT,
        8 | FUSE_INT_REQ_BIT,
        0,
        interrupt.as_bytes(),
    );
    assert_eq!(k.recv(), (8, -libc::EINTR, vec![]));
    assert!(wait_until(Duration::from_secs(10), || stats
        .slow_reads_flushed
        .load(Ordering::SeqCst)
        == 1));
    // A second INTERRUPT for it (the request is answered) gets EAGAIN; the READ no second reply.
    k.send(
        abi::FUSE_INTERRUPT,
        8 | FUSE_INT_REQ_BIT,
        0,
        interrupt.as_bytes(),
    );
    assert_eq!(k.recv(), (8 | FUSE_INT_REQ_BIT, -libc::EAGAIN, vec![]));
    k.send(
        abi::FUSE_GETATTR,
        10,
        node,
        abi::fuse_getattr_in::default().as_bytes(),
    );
    assert_eq!(
        k.recv().0,
        10,
        "the next reply is the GETATTR's, not a late READ reply"
    );
    k.hang_up();
}

#[test]
fn odd_requests_get_clear_errors_and_forget_gets_no_reply() {
    let k = FakeKernel::start();
    k.init();
    // An opcode the bridge does not serve (RENAME) and one no kernel sends.
    k.send(abi::FUSE_RENAME, 4, 1, &[0; 16]);
    assert_eq!(k.recv(), (4, -libc::ENOSYS, vec![]));
    k.send(4242, 6, 1, &[]);
    assert_eq!(k.recv(), (6, -libc::ENOSYS, vec![]));
    // Arguments shorter than the opcode's struct.
    k.send(abi::FUSE_READ, 8, 1, &[0; 3]);
    assert_eq!(k.recv(), (8, -libc::EINVAL, vec![]));
    // A missing name; a name 9P cannot carry.
    assert_eq!(k.lookup(10, "not-granted").0, -libc::ENOENT);
    k.send(abi::FUSE_LOOKUP, 12, 1, b"bad\xff\0");
    assert_eq!(k.recv(), (12, -libc::ENOENT, vec![]));
    // FORGET is never answered: the next reply is the STATFS's.
    let (_, entry) = k.lookup(14, "static");
    k.send(
        abi::FUSE_FORGET,
        16,
        entry.unwrap().nodeid,
        abi::fuse_forget_in { nlookup: 1 }.as_bytes(),
    );
    k.send(abi::FUSE_STATFS, 18, 1, &[]);
    let (unique, error, body) = k.recv();
    assert_eq!(
        (unique, error, body.len()),
        (18, 0, size_of::<abi::fuse_statfs_out>())
    );
    k.hang_up();
}
