//! The host facts a machine's files are made of ([`HostFacts`]), read
//! once by [`gather`]: the host name, the upstream DNS servers, the
//! cluster CA, the GPUs (a [`Discovery`] the preflight shares), extra
//! devices, extra mount sources, registry CAs, the kubelet's extra
//! arguments and the offline bundle's archives, each checked where it ends
//! up in a rendered file. Reads only.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::bundle;
use super::extra_args;
use super::gpu::{self, Discovery, GpuBinds, ToolBind};
use super::{registry_mirrors, RenderError};
use crate::config::node::{self, check_node_name};
use crate::config::Config;
use crate::paths::Root;

/// Everything rendering reads from the host, gathered once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFacts {
    /// The host name, the node name when `kubelet.node_name` is unset.
    pub hostname: String,
    /// Real upstream DNS servers, never the 127.0.0.53 stub.
    pub nameservers: Vec<String>,
    /// The host resolver's search domains (its last `search` or `domain`
    /// line), kept so short names resolve in the node as on the host.
    pub dns_search: Vec<String>,
    /// The host resolver's `options` (e.g. `ndots:2`, `timeout:1`), in order.
    pub dns_options: Vec<String>,
    /// The cluster CA (from `kubelet.ca_data` or the `ca_file`).
    pub ca_pem: String,
    pub gpu: GpuBinds,
    /// `/dev/kvm` when the host has it (unless `"kvm": false`), then the
    /// extra host devices from `config.devices` (all exist).
    pub devices: Vec<String>,
    /// The host has `/lib/modules` (every real host does; a container used
    /// as a test host may not). nspawn refuses to start with a bind whose
    /// source is missing, so the bind is rendered only when it exists.
    pub lib_modules: bool,
    /// The CA of each registry whose mirrors name a `ca_file`, by registry
    /// host (PEM text, read once).
    pub registry_cas: BTreeMap<String, String>,
    /// The egress proxy's CA (`proxy.ca`, PEM text, read once).
    pub proxy_ca: Option<String>,
    /// The kubelet's extra arguments from the host's
    /// `/etc/kubeslot/default-kubelet` (checked: no flag kubeslot owns).
    pub kubelet_extra_args: Vec<String>,
}

/// Reads the host facts rendering needs and checks those that end up in
/// rendered files (the host name as a node name, DNS addresses, bind
/// paths); the config's own values were checked when it was loaded
/// (`config::node`). Errors: an unreadable or non-PEM CA, `gpu: "on"`
/// without GPUs, a missing extra device, only stub resolvers. The GPUs are
/// read here ([`Discovery::read`]): a caller that also runs the preflight
/// reads them once and hands them to [`gather_with`].
pub fn gather(root: &Root, config: &Config) -> Result<HostFacts, RenderError> {
    gather_with(root, config, &Discovery::read(root, &config.gpu))
}

/// [`gather`] with the GPUs as the run read them.
pub fn gather_with(
    root: &Root,
    config: &Config,
    gpus: &Discovery,
) -> Result<HostFacts, RenderError> {
    let hostname = match &config.kubelet.node_name {
        Some(_) => read_hostname(root).unwrap_or_default(),
        None => read_hostname(root)?,
    };
    if config.kubelet.node_name.is_none() {
        check_node_name(
            "host name (set kubelet.node_name instead)",
            &hostname.to_lowercase(),
        )
        .map_err(RenderError::from)?;
    }
    let nameservers = nameservers(root, config)?;
    let (dns_search, dns_options) = search_and_options(root)?;
    let ca_pem = read_ca(root, config)?;
    let gpu = gpus.binds()?;
    let mut devices = gpu::extra_devices(root, &config.devices)?;
    if let Some(kvm) = config.kvm.then(|| gpu::kvm_device(root)).flatten() {
        if !devices.contains(&kvm) {
            devices.insert(0, kvm);
        }
    }
    let registry_cas = read_registry_cas(root, config)?;
    let proxy_ca = read_proxy_ca(root, config)?;
    for d in gpu.devices.iter().chain(&devices) {
        check_device_path(d)?;
    }
    for d in gpu.library_dirs.iter().chain(&gpu.library_dirs_32) {
        check_bind_path("gpu library directory", d)?;
    }
    for d in &gpu.device_dirs {
        check_bind_path("gpu device directory", &d.path)?;
    }
    match &gpu.tools.bind {
        ToolBind::None => {}
        ToolBind::Dir(d) => check_bind_path("gpu tool directory", d)?,
        ToolBind::Files(tools) => {
            for t in tools {
                check_bind_path("gpu tool", &t.file)?;
            }
        }
    }
    for m in &config.extra_mounts {
        let path = root.join(&m.host_path.to_string_lossy());
        if let Err(e) = std::fs::metadata(&path) {
            return Err(RenderError::MountSource {
                path: m.host_path.clone(),
                machine_path: m.machine_path.clone(),
                reason: e.to_string(),
            });
        }
        crate::trusted::check_bind_source(root.dir(), &m.host_path, "extra_mounts")?;
    }
    let kubelet_extra_args = extra_args::read(root, &config.kubelet.allow_security_flags)?;
    if let Some(dir) = config
        .images
        .bundle_dir
        .as_ref()
        .filter(|_| !config.images.bundle.is_empty())
    {
        crate::trusted::check_bind_source(root.dir(), dir, "images.bundle_dir")?;
    }
    bundle::verify(root, &config.images)?;
    Ok(HostFacts {
        hostname,
        nameservers,
        dns_search,
        dns_options,
        ca_pem,
        gpu,
        devices,
        lib_modules: root.lib_modules().is_dir(),
        registry_cas,
        proxy_ca,
        kubelet_extra_args,
    })
}

