//! A second "host" on this machine: a network namespace (`ip netns`) joined to the root one by a
//! veth pair. Deleted (with its veth) on drop.

use std::os::fd::AsFd;
use std::process::Command;

pub struct Link {
    pub netns: String,
    /// The address inside (the other host's); the root namespace's end is the one before it.
    pub inside_ip: String,
    /// The veth end in the root namespace (this host's side of the cable), and its address.
    pub outside: String,
    pub outside_ip: String,
}

impl Link {
    /// `10.231.N.1` outside, `10.231.N.2` inside.
    pub fn new() -> Link {
        Link::in_prefix("10.231")
    }

    /// `PREFIX.N.1` outside, `PREFIX.N.2` inside (`PREFIX`: two octets): a /30 of its own per
    /// link, from this process's pid and a counter.
    pub fn in_prefix(prefix: &str) -> Link {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let c = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let pid = std::process::id();
        let netns = format!("wexp{pid}-{c}");
        let (outside, inside) = (
            format!("wxa{}-{c}", pid % 10000),
            format!("wxb{}-{c}", pid % 10000),
        );
        let (net, host) = (pid % 200 + 20, 4 * (c % 60));
        ip(&["netns", "add", &netns]);
        let link = Link {
            netns: netns.clone(),
            inside_ip: format!("{prefix}.{net}.{}", host + 2),
            outside: outside.clone(),
            outside_ip: format!("{prefix}.{net}.{}", host + 1),
        };
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &inside,
        ]);
        ip(&["link", "set", &inside, "netns", &netns]);
        ip(&[
            "addr",
            "add",
            &format!("{prefix}.{net}.{}/30", host + 1),
            "dev",
            &outside,
        ]);
        ip(&["link", "set", &outside, "up"]);
        let inside_addr = format!("{prefix}.{net}.{}/30", host + 2);
        ip(&["-n", &netns, "addr", "add", &inside_addr, "dev", &inside]);
        ip(&["-n", &netns, "link", "set", &inside, "up"]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        link
    }

    /// This host's end of the cable down (`false`: the cable pulled) or up again.
    pub fn set_up(&self, up: bool) {
        ip(&["link", "set", &self.outside, if up { "up" } else { "down" }]);
    }

    /// Runs `make` on a thread that has joined the other host's network namespace: the sockets
    /// it creates are that host's, whichever thread then serves them.
    pub fn inside<T: Send + 'static>(&self, make: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.netns);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            // setns(CLONE_NEWNET) moves this thread only, which ends here.
            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            make()
        })
        .join()
        .unwrap()
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// A DNS server for `names` (A records; AAAA: none; any other name: NXDOMAIN), forever.
pub fn answer_dns(sock: &std::net::UdpSocket, names: &[(&str, std::net::Ipv4Addr)]) {
    use hickory_proto::op::{Message, ResponseCode};
    use hickory_proto::rr::{RData, Record, RecordType, rdata::A};
    let mut buf = [0u8; 1500];
    while let Ok((n, peer)) = sock.recv_from(&mut buf) {
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
        reply.metadata.authoritative = true;
        reply.metadata.recursion_desired = query.metadata.recursion_desired;
        for q in &query.queries {
            reply.add_query(q.clone());
            let asked = q.name().to_ascii().trim_end_matches('.').to_lowercase();
            match names.iter().find(|(name, _)| *name == asked) {
                Some((_, ip)) if q.query_type() == RecordType::A => {
                    reply.add_answer(Record::from_rdata(q.name().clone(), 60, RData::A(A(*ip))));
                }
                Some(_) => {}
                None => reply.metadata.response_code = ResponseCode::NXDomain,
            }
        }
        if let Ok(bytes) = reply.to_vec() {
            let _ = sock.send_to(&bytes, peer);
        }
    }
}
