//! The policy of one session: which destinations may be reached at all.
//!
//! A pattern is `HOST[:PORT][=ADDR[,ADDR…]]`:
//! - `HOST` is a name (`api.example.org`), a wildcard (`*.example.org`: subdomains only, never
//!   `example.org` itself), or an IP literal (`192.0.2.7`, `[2001:db8::1]`).
//! - Without `:PORT` the pattern allows ports 80 and 443 (the web's two), with it that port only.
//! - `=ADDR,…` pins the name: the proxy still resolves it, but every address it resolves to must
//!   be one of these, and these (being named literally) may be private or loopback. A clone's
//!   or a tool's pin where its parent leaves the name unpinned is held to the parent's address
//!   rule ([`unpinned_refusal`], in [`Policy::widenings`]).
//!
//! Matching is on the lowercase ASCII name without a trailing dot.
//!
//! Why one file: the pattern grammar and the check it feeds are ≈ 430 lines; the rest are their
//! tests.

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use super::special;

/// Ports a pattern without `:PORT` allows.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Exactly this name.
    Name(String),
    /// Any name ending in `.<suffix>` (the suffix itself does not match).
    Subdomains(String),
    /// Exactly this address, given as a literal by the client.
    Ip(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    pub host: HostPattern,
    /// `None`: [`DEFAULT_PORTS`].
    pub port: Option<u16>,
    /// The only addresses the name may resolve to (empty: any public address).
    pub pin: Vec<IpAddr>,
}

/// A destination as the client named it: a host name or an IP literal, and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadHost(pub String);

impl Host {
    /// A host as a client sends it: an IP literal (IPv6 in brackets) or a DNS name of ASCII
    /// letters, digits, `-` and `_` in dot-separated labels of 1–63 bytes, 253 bytes at most.
    /// Lowercased; one trailing dot dropped.
    pub fn parse(text: &str) -> Result<Host, BadHost> {
        if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            return inner
                .parse::<Ipv6Addr>()
                .map(|ip| Host::Ip(IpAddr::V6(ip)))
                .map_err(|_| BadHost(format!("`{text}` is not an IPv6 address")));
        }
        if let Ok(ip) = text.parse::<Ipv4Addr>() {
            return Ok(Host::Ip(IpAddr::V4(ip)));
        }
        let name = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(BadHost(format!("`{text}` is not a host name")));
        }
        // All-numeric dotted names (`127.1`, `0x7f.1`) are addresses to some resolvers: never
        // let one pass as a name.
        if name
            .split('.')
            .all(|l| l.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(BadHost(format!("`{text}` is not a host name")));
        }
        Ok(Host::Name(name))
    }
}