fn read_proxy_ca(root: &Root, config: &Config) -> Result<Option<String>, RenderError> {
    let Some(file) = config.proxy.as_ref().and_then(|p| p.ca.as_ref()) else {
        return Ok(None);
    };
    let path = root.join(&file.to_string_lossy());
    crate::trusted::check_file(&path, "the proxy's CA")?;
    let pem = std::fs::read_to_string(&path).map_err(|source| RenderError::ProxyCaRead {
        path: file.clone(),
        source,
    })?;
    let pem = certificates_only(&pem);
    if pem.is_empty() {
        return Err(RenderError::ProxyCaNotPem { path: file.clone() });
    }
    Ok(Some(pem))
}

fn read_registry_cas(
    root: &Root,
    config: &Config,
) -> Result<BTreeMap<String, String>, RenderError> {
    let mut out = BTreeMap::new();
    for (registry, m) in registry_mirrors(config) {
        let Some(file) = &m.ca_file else { continue };
        let path = root.join(&file.to_string_lossy());
        crate::trusted::check_file(&path, "a registry's CA")?;
        let pem = std::fs::read_to_string(&path).map_err(|source| RenderError::RegistryCaRead {
            registry: registry.clone(),
            path: file.clone(),
            source,
        })?;
        let pem = certificates_only(&pem);
        if pem.is_empty() {
            return Err(RenderError::RegistryCaNotPem {
                registry,
                path: file.clone(),
            });
        }
        out.insert(registry, pem);
    }
    Ok(out)
}

/// The name of this host's Node: `kubelet.node_name`, else the host name
/// (lowercased, as the kubelet registers it).
pub fn node_name_of(root: &Root, config: &Config) -> Result<String, RenderError> {
    match &config.kubelet.node_name {
        Some(name) => Ok(name.clone()),
        None => Ok(read_hostname(root)?.to_lowercase()),
    }
}

fn read_hostname(root: &Root) -> Result<String, RenderError> {
    let candidates = [root.etc_hostname(), root.kernel_hostname()];
    for p in &candidates {
        if let Ok(s) = std::fs::read_to_string(p) {
            let name = s
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with('#'));
            if let Some(name) = name {
                return Ok(name.to_string());
            }
        }
    }
    Err(RenderError::NoHostname {
        tried: candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" and "),
    })
}

fn read_ca(root: &Root, config: &Config) -> Result<String, RenderError> {
    let k = &config.kubelet;
    let (pem, origin) = match (&k.ca_data, &k.ca_file) {
        (Some(pem), _) => (pem.clone(), "kubelet.ca_data".to_string()),
        (None, Some(file)) => {
            let path = root.join(&file.to_string_lossy());
            crate::trusted::check_file(&path, "the cluster CA")?;
            let pem = std::fs::read_to_string(&path)
                .map_err(|source| RenderError::CaRead { path, source })?;
            (pem, file.display().to_string())
        }
        // Config::validate refuses this; render an empty CA rather than panic.
        (None, None) => (String::new(), "kubelet.ca_data".to_string()),
    };
    let pem = certificates_only(&pem);
    if pem.is_empty() {
        return Err(RenderError::CaNotPem { origin });
    }
    Ok(pem)
}

