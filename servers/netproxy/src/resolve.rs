//! Name resolution, done by the proxy (never by the client), and the host's own addresses.
//!
//! Names go to the host's own resolver (`getaddrinfo`, through `tokio::net::lookup_host`), the
//! one every other program on the host uses: /etc/hosts, nsswitch and the configured DNS
//! servers apply as the operator set them. Given DNS servers of its own (`--dns`), the proxy
//! asks them instead, with `hickory-resolver` (A and AAAA, no search domains, no hosts file). A
//! hosts file given to the proxy (`--hosts`, the /etc/hosts format) is consulted first, and a
//! name it lists is answered from it alone.

use std::collections::HashMap;
use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

use crate::policy::{Host, canonical};

#[derive(Debug, Clone, Default)]
pub struct Resolver {
    hosts: HashMap<String, Vec<IpAddr>>,
    /// The DNS servers asked instead of the host's resolver (`--dns`), if any.
    dns: Option<Arc<hickory_resolver::TokioResolver>>,
}

impl Resolver {
    /// Only the host's resolver.
    pub fn system() -> Resolver {
        Resolver::default()
    }

    /// The host's resolver, overridden by the /etc/hosts-format text `hosts`: `ADDR NAME…` per
    /// line, `#` comments. A malformed line is an error (a typo must not fall through to DNS).
    pub fn with_hosts(hosts: &str) -> Result<Resolver, String> {
        let mut map: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (i, line) in hosts.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let Some(addr) = words.next() else { continue };
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| format!("hosts line {}: `{addr}` is not an address", i + 1))?;
            let mut named = false;
            for name in words {
                match Host::parse(name) {
                    Ok(Host::Name(n)) => map.entry(n).or_default().push(addr),
                    _ => return Err(format!("hosts line {}: `{name}` is not a name", i + 1)),
                }
                named = true;
            }
            if !named {
                return Err(format!("hosts line {}: an address without a name", i + 1));
            }
        }
        Ok(Resolver {
            hosts: map,
            dns: None,
        })
    }

    /// Asks `servers` (UDP, then TCP for a truncated answer) instead of the host's resolver;
    /// none: the host's resolver stays. Both A and AAAA are asked, so every address a name has
    /// is checked; names are asked as given (no search domains) and no hosts file is read.
    pub fn with_dns(mut self, servers: &[SocketAddr]) -> Result<Resolver, String> {
        if servers.is_empty() {
            return Ok(self);
        }
        let name_servers = servers
            .iter()
            .map(|s| {
                let connections = [ConnectionConfig::udp(), ConnectionConfig::tcp()]
                    .into_iter()
                    .map(|mut c| {
                        c.port = s.port();
                        c
                    })
                    .collect();
                NameServerConfig::new(s.ip(), true, connections)
            })
            .collect();
        let config = ResolverConfig::from_parts(None, Vec::new(), name_servers);
        let mut builder = hickory_resolver::Resolver::builder_with_config(
            config,
            TokioRuntimeProvider::default(),
        );
        let options = builder.options_mut();
        options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        options.use_hosts_file = ResolveHosts::Never;
        options.ndots = 0;
        let resolver = builder.build().map_err(|e| format!("DNS resolver: {e}"))?;
        self.dns = Some(Arc::new(resolver));
        Ok(self)
    }

    pub fn from_hosts_file(path: &Path) -> Result<Resolver, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Resolver::with_hosts(&text)
    }

    /// Every address `name` resolves to, each once, in the resolver's order.
    pub async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        if let Some(addrs) = self.hosts.get(name) {
            return Ok(addrs.clone());
        }
        let mut seen = HashSet::new();
        let addrs: Vec<IpAddr> = match &self.dns {
            // Fully qualified: the name as the client gave it, never a search domain's.
            Some(dns) => dns
                .lookup_ip(format!("{name}."))
                .await
                .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e.to_string()))?
                .iter()
                .map(canonical)
                .filter(|ip| seen.insert(*ip))
                .collect(),
            None => tokio::net::lookup_host((name, 0))
                .await?
                .map(|a| a.ip())
                .filter(|ip| seen.insert(*ip))
                .collect(),
        };
        if addrs.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no address"));
        }
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_in_the_hosts_file_is_answered_from_it() {
        let r =
            Resolver::with_hosts("# test\n127.0.0.1 api.test Rebind.test\n::1 api.test\n").unwrap();
        assert_eq!(
            r.resolve("api.test").await.unwrap(),
            vec![
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        assert_eq!(r.resolve("rebind.test").await.unwrap().len(), 1);
    }

    #[test]
    fn a_malformed_hosts_file_is_refused() {
        for bad in ["127.0.0.1\n", "localhost 127.0.0.1\n", "127.0.0.1 a/b\n"] {
            assert!(Resolver::with_hosts(bad).is_err(), "{bad:?}");
        }
    }
}