/// Splits `host:port` / `[v6]:port` (the authority of CONNECT or a URL).
pub fn split_authority(text: &str) -> Option<(&str, Option<u16>)> {
    if text.starts_with('[') {
        let end = text.find(']')?;
        let (host, rest) = text.split_at(end + 1);
        return match rest {
            "" => Some((host, None)),
            _ => Some((host, Some(rest.strip_prefix(':')?.parse().ok()?))),
        };
    }
    match text.rsplit_once(':') {
        Some((host, port)) => Some((host, Some(port.parse().ok()?))),
        None => Some((text, None)),
    }
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Pattern, String> {
        let bad = |why: &str| format!("bad pattern `{text}`: {why}");
        let (dest, pin) = match text.split_once('=') {
            Some((d, p)) => (d, Some(p)),
            None => (text, None),
        };
        let pin = match pin {
            None => Vec::new(),
            Some(p) => p
                .split(',')
                .map(|a| {
                    let a = a
                        .strip_prefix('[')
                        .and_then(|a| a.strip_suffix(']'))
                        .unwrap_or(a);
                    a.parse::<IpAddr>()
                        .map_err(|_| bad(&format!("`{a}` is not an IP address")))
                })
                .collect::<Result<_, _>>()?,
        };
        let (host, port) = split_authority(dest).ok_or_else(|| bad("bad port"))?;
        if port == Some(0) {
            return Err(bad("port 0"));
        }
        let host = if let Some(suffix) = host.strip_prefix("*.") {
            match Host::parse(suffix) {
                Ok(Host::Name(n)) => HostPattern::Subdomains(n),
                _ => return Err(bad("`*.` must be followed by a host name")),
            }
        } else {
            match Host::parse(host).map_err(|e| bad(&e.0))? {
                Host::Name(n) => HostPattern::Name(n),
                Host::Ip(ip) => HostPattern::Ip(ip),
            }
        };
        if matches!(host, HostPattern::Ip(_)) && !pin.is_empty() {
            return Err(bad("an IP literal takes no `=` pin"));
        }
        Ok(Pattern { host, port, pin })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Name(n) => f.write_str(n)?,
            HostPattern::Subdomains(s) => write!(f, "*.{s}")?,
            HostPattern::Ip(ip) => write!(f, "{}", Host::Ip(*ip))?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        for (i, a) in self.pin.iter().enumerate() {
            f.write_str(if i == 0 { "=" } else { "," })?;
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

impl Pattern {
    fn allows_port(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }

    fn matches(&self, host: &Host, port: u16) -> bool {
        if !self.allows_port(port) {
            return false;
        }
        match (&self.host, host) {
            (HostPattern::Name(p), Host::Name(n)) => p == n,
            (HostPattern::Subdomains(s), Host::Name(n)) => n
                .strip_suffix(s.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (HostPattern::Ip(p), Host::Ip(ip)) => canonical(*p) == canonical(*ip),
            _ => false,
        }
    }
}

/// What the policy says about a destination before anything is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listed {
    /// A name on the list; its addresses must be public, or all in `pin` when that is not empty.
    Name { pin: Vec<IpAddr> },
    /// An IP literal that a pattern names exactly: allowed whatever its range.
    Ip,
}

/// A session's allow list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub patterns: Vec<Pattern>,
}

impl Policy {
    pub fn new(patterns: Vec<Pattern>) -> Policy {
        Policy { patterns }
    }

    /// Parses one pattern per item.
    pub fn parse<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Policy, String> {
        Ok(Policy {
            patterns: items
                .into_iter()
                .map(str::parse)
                .collect::<Result<_, _>>()?,
        })
    }

    /// Parses a policy file: one pattern per line; blank lines and `#` comments skipped.
    pub fn parse_file(text: &str) -> Result<Policy, String> {
        Policy::parse(
            text.lines()
                .map(|l| l.split('#').next().unwrap_or("").trim())
                .filter(|l| !l.is_empty()),
        )
    }

    /// Whether `host:port` is on the list, and on what terms. Every pattern that matches a name
    /// adds its pin; a name matched by an unpinned pattern has no pin (any public address).
    pub fn lookup(&self, host: &Host, port: u16) -> Option<Listed> {
        let matching: Vec<&Pattern> = self
            .patterns
            .iter()
            .filter(|p| p.matches(host, port))
            .collect();
        if matching.is_empty() {
            return None;
        }
        if matches!(host, Host::Ip(_)) {
            return Some(Listed::Ip);
        }
        let pin = if matching.iter().any(|p| p.pin.is_empty()) {
            Vec::new()
        } else {
            matching
                .iter()
                .flat_map(|p| p.pin.iter().copied())
                .collect()
        };
        Some(Listed::Name { pin })
    }
}

impl Policy {
    /// Where `child` allows more than `self`: one line per widening, empty when `self` covers
    /// it. Exact for what [`Policy::lookup`] decides: each child pattern is checked at every
    /// port it allows and at a representative of every class of names it matches (a class is
    /// the set of patterns of either policy a name matches, so a name of each class stands for
    /// all of its class), and at each the child's terms must be within the parent's: listed
    /// there too; a pinned child within the parent's pin; an unpinned child (any public address)
    /// only where the parent is unpinned; where the parent is unpinned, a child pin only to
    /// addresses the parent's own resolution would take ([`unpinned_refusal`]: public, and not
    /// this host's now).
    pub fn widenings(&self, child: &Policy) -> Vec<String> {
        self.widenings_given(child, &own_addresses())
    }

    /// [`Policy::widenings`] with `own` as this host's addresses.
    fn widenings_given(&self, child: &Policy, own: &HashSet<IpAddr>) -> Vec<String> {
        let mut out = Vec::new();
        for c in &child.patterns {
            let ports: Vec<u16> = match c.port {
                Some(p) => vec![p],
                None => DEFAULT_PORTS.to_vec(),
            };
            for host in self.representatives(child, &c.host) {
                for &port in &ports {
                    if let Some(why) =
                        widened_at(self.lookup(&host, port), child.lookup(&host, port), own)
                    {
                        out.push(format!("{c}: {host}:{port} {why}"));
                        break;
                    }
                }
            }
        }
        out.dedup();
        out
    }

    /// Names standing for every class of names `host` matches, with respect to the patterns of
    /// `self` and `other`.
    fn representatives(&self, other: &Policy, host: &HostPattern) -> Vec<Host> {
        let suffix = match host {
            HostPattern::Name(n) => return vec![Host::Name(n.clone())],
            HostPattern::Ip(ip) => return vec![Host::Ip(*ip)],
            HostPattern::Subdomains(s) => s,
        };
        let all: Vec<&HostPattern> = self
            .patterns
            .iter()
            .chain(&other.patterns)
            .map(|p| &p.host)
            .collect();
        // A label no pattern names, so `fresh.<suffix>` falls in no exact name's class.
        let mut fresh = String::from("x-covers-probe");
        while all.iter().any(|h| match h {
            HostPattern::Name(n) | HostPattern::Subdomains(n) => n.contains(fresh.as_str()),
            HostPattern::Ip(_) => false,
        }) {
            fresh.push('x');
        }
        let under = |n: &str| {
            n.strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
        };
        let mut out = Vec::new();
        for h in all {
            match h {
                HostPattern::Name(n) if under(n) => out.push(Host::Name(n.clone())),
                HostPattern::Subdomains(t) if t == suffix || under(t) => {
                    out.push(Host::Name(format!("{fresh}.{t}")))
                }
                _ => {}
            }
        }
        out.dedup();
        out
    }
}

/// Why the child's terms for one destination are wider than the parent's, or `None`.
fn widened_at(
    parent: Option<Listed>,
    child: Option<Listed>,
    own: &HashSet<IpAddr>,
) -> Option<String> {
    let child = child?;
    let Some(parent) = parent else {
        return Some("is not in the parent's list".into());
    };
    match (parent, child) {
        (_, Listed::Ip) | (Listed::Ip, _) => None,
        (Listed::Name { pin: p }, Listed::Name { pin: c }) if c.is_empty() => (!p.is_empty())
            .then(|| "may resolve to any public address; the parent pins it".to_string()),
        // The parent takes any address its resolution allows: the child's pin, by that rule.
        (Listed::Name { pin: p }, Listed::Name { pin: c }) if p.is_empty() => {
            c.iter().find_map(|a| {
                unpinned_refusal(*a, own).map(|why| {
                    format!("is pinned to {a}, {why}, which the parent does not allow for it")
                })
            })
        }
        (Listed::Name { pin: p }, Listed::Name { pin: c }) => {
            let outside = c
                .iter()
                .find(|a| !p.iter().any(|b| canonical(*b) == canonical(**a)))?;
            Some(format!(
                "is pinned to {outside}, which the parent does not allow for it"
            ))
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is; everything else as it is.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Why a name may not resolve to `ip` unless the policy names the address (words that follow
/// "resolved to ADDR, "), or `None` for a public address: the IANA special-purpose registries'
/// entries that are not globally reachable, and multicast ([`special`]). IPv4 inside IPv6
/// (mapped, NAT64's well-known prefix, 6to4) is judged by the IPv4 address it carries.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    special::refusal(canonical(ip))
}

/// The address rule for a name no pin constrains, in one place for every address that enters
/// under it: an address the proxy resolved for an unpinned name, and an address a clone's or a
/// tool's pattern pins where its parent's list leaves the name unpinned. Refused: a non-public
/// address, and any address of this host's interfaces (`own`), also written as IPv6 carrying it
/// (IPv4-mapped, NAT64, 6to4: the same host is reached).
pub fn unpinned_refusal(ip: IpAddr, own: &HashSet<IpAddr>) -> Option<&'static str> {
    let carried = match ip {
        IpAddr::V6(v6) => special::embedded_ipv4(v6).map(IpAddr::V4),
        IpAddr::V4(_) => None,
    };
    non_public(ip).or_else(|| {
        (own.contains(&canonical(ip)) || carried.is_some_and(|v4| own.contains(&v4)))
            .then_some("an address of this host")
    })
}

/// The addresses of this host's interfaces now (read each time they are needed: they change).
pub fn own_addresses() -> HashSet<IpAddr> {
    let mut own = HashSet::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            let Some(sa) = a.address else { continue };
            if let Some(v4) = sa.as_sockaddr_in() {
                own.insert(IpAddr::V4(v4.ip()));
            } else if let Some(v6) = sa.as_sockaddr_in6() {
                own.insert(canonical(IpAddr::V6(v6.ip())));
            }
        }
    }
    own
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> Host {
        Host::parse(n).unwrap()
    }

    #[test]
    fn patterns_parse_and_print_back() {
        for p in [
            "api.example.org",
            "api.example.org:8443",
            "*.example.org",
            "192.0.2.7:22",
            "[2001:db8::1]:443",
            "api.test:8080=127.0.0.1",
            "git.corp=10.0.0.5,10.0.0.6",
        ] {
            let parsed: Pattern = p.parse().unwrap();
            assert_eq!(parsed.to_string(), p);
        }
        for bad in [
            "",
            "*.",
            "*",
            "a..b",
            "api.test:0",
            "api.test:99999",
            "api.test:x",
            "1.2.3.4=1.2.3.4",
            "api.test=notanip",
            "exa mple.org",
            "127.1",
            "*.*.example.org",
            "ex/ample.org",
        ] {
            assert!(bad.parse::<Pattern>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_wildcard_matches_subdomains_only_and_ports_default_to_80_and_443() {
        let policy = Policy::parse(["*.example.org", "api.test:8080"]).unwrap();
        let yes = |h: &str, p| policy.lookup(&name(h), p).is_some();
        assert!(yes("a.example.org", 443));
        assert!(yes("a.b.example.org", 80));
        assert!(yes("A.Example.ORG.", 443));
        assert!(!yes("example.org", 443));
        assert!(!yes("badexample.org", 443));
        assert!(!yes("a.example.org", 8443));
        assert!(yes("api.test", 8080));
        assert!(!yes("api.test", 443));
        assert!(!yes("other.test", 8080));
    }

    #[test]
    fn an_ip_is_listed_only_when_a_pattern_names_it() {
        let policy = Policy::parse(["203.0.113.9:443", "api.test=127.0.0.1"]).unwrap();
        let ip = |s: &str| Host::Ip(s.parse().unwrap());
        assert_eq!(policy.lookup(&ip("203.0.113.9"), 443), Some(Listed::Ip));
        assert_eq!(
            policy.lookup(&ip("::ffff:203.0.113.9"), 443),
            Some(Listed::Ip)
        );
        assert_eq!(policy.lookup(&ip("203.0.113.10"), 443), None);
        // The pin of a name does not list the address itself.
        assert_eq!(policy.lookup(&ip("127.0.0.1"), 443), None);
        assert_eq!(
            policy.lookup(&name("api.test"), 80),
            Some(Listed::Name {
                pin: vec!["127.0.0.1".parse().unwrap()]
            })
        );
    }

    #[test]
    fn an_unpinned_pattern_for_the_same_name_widens_to_public_addresses() {
        let policy = Policy::parse(["api.test=127.0.0.1", "*.test"]).unwrap();
        assert_eq!(
            policy.lookup(&name("api.test"), 443),
            Some(Listed::Name { pin: vec![] })
        );
        let policy = Policy::parse(["api.test=127.0.0.1", "api.test=127.0.0.2"]).unwrap();
        assert_eq!(
            policy.lookup(&name("api.test"), 443),
            Some(Listed::Name {
                pin: vec!["127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap()]
            })
        );
    }

    #[test]
    fn special_ranges_are_not_public() {
        for a in [
            "0.0.0.0",
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "::127.0.0.1",
        ] {
            assert!(non_public(a.parse().unwrap()).is_some(), "{a} public");
        }
        for a in [
            "1.1.1.1",
            "172.15.0.1",
            "172.32.0.1",
            "100.63.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "64:ff9b::101:101",
            "::ffff:1.1.1.1",
        ] {
            assert_eq!(non_public(a.parse().unwrap()), None, "{a}");
        }
    }

    #[test]
    fn hosts_are_validated() {
        assert_eq!(name("API.test."), Host::Name("api.test".into()));
        assert_eq!(Host::parse("[::1]"), Ok(Host::Ip("::1".parse().unwrap())));
        for bad in [
            "",
            ".",
            "a b",
            "a..b",
            "ex\u{e9}.org",
            "1.2.3",
            "0x7f.1.2.3x/",
        ] {
            assert!(Host::parse(bad).is_err(), "{bad:?}");
        }
    }

    fn widenings(parent: &[&str], child: &[&str]) -> Vec<String> {
        let p = Policy::parse(parent.iter().copied()).unwrap();
        let c = Policy::parse(child.iter().copied()).unwrap();
        p.widenings(&c)
    }

    #[test]
    fn a_child_policy_is_covered_only_within_its_parents() {
        let parent = [
            "api.test:8080=127.0.0.1",
            "*.example.org",
            "pypi.org",
            "192.0.2.7:22",
            "git.corp:22=10.0.0.5,10.0.0.6",
        ];
        for narrower in [
            &[][..],
            &["api.test:8080=127.0.0.1"],
            &["a.example.org", "*.b.example.org:443"],
            &["pypi.org:443", "192.0.2.7:22"],
            &["git.corp:22=10.0.0.6"],
            &["pypi.org=151.101.0.223"],
        ] {
            assert_eq!(
                widenings(&parent, narrower),
                Vec::<String>::new(),
                "{narrower:?}"
            );
        }
        for (wider, why) in [
            (&["other.test"][..], "not in the parent's list"),
            (&["api.test:8081=127.0.0.1"], "not in the parent's list"),
            (&["api.test:8080"], "any public address"),
            (&["api.test:8080=127.0.0.2"], "pinned to 127.0.0.2"),
            (&["example.org"], "not in the parent's list"),
            (&["*.org"], "not in the parent's list"),
            (&["*.example.org:22"], "not in the parent's list"),
            (&["pypi.org=127.0.0.1"], "pinned to 127.0.0.1"),
            (&["192.0.2.8:22"], "not in the parent's list"),
            (&["git.corp:22=10.0.0.7"], "pinned to 10.0.0.7"),
        ] {
            let got = widenings(&parent, wider);
            assert!(got.len() == 1 && got[0].contains(why), "{wider:?}: {got:?}");
        }
    }

    /// Where the parent leaves a name unpinned (its resolution takes public addresses that are
    /// not this host's), a child's pin is held to that same rule: a pin to an address of this
    /// host, or to a non-public one of any registry entry, widens; a public one narrows.
    #[test]
    fn a_pin_under_an_unpinned_parent_takes_the_parents_address_rule() {
        let own: HashSet<IpAddr> = ["11.231.0.1".parse().unwrap(), "::1".parse().unwrap()].into();
        let parent = Policy::parse(["own.test:8080", "*.example.org"]).unwrap();
        let widened = |child: &str| parent.widenings_given(&Policy::parse([child]).unwrap(), &own);
        let got = widened("own.test:8080=11.231.0.1");
        assert_eq!(
            got,
            [
                "own.test:8080=11.231.0.1: own.test:8080 is pinned to 11.231.0.1, an address of \
              this host, which the parent does not allow for it"
            ]
        );
        for (child, why) in [
            (
                "own.test:8080=[::ffff:11.231.0.1]",
                "an address of this host",
            ),
            (
                "own.test:8080=1.1.1.1,11.231.0.1",
                "an address of this host",
            ),
            ("a.example.org=[64:ff9b:1::1]", "local-use NAT64"),
            ("a.example.org=[2001::1]", "Teredo"),
            ("a.example.org=[100::1]", "discard-only"),
            ("a.example.org=[2001:2::1]", "benchmarking"),
            ("a.example.org=[2001:10::1]", "ORCHID"),
            ("a.example.org=127.0.0.1", "loopback"),
        ] {
            let got = widened(child);
            assert!(got.len() == 1 && got[0].contains(why), "{child}: {got:?}");
        }
        assert_eq!(widened("own.test:8080=1.1.1.1"), Vec::<String>::new());
        assert_eq!(
            widened("a.example.org=[2606:4700::1111]"),
            Vec::<String>::new()
        );
    }

    /// An address of this host is refused however IPv6 carries it: plain, IPv4-mapped, NAT64
    /// (64:ff9b::/96) and 6to4 (2002::/16) all reach the same host, both as a clone's pin and as
    /// what an unpinned name resolves to. IPv4-compatible (deprecated) is refused whatever it
    /// carries, before the own-address rule.
    #[test]
    fn every_embedding_of_an_own_ipv4_address_is_an_address_of_this_host() {
        let own: HashSet<IpAddr> = ["11.231.7.1".parse().unwrap()].into();
        for written in [
            "11.231.7.1",
            "::ffff:11.231.7.1",
            "64:ff9b::be7:701",
            "2002:be7:701::1",
            "2002:be7:701:ffff:ffff:ffff:ffff:ffff",
        ] {
            assert_eq!(
                unpinned_refusal(written.parse().unwrap(), &own),
                Some("an address of this host"),
                "{written}"
            );
        }
        assert_eq!(
            unpinned_refusal("::11.231.7.1".parse().unwrap(), &own),
            Some("a deprecated IPv4-compatible address")
        );
        // The same IPv4 address's neighbours stay public: only the carried address decides.
        for public in ["11.231.7.2", "64:ff9b::be7:702", "2002:be7:702::1"] {
            assert_eq!(
                unpinned_refusal(public.parse().unwrap(), &own),
                None,
                "{public}"
            );
        }
        // And as a clone's pin where the parent leaves the name unpinned.
        let parent = Policy::parse(["own.test:8080"]).unwrap();
        for pin in ["[64:ff9b::be7:701]", "[2002:be7:701::1]"] {
            let child = Policy::parse([format!("own.test:8080={pin}").as_str()]).unwrap();
            let got = parent.widenings_given(&child, &own);
            assert!(
                got.len() == 1 && got[0].contains("an address of this host"),
                "{pin}: {got:?}"
            );
        }
    }

    #[test]
    fn loopback_is_among_own_addresses() {
        assert!(own_addresses().contains(&"127.0.0.1".parse::<IpAddr>().unwrap()));
    }

    #[test]
    fn coverage_follows_lookup_where_the_parents_patterns_overlap() {
        // For a.example.org the parent's unpinned `*.example.org` lifts the pin of its
        // `a.example.org=10.0.0.1` (public addresses only), so the child's pin to 10.0.0.1 is
        // wider there, though a pattern of the parent's reads the same.
        let got = widenings(
            &["a.example.org=10.0.0.1", "*.example.org"],
            &["a.example.org=10.0.0.1"],
        );
        assert!(
            got.len() == 1 && got[0].contains("pinned to 10.0.0.1"),
            "{got:?}"
        );
        // A child wildcard over a parent whose exact name is pinned: that name is pinned in
        // the parent, any public address in the child.
        let got = widenings(
            &["*.example.org=192.0.2.1", "a.example.org=192.0.2.1"],
            &["*.example.org"],
        );
        assert!(!got.is_empty(), "{got:?}");
        assert_eq!(
            widenings(
                &["*.example.org", "a.example.org=10.0.0.1"],
                &["*.example.org"]
            ),
            Vec::<String>::new()
        );
    }
}
