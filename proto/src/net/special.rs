//! Which addresses a listed name may resolve to when no pin names them: the IANA special-purpose
//! address registries, every entry, with the decision taken for it.
//!
//! Source: IANA, "IPv4 Special-Purpose Address Registry" and "IPv6 Special-Purpose Address
//! Registry" (iana-ipv4-special-registry, iana-ipv6-special-registry), as of 2025 (the IPv6
//! registry's newest entry here is `100:0:0:1::/64`, RFC 9780, 2025). Written without a copy at
//! hand: check against the registries when they change.
//!
//! The rule: an entry whose "Globally Reachable" is not `True` is refused, unless its line gives
//! a reason; a `True` entry is public. Multicast, site-local and the rest of `::/8`, outside the
//! special-purpose registries, are refused too: none is a unicast destination on the internet.
//! The most specific entry holding an address decides (`192.0.0.9/32` within `192.0.0.0/24`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The registry's "Globally Reachable" column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reachable {
    True,
    False,
    /// "N/A" (deprecated entries and the like).
    NotApplicable,
    /// Not in the special-purpose registries (multicast, site-local, the rest of `::/8`).
    Unlisted,
}

/// What a name resolving into an entry gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// Refused unless a pin names the address; the words read "…resolved to ADDR, {words}".
    Refused(&'static str),
    /// A public address like any other.
    Public,
    /// Judged by the IPv4 address it carries (bits `at..at + 32` of the IPv6 address).
    ByEmbeddedIpv4 { at: u32 },
}

/// One registry entry: `addr/len`, its name and RFC as the registry gives them, and the decision.
#[derive(Debug, Clone, Copy)]
pub struct Special<A> {
    pub addr: A,
    pub len: u8,
    pub name: &'static str,
    pub rfc: &'static str,
    pub reachable: Reachable,
    pub judged: Judged,
}

const fn v4(
    addr: [u8; 4],
    len: u8,
    name: &'static str,
    rfc: &'static str,
    reachable: Reachable,
    judged: Judged,
) -> Special<Ipv4Addr> {
    Special {
        addr: Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]),
        len,
        name,
        rfc,
        reachable,
        judged,
    }
}

const fn v6(
    s: [u16; 8],
    len: u8,
    name: &'static str,
    rfc: &'static str,
    reachable: Reachable,
    judged: Judged,
) -> Special<Ipv6Addr> {
    Special {
        addr: Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
        len,
        name,
        rfc,
        reachable,
        judged,
    }
}

use Judged::{Public, Refused};
use Reachable::{False, NotApplicable, True, Unlisted};

