//! The kubelet's extra arguments from the host: `/etc/kubeslot/default-kubelet`,
//! in the syntax of the unbounded agent's `/etc/default/kubelet`
//! (`KUBELET_EXTRA_ARGS="--flag=value ..."`), so an operator's (or an
//! adopted node's) flags carry over.
//!
//! Owns the file's syntax and its rules: [`parse`] reads it (comments and
//! blank lines skipped, only `KUBELET_EXTRA_ARGS` accepted: `KUBELET_ARGS`
//! is the activator's, and any other variable would reach nothing), and
//! refuses flags the activator or the image sets itself ([`OWNED_FLAGS`]:
//! a later duplicate flag wins in the kubelet, so one would silently
//! override the rendered one), flags that turn off part of the node's
//! security ([`SECURITY_FLAGS`], unless the host config allows each by
//! name), positional words and characters that need quoting. Flag names
//! are compared as the kubelet reads them: it turns `_` into `-`
//! (`--bootstrap_kubeconfig` is `--bootstrap-kubeconfig`), and a value
//! given as the next word (`--read-only-port 10255`) is refused as a
//! positional word after the flag's own name was checked. [`read`] does it
//! for a root's file; [`render`] writes the file
//! the machine gets at `/etc/default/kubelet` (bound read-only, so nothing
//! the node writes there can override the rendered arguments either).
//! [`from_agent_file`] takes `KUBELET_EXTRA_ARGS` out of an adopted tree's
//! `/etc/default/kubelet`.
//!
//! Reads only the file it is given; writes nothing (render and adopt do).

use std::path::{Path, PathBuf};

use crate::paths::Root;

/// Flags the activator renders (`$KUBELET_ARGS`, the kubelet config
/// drop-in) or the image sets (`--config`, its runtime and cgroup
/// contract), with the setting to use instead.
pub const OWNED_FLAGS: &[(&str, &str)] = &[
    ("config", "the image's kubelet.service"),
    ("config-dir", "the image's kubelet.service"),
    ("hostname-override", "use kubelet.node_name"),
    ("node-ip", "use kubelet.node_ip"),
    ("node-labels", "use kubelet.labels"),
    ("register-with-taints", "use kubelet.taints"),
    ("kubeconfig", "the activator renders the kubeconfig"),
    (
        "bootstrap-kubeconfig",
        "the activator renders the bootstrap kubeconfig",
    ),
    ("cluster-dns", "use kubelet.cluster_dns"),
    ("cluster-domain", "use kubelet.cluster_domain"),
    (
        "resolv-conf",
        "the activator renders the machine's resolv.conf",
    ),
    (
        "healthz-bind-address",
        "the health gate probes health.kubelet_healthz_url",
    ),
    (
        "healthz-port",
        "the health gate probes health.kubelet_healthz_url",
    ),
    (
        "container-runtime-endpoint",
        "fixed by the image (its containerd's socket)",
    ),
    (
        "cgroup-driver",
        "fixed by the image (systemd, as its containerd)",
    ),
    (
        "client-ca-file",
        "the cluster CA of kubelet.ca_data/ca_file",
    ),
    ("rotate-certificates", "fixed by the image"),
];