/// The `CERTIFICATE` blocks of a PEM text, each whole, one after the other:
/// what goes into the node's CA files. Anything else (a private key put in
/// the same file, comments, other block types) stays on the host. Empty
/// when there is no complete certificate block.
pub fn certificates_only(pem: &str) -> String {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = String::new();
    let mut block: Option<String> = None;
    for line in pem.lines().map(str::trim_end) {
        match &mut block {
            None if line == BEGIN => block = Some(format!("{line}\n")),
            None => {}
            Some(b) if line == END => {
                out.push_str(b);
                out.push_str(line);
                out.push('\n');
                block = None;
            }
            // another block begins inside this one: this one is broken
            Some(_) if line.starts_with("-----") => {
                block = (line == BEGIN).then(|| format!("{line}\n"));
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
        }
    }
    out
}

fn is_loopback(ip: &str) -> bool {
    ip.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
}

/// `config.nameservers`, else the `nameserver` lines of the host's real
/// upstream list (systemd-resolved's), else of `/etc/resolv.conf`; loopback
/// resolvers (the 127.0.0.53 stub) are dropped, since pods cannot reach them.
fn nameservers(root: &Root, config: &Config) -> Result<Vec<String>, RenderError> {
    if !config.nameservers.is_empty() {
        for ns in &config.nameservers {
            match ns.parse::<IpAddr>() {
                Err(_) => return Err(invalid("nameservers", ns, "is not an IP address")),
                Ok(a) if a.is_loopback() => {
                    return Err(invalid(
                        "nameservers",
                        ns,
                        "is a loopback address, which pods cannot reach",
                    ))
                }
                Ok(_) => {}
            }
        }
        return Ok(config.nameservers.clone());
    }
    let upstream = root.resolved_upstream();
    let etc = root.etc_resolv_conf();
    let path = if upstream.exists() {
        upstream
    } else if etc.exists() {
        etc
    } else {
        return Err(RenderError::NoResolv { upstream, etc });
    };
    let text = std::fs::read_to_string(&path).map_err(|source| RenderError::ResolvRead {
        path: path.clone(),
        source,
    })?;
    let all: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()
                .map(str::to_string)
        })
        .filter(|ns| ns.parse::<IpAddr>().is_ok())
        .collect();
    let real: Vec<String> = all.iter().filter(|ns| !is_loopback(ns)).cloned().collect();
    if real.is_empty() {
        return Err(RenderError::OnlyStub {
            path,
            found: if all.is_empty() {
                "none".into()
            } else {
                all.join(", ")
            },
        });
    }
    Ok(real)
}

/// The host resolver file's `search`/`domain` and `options` lines, read
/// from the same file the servers come from (systemd-resolved's upstream
/// list, else `/etc/resolv.conf`); nothing when neither exists. As in
/// glibc, the last `search` or `domain` line wins and `options` lines add
/// up. A word that could not be written back into a resolv.conf line (a
/// comment character, a control character) is refused, naming the file.
fn search_and_options(root: &Root) -> Result<(Vec<String>, Vec<String>), RenderError> {
    let path = [root.resolved_upstream(), root.etc_resolv_conf()]
        .into_iter()
        .find(|p| p.exists());
    let Some(path) = path else {
        return Ok((Vec::new(), Vec::new()));
    };
    let text = std::fs::read_to_string(&path).map_err(|source| RenderError::ResolvRead {
        path: path.clone(),
        source,
    })?;
    let (mut search, mut options) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let key = words.next();
        let list: Vec<String> = words.map(str::to_string).collect();
        for w in &list {
            if !resolv_word(w) {
                return Err(RenderError::ResolvWord {
                    path: path.clone(),
                    line: line.to_string(),
                });
            }
        }
        match key {
            Some("search" | "domain") => search = list,
            Some("options") => options.extend(list),
            _ => {}
        }
    }
    Ok((search, options))
}

/// A word of a `search` or `options` line: printable ASCII without the
/// comment characters.
fn resolv_word(w: &str) -> bool {
    w.bytes()
        .all(|b| b.is_ascii_graphic() && b != b'#' && b != b';')
}

impl From<node::Invalid> for RenderError {
    fn from(e: node::Invalid) -> Self {
        RenderError::Invalid {
            field: e.field,
            value: e.value,
            reason: e.reason,
        }
    }
}

fn invalid(field: &'static str, value: &str, reason: &str) -> RenderError {
    RenderError::Invalid {
        field,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// Paths go into `Bind=`/`DeviceAllow=` lines unquoted: no `:` (the bind
/// separator), whitespace, quotes or specifier characters.
fn check_bind_path(field: &'static str, path: &str) -> Result<(), RenderError> {
    if node::is_bind_path(path) {
        Ok(())
    } else {
        Err(invalid(
            field,
            path,
            "cannot be bound: only a-z, A-Z, 0-9, '/', '-', '_', '.', '+' are allowed",
        ))
    }
}

fn check_device_path(path: &str) -> Result<(), RenderError> {
    check_bind_path("devices", path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_path_syntax() {
        assert!(check_bind_path("d", "/dev/a:b").is_err());
        assert!(check_bind_path("d", "/dev/nvidia-caps/nvidia-cap1").is_ok());
        assert!(check_bind_path("d", "/dev/../etc").is_err());
    }
}