/// The IPv4 Special-Purpose Address Registry, every entry, then multicast.
#[rustfmt::skip]
pub const IPV4: &[Special<Ipv4Addr>] = &[
    v4([0, 0, 0, 0], 8, "\"This network\"", "RFC 791, Section 3.2", False, Refused("an unspecified (\"this network\", 0.0.0.0/8) address")),
    v4([0, 0, 0, 0], 32, "\"This host on this network\"", "RFC 1122, Section 3.2.1.3", False, Refused("an unspecified (\"this network\", 0.0.0.0/8) address")),
    v4([10, 0, 0, 0], 8, "Private-Use", "RFC 1918", False, Refused("a private (RFC 1918) address")),
    v4([100, 64, 0, 0], 10, "Shared Address Space", "RFC 6598", False, Refused("a shared/CGNAT (RFC 6598) address")),
    v4([127, 0, 0, 0], 8, "Loopback", "RFC 1122, Section 3.2.1.3", False, Refused("a loopback address")),
    v4([169, 254, 0, 0], 16, "Link Local", "RFC 3927", False, Refused("a link-local address")),
    v4([172, 16, 0, 0], 12, "Private-Use", "RFC 1918", False, Refused("a private (RFC 1918) address")),
    v4([192, 0, 0, 0], 24, "IETF Protocol Assignments", "RFC 6890, Section 2.1", False, Refused("an IETF protocol assignments (192.0.0.0/24) address")),
    v4([192, 0, 0, 0], 29, "IPv4 Service Continuity Prefix", "RFC 7335", False, Refused("an IPv4 service continuity (192.0.0.0/29) address")),
    v4([192, 0, 0, 8], 32, "IPv4 dummy address", "RFC 7600", False, Refused("the IPv4 dummy address")),
    v4([192, 0, 0, 9], 32, "Port Control Protocol Anycast", "RFC 7723", True, Public),
    v4([192, 0, 0, 10], 32, "Traversal Using Relays around NAT Anycast", "RFC 8155", True, Public),
    v4([192, 0, 0, 170], 32, "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050, Section 2.2", False, Refused("a NAT64/DNS64 discovery address")),
    v4([192, 0, 0, 171], 32, "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050, Section 2.2", False, Refused("a NAT64/DNS64 discovery address")),
    v4([192, 0, 2, 0], 24, "Documentation (TEST-NET-1)", "RFC 5737", False, Refused("a documentation address")),
    v4([192, 31, 196, 0], 24, "AS112-v4", "RFC 7535", True, Public),
    v4([192, 52, 193, 0], 24, "AMT", "RFC 7450", True, Public),
    v4([192, 88, 99, 0], 24, "Deprecated (6to4 Relay Anycast)", "RFC 7526", NotApplicable, Refused("a deprecated 6to4 relay anycast address")),
    v4([192, 88, 99, 2], 32, "6a44-relay anycast address", "RFC 6751", False, Refused("a 6a44 relay anycast address")),
    v4([192, 168, 0, 0], 16, "Private-Use", "RFC 1918", False, Refused("a private (RFC 1918) address")),
    v4([192, 175, 48, 0], 24, "Direct Delegation AS112 Service", "RFC 7534", True, Public),
    v4([198, 18, 0, 0], 15, "Benchmarking", "RFC 2544", False, Refused("a benchmarking (198.18.0.0/15) address")),
    v4([198, 51, 100, 0], 24, "Documentation (TEST-NET-2)", "RFC 5737", False, Refused("a documentation address")),
    v4([203, 0, 113, 0], 24, "Documentation (TEST-NET-3)", "RFC 5737", False, Refused("a documentation address")),
    v4([240, 0, 0, 0], 4, "Reserved", "RFC 1112, Section 4", False, Refused("a reserved (240.0.0.0/4) address")),
    v4([255, 255, 255, 255], 32, "Limited Broadcast", "RFC 8190, RFC 919, Section 7", False, Refused("the limited broadcast address")),
    // Not in the special-purpose registry: multicast is never a unicast destination.
    v4([224, 0, 0, 0], 4, "Multicast", "RFC 5771", Unlisted, Refused("a multicast address")),
];