/// Flags that turn off part of the node's security (who may talk to the
/// kubelet and what it runs), with what each opens. Refused unless the
/// host config names the flag in `kubelet.allow_security_flags`; never
/// carried over by `adopt` from an adopted tree.
pub const SECURITY_FLAGS: &[(&str, &str)] = &[
    ("anonymous-auth", "anonymous requests to the kubelet's API"),
    (
        "authorization-mode",
        "who the kubelet's API lets do what (AlwaysAllow: anyone)",
    ),
    (
        "authentication-token-webhook",
        "how the kubelet's API authenticates bearer tokens",
    ),
    (
        "read-only-port",
        "an unauthenticated read-only kubelet port",
    ),
    (
        "pod-manifest-path",
        "static pods from a local path, outside the API server's control",
    ),
    (
        "manifest-url",
        "static pods from a URL, outside the API server's control",
    ),
    ("manifest-url-header", "static pods from a URL"),
    (
        "tls-cert-file",
        "the kubelet's serving certificate (kubelet.server_tls_bootstrap)",
    ),
    ("tls-private-key-file", "the kubelet's serving key"),
    ("tls-cipher-suites", "the kubelet's TLS ciphers"),
    ("tls-min-version", "the kubelet's TLS version"),
    (
        "allowed-unsafe-sysctls",
        "sysctls pods may set that reach beyond the pod",
    ),
    (
        "protect-kernel-defaults",
        "whether the kubelet may change kernel settings",
    ),
    (
        "enable-debugging-handlers",
        "the kubelet's exec, attach, port-forward and log endpoints",
    ),
    ("address", "where the kubelet's API listens"),
    ("port", "where the kubelet's API listens"),
];

/// The config key that allows [`SECURITY_FLAGS`] by name.
pub const ALLOW_KEY: &str = "kubelet.allow_security_flags";

/// A flag's name as the kubelet reads it: `_` is `-` (its flag set's
/// word-separator normalisation), and a leading `--` is dropped.
pub fn normalised(name: &str) -> String {
    name.trim_start_matches("--").replace('_', "-")
}

/// The only variable the file may set.
pub const VARIABLE: &str = "KUBELET_EXTRA_ARGS";

/// Why the file was refused; names the file, the line and the rule.
#[derive(Debug, thiserror::Error)]
pub enum ExtraArgsError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {reason}")]
    Invalid {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error(transparent)]
    Untrusted(#[from] crate::trusted::Untrusted),
}

/// Bytes allowed in an argument: no quotes, `$`, `%`, `\` or whitespace,
/// so it needs no escaping in the rendered environment file and splits
/// the same way in systemd's `$VAR` expansion.
fn is_arg_text(s: &str) -> bool {
    s.bytes().all(|b| {
        b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'_' | b'.' | b',' | b':' | b'/' | b'=' | b'@' | b'+' | b'*'
            )
    })
}

/// Checks one argument: `--name` or `--name=value`, not a flag kubeslot
/// owns, nor a security flag `allowed` (normalised names) does not name.
fn check_arg(arg: &str, allowed: &[String]) -> Result<(), String> {
    let Some(body) = arg.strip_prefix("--") else {
        return Err(format!(
            "{arg:?} is not a --flag or --flag=value (write values with '=': --v=2, not -v 2)"
        ));
    };
    let raw = body.split_once('=').map_or(body, |(n, _)| n);
    if raw.is_empty() || raw.starts_with('-') || !is_arg_text(arg) {
        return Err(format!(
            "{arg:?}: not a --flag or --flag=value, or characters other than a-z, A-Z, 0-9 and - _ . , : / = @ + * (no quotes, spaces or $)"
        ));
    }
    // the kubelet reads `--node_ip` as `--node-ip`
    let name = normalised(raw);
    if let Some((_, why)) = OWNED_FLAGS.iter().find(|(f, _)| *f == name) {
        return Err(format!(
            "--{name} is set by kubeslot ({why}); a later duplicate would override it"
        ));
    }
    if let Some((_, opens)) = SECURITY_FLAGS.iter().find(|(f, _)| *f == name) {
        if !allowed.iter().any(|a| normalised(a) == name) {
            return Err(format!(
                "--{name} turns off part of the node's security (it sets {opens}); refused unless the host config allows it by name in {ALLOW_KEY}"
            ));
        }
    }
    Ok(())
}

/// Removes one pair of matching quotes around a value.
fn unquote(v: &str) -> &str {
    let v = v.trim();
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner;
        }
    }
    v
}

