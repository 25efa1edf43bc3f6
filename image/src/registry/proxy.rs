//! The registry client's egress proxy: which proxy a request to a host
//! goes through (`https` for HTTPS endpoints, `http` for plain ones, none
//! for a host `no_proxy` names), as the host's config sets it. Without
//! settings the client keeps ureq's default (the `HTTPS_PROXY`/`NO_PROXY`
//! environment); with them the environment is ignored.

use std::path::PathBuf;

/// An egress proxy for every registry request of one client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxySettings {
    /// The proxy for HTTPS endpoints (`http://host:port` or
    /// `https://host:port`).
    pub https: Option<String>,
    /// The proxy for plain-HTTP endpoints.
    pub http: Option<String>,
    /// Hosts reached directly: `*` (all), a host or IP (exact), a CIDR
    /// (`10.0.0.0/8`), a domain (`example.com`, `.example.com` or
    /// `*.example.com`: the domain's hosts; the first form also the domain
    /// itself).
    pub no_proxy: Vec<String>,
    /// PEM CA certificate(s) of a TLS-inspecting (or `https://`) proxy: a
    /// request through the proxy is checked against them (and the
    /// registry's own `ca_file`), not the public roots.
    pub ca_file: Option<PathBuf>,
}

/// [`ProxySettings`] with its URLs parsed.
pub(super) struct Proxies {
    https: Option<ureq::Proxy>,
    http: Option<ureq::Proxy>,
    no_proxy: Vec<String>,
    pub(super) ca_file: Option<PathBuf>,
}

impl Proxies {
    /// Parses the settings' URLs; an error names the field.
    pub(super) fn new(s: &ProxySettings) -> Result<Proxies, String> {
        let parse = |field: &str, url: &Option<String>| {
            url.as_deref()
                .map(|u| ureq::Proxy::new(u).map_err(|e| format!("proxy.{field} {u:?}: {e}")))
                .transpose()
        };
        Ok(Proxies {
            https: parse("https", &s.https)?,
            http: parse("http", &s.http)?,
            no_proxy: s.no_proxy.clone(),
            ca_file: s.ca_file.clone(),
        })
    }

    /// The proxy a request to `scheme://authority` goes through; `None`:
    /// directly.
    pub(super) fn for_request(&self, scheme: &str, authority: &str) -> Option<ureq::Proxy> {
        if bypassed(&self.no_proxy, authority) {
            return None;
        }
        match scheme {
            "https" => self.https.clone(),
            _ => self.http.clone(),
        }
    }
}

/// The host of `authority` (`host[:port]`, `[v6]:port`), lower-cased.
fn host_of(authority: &str) -> String {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else if authority.matches(':').count() > 1 {
        authority
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    host.to_ascii_lowercase()
}

/// Whether `no_proxy` sends requests to `authority` directly.
pub fn bypassed(no_proxy: &[String], authority: &str) -> bool {
    let host = host_of(authority);
    no_proxy.iter().any(|entry| {
        let entry = entry.trim().to_ascii_lowercase();
        let entry = host_of(&entry);
        if entry.is_empty() {
            return false;
        }
        if entry == "*" {
            return true;
        }
        if let Some((net, len)) = entry.split_once('/') {
            return in_cidr(&host, net, len);
        }
        if let Some(domain) = entry.strip_prefix("*.").or_else(|| entry.strip_prefix('.')) {
            return host.ends_with(&format!(".{domain}"));
        }
        host == entry || host.ends_with(&format!(".{entry}"))
    })
}

/// Whether IP `host` lies in `net/len` (a host name never does).
fn in_cidr(host: &str, net: &str, len: &str) -> bool {
    use std::net::IpAddr;
    let (Ok(ip), Ok(net), Ok(len)) = (
        host.parse::<IpAddr>(),
        net.parse::<IpAddr>(),
        len.parse::<u32>(),
    ) else {
        return false;
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) if len <= 32 => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if len <= 128 => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_proxy_matches_hosts_domains_and_everything() {
        let np =
            |l: &[&str], a: &str| bypassed(&l.iter().map(|s| s.to_string()).collect::<Vec<_>>(), a);
        assert!(np(&["registry.corp"], "registry.corp:5000"));
        assert!(np(&["corp"], "registry.corp"));
        assert!(np(&[".corp"], "registry.corp"));
        assert!(!np(&[".corp"], "corp"));
        assert!(np(&["*.corp"], "a.b.corp:443"));
        assert!(!np(&["corp"], "notcorp"));
        assert!(np(&["*"], "anything"));
        assert!(np(&["127.0.0.1"], "127.0.0.1:5000"));
        assert!(np(&["::1"], "[::1]:5000"));
        assert!(np(&["Registry.Corp:5000"], "registry.corp"));
        assert!(!np(&[], "registry.corp"));
        assert!(!np(&[""], "registry.corp"));
        assert!(np(&["10.0.0.0/8"], "10.1.2.3:5000"));
        assert!(!np(&["10.0.0.0/8"], "11.1.2.3"));
        assert!(np(&["0.0.0.0/0"], "192.0.2.1"));
        assert!(np(&["fd00::/8"], "[fd12::1]:443"));
        assert!(!np(&["10.0.0.0/8"], "ten.corp"));
    }

    #[test]
    fn requests_pick_the_proxy_of_their_scheme() {
        let p = Proxies::new(&ProxySettings {
            https: Some("http://proxy.corp:3128".into()),
            http: None,
            no_proxy: vec!["mirror.corp".into()],
            ca_file: None,
        })
        .unwrap();
        assert_eq!(
            p.for_request("https", "ghcr.io")
                .map(|p| p.host().to_string()),
            Some("proxy.corp".into())
        );
        assert!(p.for_request("http", "plain.corp:5000").is_none());
        assert!(p.for_request("https", "mirror.corp:443").is_none());
    }
}