/// The IPv6 Special-Purpose Address Registry, every entry, then what lies outside it.
#[rustfmt::skip]
pub const IPV6: &[Special<Ipv6Addr>] = &[
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, "Loopback Address", "RFC 4291", False, Refused("a loopback address")),
    v6([0; 8], 128, "Unspecified Address", "RFC 4291", False, Refused("an unspecified address")),
    // Reason: the kernel sends a mapped address to the IPv4 address it carries.
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96, "IPv4-mapped Address", "RFC 4291", False, Judged::ByEmbeddedIpv4 { at: 96 }),
    // True in the registry, but the translator reaches the IPv4 address it carries: judged by it.
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96, "IPv4-IPv6 Translat.", "RFC 6052", True, Judged::ByEmbeddedIpv4 { at: 96 }),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "IPv4-IPv6 Translat.", "RFC 8215", False, Refused("a local-use NAT64 (64:ff9b:1::/48) address")),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "Discard-Only Address Block", "RFC 6666", False, Refused("a discard-only (100::/64) address")),
    v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64, "Dummy IPv6 Prefix", "RFC 9780", False, Refused("a dummy (100:0:0:1::/64) address")),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, "IETF Protocol Assignments", "RFC 2928", False, Refused("an IETF protocol assignments (2001::/23) address")),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "TEREDO", "RFC 4380, RFC 8190", NotApplicable, Refused("a Teredo (2001::/32) address")),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 1], 128, "Port Control Protocol Anycast", "RFC 7723", True, Public),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 2], 128, "Traversal Using Relays around NAT Anycast", "RFC 8155", True, Public),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 3], 128, "DNS-SD Service Registration Protocol Anycast Address", "RFC 9665", True, Public),
    v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48, "Benchmarking", "RFC 5180, RFC Errata 1752", False, Refused("a benchmarking (2001:2::/48) address")),
    v6([0x2001, 3, 0, 0, 0, 0, 0, 0], 32, "AMT", "RFC 7450", True, Public),
    v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48, "AS112-v6", "RFC 7535", True, Public),
    v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28, "Deprecated (previously ORCHID)", "RFC 4843", NotApplicable, Refused("a deprecated ORCHID (2001:10::/28) address")),
    v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28, "ORCHIDv2", "RFC 7343", True, Public),
    v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28, "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", True, Public),
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "Documentation", "RFC 3849", False, Refused("a documentation address")),
    // Reason: a 6to4 address is the IPv6 side of the IPv4 host it carries (RFC 3056, Section 2),
    // reached by tunnelling to that IPv4 address: judged by it.
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, "6to4", "RFC 3056", NotApplicable, Judged::ByEmbeddedIpv4 { at: 16 }),
    v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48, "Direct Delegation AS112 Service", "RFC 7534", True, Public),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "Documentation", "RFC 9637", False, Refused("a documentation address")),
    v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, "Segment Routing (SRv6) SIDs", "RFC 9602", False, Refused("an SRv6 SID (5f00::/16) address")),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "Unique-Local", "RFC 4193, RFC 8190", False, Refused("a unique local (ULA) address")),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "Link-Local Unicast", "RFC 4291", False, Refused("a link-local address")),
    // Not in the special-purpose registry:
    v6([0; 8], 8, "Reserved by IETF", "RFC 4291", Unlisted, Refused("a reserved (::/8) address")),
    // Deprecated; refused whatever IPv4 address it carries (a stack may still tunnel it).
    v6([0; 8], 96, "IPv4-Compatible IPv6 Address (deprecated)", "RFC 4291, Section 2.5.5.1", Unlisted, Refused("a deprecated IPv4-compatible address")),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "Site-Local (deprecated)", "RFC 3879", Unlisted, Refused("a site-local (deprecated) address")),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "Multicast", "RFC 4291", Unlisted, Refused("a multicast address")),
];

/// The most specific entry of `table` holding `bits` (an address as an integer of `width` bits).
fn most_specific<A: Copy>(
    table: &'static [Special<A>],
    bits: u128,
    width: u32,
    as_bits: impl Fn(A) -> u128,
) -> Option<&'static Special<A>> {
    table
        .iter()
        .filter(|e| {
            let host = width - u32::from(e.len);
            // Every entry is at least a /4, so the shift stays below the width.
            (bits >> host) == (as_bits(e.addr) >> host)
        })
        .max_by_key(|e| e.len)
}

/// The entry deciding `ip` (IPv4-mapped addresses are not unwrapped here), or `None`.
pub fn entry_v4(ip: Ipv4Addr) -> Option<&'static Special<Ipv4Addr>> {
    most_specific(IPV4, u128::from(u32::from(ip)), 32, |a| {
        u128::from(u32::from(a))
    })
}

pub fn entry_v6(ip: Ipv6Addr) -> Option<&'static Special<Ipv6Addr>> {
    most_specific(IPV6, u128::from(ip), 128, u128::from)
}

/// The IPv4 address `v6` carries where its entry judges it by that address (IPv4-mapped, NAT64's
/// well-known prefix, 6to4), or `None`. The one place that unwraps IPv4 from IPv6: every check
/// that must see through the embedding (special-purpose ranges, this host's own addresses) uses
/// it.
pub fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    match entry_v6(v6)?.judged {
        Judged::ByEmbeddedIpv4 { at } => Some(Ipv4Addr::from((u128::from(v6) >> (96 - at)) as u32)),
        _ => None,
    }
}