/// Parses the file's text; `path` names it in errors; `allowed`: the
/// [`SECURITY_FLAGS`] the host config allows.
pub fn parse(path: &Path, text: &str, allowed: &[String]) -> Result<Vec<String>, ExtraArgsError> {
    let invalid = |line: usize, reason: String| ExtraArgsError::Invalid {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut args: Option<Vec<String>> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            return Err(invalid(n, "not VARIABLE=value".into()));
        };
        let key = key.trim();
        if key != VARIABLE {
            let why = if key == "KUBELET_ARGS" {
                "is the activator's (node name, labels, kubeconfigs)"
            } else {
                "reaches nothing: the kubelet's command line passes only $KUBELET_ARGS and $KUBELET_EXTRA_ARGS"
            };
            return Err(invalid(n, format!("{key} {why}; only {VARIABLE} is read")));
        }
        if args.is_some() {
            return Err(invalid(n, format!("{VARIABLE} is set twice")));
        }
        let list: Vec<String> = unquote(value)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        for a in &list {
            check_arg(a, allowed).map_err(|reason| invalid(n, reason))?;
        }
        args = Some(list);
    }
    Ok(args.unwrap_or_default())
}

/// The root's `/etc/kubeslot/default-kubelet`, parsed, with the security
/// flags `allowed` by the host config; no file, no extra arguments.
pub fn read(root: &Root, allowed: &[String]) -> Result<Vec<String>, ExtraArgsError> {
    let path = root.kubelet_extra_args();
    if std::fs::symlink_metadata(&path).is_ok() {
        crate::trusted::check_file(&path, "the kubelet's extra arguments")?;
    }
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&Root::host().kubelet_extra_args(), &text, allowed),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(ExtraArgsError::Read { path, source }),
    }
}

/// The machine's `/etc/default/kubelet`: the extra arguments alone (never
/// `KUBELET_ARGS`), rendered also when there are none, so a file the
/// image or the node put there is never read.
pub fn render(args: &[String]) -> String {
    format!(
        "# Rendered by kubeslot-activator from the host's {} and bound\n\
         # read-only: appended after the rendered $KUBELET_ARGS.\n\
         {VARIABLE}=\"{}\"\n",
        Root::host().kubelet_extra_args().display(),
        args.join(" ")
    )
}

