//! The config's `proxy` section: the egress proxy of a host that reaches
//! its registries (and the node its cluster's) only through one, used by
//! the activator's own registry client and rendered as the environment of
//! the node's containerd and kubelet. Only the schema and its checks.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `proxy`: like Bottlerocket's `settings.network.https-proxy` or AKS's
/// `httpProxyConfig`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// The proxy for HTTPS (`http://host:port` or `https://host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<String>,
    /// The proxy for plain HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// Hosts, IPs and domains reached directly (`*`, `registry.corp`,
    /// `.corp`, `*.corp`, `10.0.0.1`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_proxy: Vec<String>,
    /// PEM CA certificate(s) (a host path) of a TLS-inspecting or
    /// `https://` proxy: requests through it are checked against them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
}

impl ProxyConfig {
    /// What serde cannot check: URLs that are `http(s)://host[:port]` (user
    /// info percent-encoded), `no_proxy` entries that are host names, IPs
    /// or domains; nothing that would break a unit's `Environment=` line.
    /// Returns the field and the reason.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.https.is_none() && self.http.is_none() {
            return Err(("proxy", "names neither an https nor an http proxy".into()));
        }
        for (field, url) in [("proxy.https", &self.https), ("proxy.http", &self.http)] {
            if let Some(url) = url {
                check_url(url).map_err(|r| (field, format!("{url:?} {r}")))?;
            }
        }
        for entry in &self.no_proxy {
            let ok = !entry.is_empty()
                && entry
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-.*:[]/_".contains(c));
            if !ok {
                return Err((
                    "proxy.no_proxy",
                    format!("{entry:?} is not a host, IP or domain"),
                ));
            }
        }
        if let Some(ca) = &self.ca {
            if !ca.is_absolute() {
                return Err((
                    "proxy.ca",
                    format!("{} is not an absolute path", ca.display()),
                ));
            }
        }
        Ok(())
    }
}

fn check_url(url: &str) -> Result<(), &'static str> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("is not an http:// or https:// URL")?;
    let authority = rest.trim_end_matches('/');
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() || authority.contains('/') {
        return Err("must be scheme://[user:password@]host[:port], nothing after it");
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~:@[]%!$&'()*+,;=".contains(c);
    if !authority.chars().all(allowed) || authority.contains('\'') {
        return Err("holds a character a URL authority cannot (whitespace, quotes, backslashes)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(https: &str) -> ProxyConfig {
        ProxyConfig {
            https: Some(https.into()),
            ..ProxyConfig::default()
        }
    }

    #[test]
    fn proxy_urls_and_no_proxy_entries_are_checked() {
        assert!(with("http://proxy.corp:3128").check().is_ok());
        assert!(with("https://u:p%40ss@proxy.corp").check().is_ok());
        assert!(with("http://[::1]:3128/").check().is_ok());
        for bad in [
            "proxy.corp:3128",
            "socks5://proxy.corp",
            "http://",
            "http://proxy.corp/path",
            "http://proxy corp",
            "http://proxy\".corp",
            "http://proxy\\corp",
        ] {
            let (field, _) = with(bad).check().unwrap_err();
            assert_eq!(field, "proxy.https", "{bad}");
        }
        assert_eq!(ProxyConfig::default().check().unwrap_err().0, "proxy");
        let mut c = with("http://p:1");
        c.no_proxy = vec!["ok.corp".into(), "bad entry".into()];
        assert_eq!(c.check().unwrap_err().0, "proxy.no_proxy");
        c.no_proxy = vec![".corp".into(), "10.0.0.0/8".into(), "*".into()];
        c.ca = Some("relative.pem".into());
        assert_eq!(c.check().unwrap_err().0, "proxy.ca");
    }
}