/// Why a name may not resolve to `ip` without a pin naming it (the words follow "resolved to
/// ADDR, "), or `None` for a public address. IPv4 carried in IPv6 is judged by the IPv4 address
/// where its entry says so.
pub fn refusal(ip: IpAddr) -> Option<&'static str> {
    let judged = match ip {
        IpAddr::V4(v4) => entry_v4(v4)?.judged,
        IpAddr::V6(v6) => {
            if let Some(carried) = embedded_ipv4(v6) {
                return refusal(IpAddr::V4(carried));
            }
            entry_v6(v6)?.judged
        }
    };
    match judged {
        Refused(words) => Some(words),
        Public => None,
        Judged::ByEmbeddedIpv4 { .. } => unreachable!("no IPv4 entry carries an address"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSED: bool = true;
    const ALLOWED: bool = false;

    /// Every registry entry written out again by hand, its first and last address, and whether
    /// a name may resolve there without a pin: the table above must say the same, entry for
    /// entry.
    #[rustfmt::skip]
    const EVERY_ENTRY: &[(&str, &str, &str, bool)] = &[
        ("0.0.0.0/8", "0.0.0.0", "0.255.255.255", REFUSED),
        ("0.0.0.0/32", "0.0.0.0", "0.0.0.0", REFUSED),
        ("10.0.0.0/8", "10.0.0.0", "10.255.255.255", REFUSED),
        ("100.64.0.0/10", "100.64.0.0", "100.127.255.255", REFUSED),
        ("127.0.0.0/8", "127.0.0.0", "127.255.255.255", REFUSED),
        ("169.254.0.0/16", "169.254.0.0", "169.254.255.255", REFUSED),
        ("172.16.0.0/12", "172.16.0.0", "172.31.255.255", REFUSED),
        ("192.0.0.0/24", "192.0.0.0", "192.0.0.255", REFUSED),
        ("192.0.0.0/29", "192.0.0.0", "192.0.0.7", REFUSED),
        ("192.0.0.8/32", "192.0.0.8", "192.0.0.8", REFUSED),
        ("192.0.0.9/32", "192.0.0.9", "192.0.0.9", ALLOWED),
        ("192.0.0.10/32", "192.0.0.10", "192.0.0.10", ALLOWED),
        ("192.0.0.170/32", "192.0.0.170", "192.0.0.170", REFUSED),
        ("192.0.0.171/32", "192.0.0.171", "192.0.0.171", REFUSED),
        ("192.0.2.0/24", "192.0.2.0", "192.0.2.255", REFUSED),
        ("192.31.196.0/24", "192.31.196.0", "192.31.196.255", ALLOWED),
        ("192.52.193.0/24", "192.52.193.0", "192.52.193.255", ALLOWED),
        ("192.88.99.0/24", "192.88.99.0", "192.88.99.255", REFUSED),
        ("192.88.99.2/32", "192.88.99.2", "192.88.99.2", REFUSED),
        ("192.168.0.0/16", "192.168.0.0", "192.168.255.255", REFUSED),
        ("192.175.48.0/24", "192.175.48.0", "192.175.48.255", ALLOWED),
        ("198.18.0.0/15", "198.18.0.0", "198.19.255.255", REFUSED),
        ("198.51.100.0/24", "198.51.100.0", "198.51.100.255", REFUSED),
        ("203.0.113.0/24", "203.0.113.0", "203.0.113.255", REFUSED),
        ("240.0.0.0/4", "240.0.0.0", "255.255.255.255", REFUSED),
        ("255.255.255.255/32", "255.255.255.255", "255.255.255.255", REFUSED),
        ("224.0.0.0/4", "224.0.0.0", "239.255.255.255", REFUSED),
        ("::1/128", "::1", "::1", REFUSED),
        ("::/128", "::", "::", REFUSED),
        // Mapped: judged by the IPv4 address, 0.0.0.0 and 255.255.255.255 at the ends.
        ("::ffff:0:0/96", "::ffff:0.0.0.0", "::ffff:255.255.255.255", REFUSED),
        ("64:ff9b::/96", "64:ff9b::", "64:ff9b::ffff:ffff", REFUSED),
        ("64:ff9b:1::/48", "64:ff9b:1::", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("100::/64", "100::", "100::ffff:ffff:ffff:ffff", REFUSED),
        ("100:0:0:1::/64", "100:0:0:1::", "100:0:0:1:ffff:ffff:ffff:ffff", REFUSED),
        ("2001::/23", "2001::", "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("2001::/32", "2001::", "2001:0:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("2001:1::1/128", "2001:1::1", "2001:1::1", ALLOWED),
        ("2001:1::2/128", "2001:1::2", "2001:1::2", ALLOWED),
        ("2001:1::3/128", "2001:1::3", "2001:1::3", ALLOWED),
        ("2001:2::/48", "2001:2::", "2001:2:0:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("2001:3::/32", "2001:3::", "2001:3:ffff:ffff:ffff:ffff:ffff:ffff", ALLOWED),
        ("2001:4:112::/48", "2001:4:112::", "2001:4:112:ffff:ffff:ffff:ffff:ffff", ALLOWED),
        ("2001:10::/28", "2001:10::", "2001:1f:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("2001:20::/28", "2001:20::", "2001:2f:ffff:ffff:ffff:ffff:ffff:ffff", ALLOWED),
        ("2001:30::/28", "2001:30::", "2001:3f:ffff:ffff:ffff:ffff:ffff:ffff", ALLOWED),
        ("2001:db8::/32", "2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        // 6to4: judged by the IPv4 address, 0.0.0.0 and 255.255.255.255 at the ends.
        ("2002::/16", "2002::", "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("2620:4f:8000::/48", "2620:4f:8000::", "2620:4f:8000:ffff:ffff:ffff:ffff:ffff", ALLOWED),
        ("3fff::/20", "3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("5f00::/16", "5f00::", "5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("fc00::/7", "fc00::", "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("fe80::/10", "fe80::", "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("::/8", "::", "ff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("::/96", "::", "::255.255.255.255", REFUSED),
        ("fec0::/10", "fec0::", "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
        ("ff00::/8", "ff00::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", REFUSED),
    ];

    fn written(addr: IpAddr, len: u8) -> String {
        format!("{addr}/{len}")
    }

    #[test]
    fn every_registry_entrys_first_and_last_address_is_judged_as_decided() {
        let table: Vec<String> = IPV4
            .iter()
            .map(|e| written(IpAddr::V4(e.addr), e.len))
            .chain(IPV6.iter().map(|e| written(IpAddr::V6(e.addr), e.len)))
            .collect();
        let listed: Vec<String> = EVERY_ENTRY
            .iter()
            .map(|(prefix, ..)| {
                let (a, len) = prefix.split_once('/').unwrap();
                written(a.parse().unwrap(), len.parse().unwrap())
            })
            .collect();
        assert_eq!(table, listed, "the table and the test list differ");
        // Every address judged otherwise than decided, so that a failure names them all.
        let wrong: Vec<String> = EVERY_ENTRY
            .iter()
            .flat_map(|&(prefix, first, last, refused)| {
                [first, last].into_iter().filter_map(move |a| {
                    let got = refusal(a.parse().unwrap());
                    (got.is_some() != refused).then(|| format!("{prefix}: {a} judged {got:?}"))
                })
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    /// The rule: not globally reachable is refused, unless the entry is judged by the IPv4
    /// address it carries (each such line gives its reason); globally reachable is public,
    /// unless it carries IPv4.
    #[test]
    fn every_entry_follows_the_rule() {
        let judged = IPV4
            .iter()
            .map(|e| (e.name, e.reachable, e.judged))
            .chain(IPV6.iter().map(|e| (e.name, e.reachable, e.judged)));
        for (name, reachable, judged) in judged {
            match (reachable, judged) {
                (_, Judged::ByEmbeddedIpv4 { .. }) => {}
                (True, j) => assert_eq!(j, Public, "{name}"),
                (_, j) => assert!(matches!(j, Refused(_)), "{name}"),
            }
        }
    }

    #[test]
    fn ipv4_inside_ipv6_is_judged_by_the_ipv4_address() {
        for (a, refused) in [
            ("::ffff:127.0.0.1", REFUSED),
            ("::ffff:1.1.1.1", ALLOWED),
            ("64:ff9b::a9fe:a9fe", REFUSED),
            ("64:ff9b::101:101", ALLOWED),
            ("2002:7f00:1::", REFUSED),
            ("2002:a00:1::", REFUSED),
            ("2002:101:101::1", ALLOWED),
            // IPv4-compatible: refused whatever it carries.
            ("::1.1.1.1", REFUSED),
            ("::127.0.0.1", REFUSED),
        ] {
            assert_eq!(refusal(a.parse().unwrap()).is_some(), refused, "{a}");
        }
        assert_eq!(
            refusal("64:ff9b::7f00:1".parse().unwrap()),
            Some("a loopback address")
        );
    }
}