/// `KUBELET_EXTRA_ARGS` of an unbounded agent node's `/etc/default/kubelet`
/// (other variables are returned by name: the caller reports them as not
/// carried over). The arguments are checked as [`parse`] checks them, with
/// no security flag allowed: the tree is the node's, not a trusted source.
pub fn from_agent_file(
    path: &Path,
    text: &str,
) -> Result<(Vec<String>, Vec<String>), ExtraArgsError> {
    let mut kept = String::new();
    let mut others = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        let t = t.strip_prefix("export ").unwrap_or(t);
        match t.split_once('=') {
            Some((k, _)) if !t.starts_with('#') && k.trim() != VARIABLE => {
                others.push(k.trim().to_string());
                kept.push('\n');
            }
            _ => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    Ok((parse(path, &kept, &[])?, others))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Vec<String>, String> {
        parse(Path::new("/etc/kubeslot/default-kubelet"), text, &[]).map_err(|e| e.to_string())
    }

    #[test]
    fn the_agents_syntax_parses() {
        assert_eq!(p("").unwrap(), Vec::<String>::new());
        assert_eq!(
            p("# extra\nKUBELET_EXTRA_ARGS=\"--max-pods=50 --v=2\"\n").unwrap(),
            ["--max-pods=50", "--v=2"]
        );
        assert_eq!(
            p("export KUBELET_EXTRA_ARGS='--feature-gates=A=true,B=false'").unwrap(),
            ["--feature-gates=A=true,B=false"]
        );
        assert_eq!(
            p("KUBELET_EXTRA_ARGS=--image-gc-high-threshold=80").unwrap(),
            ["--image-gc-high-threshold=80"]
        );
    }

    #[test]
    fn refusals_name_the_line_and_the_rule() {
        let e = p("\nKUBELET_EXTRA_ARGS=\"--v=2 --node-ip=10.0.0.1\"").unwrap_err();
        assert!(
            e.contains("default-kubelet:2:")
                && e.contains("--node-ip is set by kubeslot (use kubelet.node_ip)"),
            "{e}"
        );
        let e = p("KUBELET_ARGS=--v=2").unwrap_err();
        assert!(e.contains("KUBELET_ARGS is the activator's"), "{e}");
        let e = p("KUBELET_TUNING_ARGS=--v=2").unwrap_err();
        assert!(e.contains("reaches nothing"), "{e}");
        let e = p("KUBELET_EXTRA_ARGS=\"--v 2\"").unwrap_err();
        assert!(e.contains("\"2\" is not a --flag"), "{e}");
        let e = p("KUBELET_EXTRA_ARGS=\"--x=$HOME\"").unwrap_err();
        assert!(e.contains("no quotes, spaces or $"), "{e}");
        let e = p("KUBELET_EXTRA_ARGS=\"---v=2\"").unwrap_err();
        assert!(e.contains("not a --flag"), "{e}");
        let e = p("KUBELET_EXTRA_ARGS=--v=1\nKUBELET_EXTRA_ARGS=--v=2").unwrap_err();
        assert!(e.contains(":2: KUBELET_EXTRA_ARGS is set twice"), "{e}");
        for (flag, _) in OWNED_FLAGS.iter().chain(SECURITY_FLAGS) {
            let underscored = flag.replace('-', "_");
            for arg in [
                format!("--{flag}=x"),
                format!("--{flag}"),
                format!("--{underscored}=x"),
                format!("--{underscored}"),
            ] {
                let e = check_arg(&arg, &[]).unwrap_err();
                assert!(e.starts_with(&format!("--{flag} ")), "{arg}: {e}");
            }
        }
    }

    #[test]
    fn a_security_flag_is_allowed_by_its_name_only() {
        let allowed = ["read_only_port".to_string(), "--tls-min-version".into()];
        for arg in [
            "--read-only-port=10255",
            "--read_only_port=10255",
            "--tls-min-version=VersionTLS13",
        ] {
            check_arg(arg, &allowed).unwrap();
        }
        // the value as the next word is a positional word, whatever the flag
        let path = Path::new("/etc/kubeslot/default-kubelet");
        let e = parse(
            path,
            "KUBELET_EXTRA_ARGS=\"--read-only-port 10255\"",
            &allowed,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"10255\" is not a --flag"), "{e}");
        let e = check_arg("--anonymous-auth=true", &allowed).unwrap_err();
        assert!(e.contains("kubelet.allow_security_flags"), "{e}");
        // an owned flag stays refused whatever the config allows
        assert!(check_arg("--node-ip=10.0.0.1", &["node-ip".into()]).is_err());
    }

    #[test]
    fn the_rendered_file_holds_only_the_extra_arguments() {
        let text = render(&["--max-pods=50".into()]);
        assert!(
            text.ends_with("\nKUBELET_EXTRA_ARGS=\"--max-pods=50\"\n"),
            "{text}"
        );
        assert!(!text.contains("KUBELET_ARGS="));
        // what it renders parses back
        assert_eq!(p(&text).unwrap(), ["--max-pods=50"]);
        assert!(render(&[]).ends_with("KUBELET_EXTRA_ARGS=\"\"\n"));
    }

    #[test]
    fn an_agent_nodes_file_gives_its_extra_args_and_names_the_rest() {
        let (args, others) = from_agent_file(
            Path::new("/var/lib/machines/kube1/etc/default/kubelet"),
            "# tuning\nKUBELET_TUNING_ARGS=\"--kube-api-qps=50\"\nKUBELET_EXTRA_ARGS=\"--max-pods=60\"\n",
        )
        .unwrap();
        assert_eq!(args, ["--max-pods=60"]);
        assert_eq!(others, ["KUBELET_TUNING_ARGS"]);
    }
}
