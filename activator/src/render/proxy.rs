//! The node's egress proxy (the config's `proxy`): one systemd drop-in,
//! bound onto both containerd.service and kubelet.service in the machine,
//! that sets the proxy variables Go programs read (`HTTPS_PROXY`,
//! `HTTP_PROXY`, `NO_PROXY`, each also lower-case), and, with a proxy CA,
//! `SSL_CERT_DIR` naming the system's certificates and the CA the render
//! writes beside it. `NO_PROXY` always holds the loopback names and the
//! API server's host, so the kubelet reaches its cluster directly.

use std::fmt::Write as _;
use std::path::Path;

use super::{HostFacts, RenderedFile};
use crate::config::{Config, ProxyConfig};
use crate::paths::{host_files, machine as inside};

/// The loopback names every rendered `NO_PROXY` starts with.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The `NO_PROXY` list of the node: loopback, the API server's host, then
/// the config's entries, each once.
pub fn no_proxy(config: &Config, proxy: &ProxyConfig) -> Vec<String> {
    let api = config
        .kubelet
        .api_server
        .split_once("://")
        .map_or(config.kubelet.api_server.as_str(), |(_, r)| r)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    let api_host = if let Some(v6) = api.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        api.rsplit_once(':').map_or(api, |(h, _)| h)
    };
    let mut out: Vec<String> = Vec::new();
    for e in LOOPBACK
        .iter()
        .map(|s| s.to_string())
        .chain((!api_host.is_empty()).then(|| api_host.to_string()))
        .chain(proxy.no_proxy.iter().cloned())
    {
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// `Environment=` quoting: systemd expands `%` specifiers, so `%` is
/// doubled (the config refused quotes, backslashes and whitespace).
fn env(name: &str, value: &str) -> String {
    let v = value.replace('%', "%%");
    format!(
        "Environment=\"{name}={v}\" \"{}={v}\"\n",
        name.to_ascii_lowercase()
    )
}

/// The drop-in for containerd.service and kubelet.service, when the config
/// names a proxy.
pub fn dropin(config: &Config, header: &str) -> Option<String> {
    let proxy = config.proxy.as_ref()?;
    let mut s = String::from(header);
    s.push_str("[Service]\n");
    if let Some(p) = &proxy.https {
        s.push_str(&env("HTTPS_PROXY", p));
    }
    if let Some(p) = &proxy.http {
        s.push_str(&env("HTTP_PROXY", p));
    }
    s.push_str(&env("NO_PROXY", &no_proxy(config, proxy).join(",")));
    if proxy.ca.is_some() {
        let _ = writeln!(
            s,
            "Environment=\"SSL_CERT_DIR=/etc/ssl/certs:{}/{}\"",
            inside::HOST_FILES,
            host_files::PROXY_CA_DIR
        );
    }
    Some(s)
}

/// The proxy's host files in the machine's dir `dir`: the drop-in, and the
/// CA when `proxy.ca` names one; nothing without a proxy.
pub fn files(config: &Config, facts: &HostFacts, dir: &Path, header: &str) -> Vec<RenderedFile> {
    let mut out = Vec::new();
    if let Some(contents) = dropin(config, header) {
        out.push(RenderedFile {
            path: dir.join(host_files::PROXY_DROPIN),
            contents,
            mode: 0o644,
        });
    }
    if let Some(ca) = &facts.proxy_ca {
        out.push(RenderedFile {
            path: dir.join(host_files::PROXY_CA_DIR).join("ca.crt"),
            contents: ca.clone(),
            mode: 0o644,
        });
    }
    out
}

/// Where the drop-in is bound in the machine.
pub const BOUND_AT: [&str; 2] = [
    inside::CONTAINERD_PROXY_DROPIN,
    inside::KUBELET_PROXY_DROPIN,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_proxy_holds_loopback_the_api_server_and_the_config_once() {
        let mut config: Config = serde_json::from_value(serde_json::json!({
            "image": "ghcr.io/example/node:v1",
            "kubelet": {"api_server": "https://k8s.corp:6443"},
            "proxy": {"https": "http://proxy.corp:3128", "no_proxy": [".corp", "localhost"]}
        }))
        .unwrap();
        let p = config.proxy.clone().unwrap();
        assert_eq!(
            no_proxy(&config, &p),
            ["localhost", "127.0.0.1", "::1", "k8s.corp", ".corp"]
        );
        config.kubelet.api_server = "https://[fd00::1]:6443".into();
        assert!(no_proxy(&config, &p).contains(&"fd00::1".to_string()));
        config.proxy.as_mut().unwrap().https = Some("http://u:p%40ss@proxy.corp:3128".into());
        let d = dropin(&config, "").unwrap();
        assert!(
            d.contains("Environment=\"HTTPS_PROXY=http://u:p%%40ss@proxy.corp:3128\" \"https_proxy=http://u:p%%40ss@proxy.corp:3128\"\n"),
            "{d}"
        );
        assert!(!d.contains("SSL_CERT_DIR"));
    }
}
