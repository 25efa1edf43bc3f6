//! What a report carries when a node machine failed its gate: the last
//! lines of its kubelet's and containerd's journals and its failed units,
//! read while the machine still runs (before the rollback stops it), with
//! the config's secrets taken out.
//!
//! Given the [`Systemd`] boundary (the journals are read with `journalctl
//! -M`, the failed units with `systemctl -M --failed`) and the config the
//! machine ran with (its secrets). What cannot be read (the machine died,
//! no journal) is a line in [`Diagnostics::errors`], never a failure of
//! the run: the gate's verdict stands whatever this finds. It decides
//! nothing.

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::systemd::Systemd;

/// Journal lines kept per unit.
pub const LINES: usize = 50;

/// What stands in for a secret in a collected line.
pub const REDACTED: &str = "<redacted>";

/// A failed machine's last words.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostics {
    /// The machine they were read from.
    pub machine: String,
    /// `journalctl -M <machine> -u kubelet`: the last lines, oldest first.
    #[serde(default)]
    pub kubelet: Vec<String>,
    /// The same for containerd.
    #[serde(default)]
    pub containerd: Vec<String>,
    /// `systemctl -M <machine> --failed`.
    #[serde(default)]
    pub failed_units: Vec<String>,
    /// What could not be read, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// The secret values of a config: the bootstrap token (and its secret
/// half alone), the exec credential's environment values and its
/// arguments' values (`--client-secret X`'s `X`, `--token=X`'s `X`, a bare
/// `X`; flag names alone are not secret): a plugin's command line is where
/// a client secret or a token is passed.
pub fn secrets(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(t) = &config.kubelet.bootstrap_token {
        out.push(t.clone());
        if let Some((_, secret)) = t.split_once('.') {
            out.push(secret.to_string());
        }
    }
    if let Some(e) = &config.kubelet.exec_credential {
        out.extend(e.env.values().cloned());
        for a in &e.args {
            match a.split_once('=') {
                Some((flag, value)) if flag.starts_with('-') => out.push(value.to_string()),
                _ if a.starts_with('-') => {}
                _ => out.push(a.clone()),
            }
        }
    }
    // the longest first: a token is replaced whole, not around its half
    out.retain(|s| s.len() >= 4);
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// `line` with every secret value, and what follows `Bearer ` or a
/// `token=`/`password=` key, replaced by [`REDACTED`].
fn redact(line: &str, secrets: &[String]) -> String {
    let mut s = line.to_string();
    for secret in secrets {
        s = s.replace(secret.as_str(), REDACTED);
    }
    for key in [
        "Bearer ",
        "bearer ",
        "token=",
        "token: ",
        "password=",
        "password: ",
    ] {
        let mut out = String::new();
        let mut rest = s.as_str();
        while let Some(i) = rest.find(key) {
            let (before, after) = rest.split_at(i + key.len());
            out.push_str(before);
            let end = after
                .find(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ',')
                .unwrap_or(after.len());
            if end > 0 && !after[..end].starts_with('<') {
                out.push_str(REDACTED);
            } else {
                out.push_str(&after[..end]);
            }
            rest = &after[end..];
        }
        out.push_str(rest);
        s = out;
    }
    s
}

/// Reads `machine`'s kubelet and containerd journals (the last [`LINES`])
/// and its failed units, redacted with `secrets`.
pub fn collect(systemd: &dyn Systemd, machine: &str, secrets: &[String]) -> Diagnostics {
    let mut d = Diagnostics {
        machine: machine.to_string(),
        ..Diagnostics::default()
    };
    let clean =
        |lines: Vec<String>| -> Vec<String> { lines.iter().map(|l| redact(l, secrets)).collect() };
    for unit in ["kubelet", "containerd"] {
        match systemd.machine_journal(machine, unit, LINES) {
            Ok(lines) => {
                let lines = clean(lines);
                match unit {
                    "kubelet" => d.kubelet = lines,
                    _ => d.containerd = lines,
                }
            }
            Err(e) => d.errors.push(format!(
                "{unit} journal: {}",
                redact(&kubeslot_image::error_chain(&e), secrets)
            )),
        }
    }
    match systemd.machine_failed_units(machine) {
        Ok(lines) => d.failed_units = clean(lines),
        Err(e) => d.errors.push(format!(
            "failed units: {}",
            redact(&kubeslot_image::error_chain(&e), secrets)
        )),
    }
    d
}

impl Diagnostics {
    /// As `status` and `wait` print them.
    pub fn to_text(&self) -> String {
        let mut s = format!("  diagnostics of {}:\n", self.machine);
        for (name, lines) in [
            ("kubelet journal", &self.kubelet),
            ("containerd journal", &self.containerd),
            ("failed units", &self.failed_units),
        ] {
            if lines.is_empty() {
                s += &format!("    {name}: none\n");
                continue;
            }
            s += &format!("    {name} (last {}):\n", lines.len());
            for l in lines {
                s += &format!("      {l}\n");
            }
        }
        for e in &self.errors {
            s += &format!("    not read: {e}\n");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_credentials_are_redacted() {
        let secrets = vec![
            "abcdef.0123456789abcdef".to_string(),
            "0123456789abcdef".to_string(),
        ];
        assert_eq!(
            redact(
                "E1 bootstrap token abcdef.0123456789abcdef rejected; secret 0123456789abcdef",
                &secrets
            ),
            "E1 bootstrap token <redacted> rejected; secret <redacted>"
        );
        assert_eq!(
            redact("GET /api Authorization: Bearer eyJhbGc.x.y ok", &[]),
            "GET /api Authorization: Bearer <redacted> ok"
        );
        assert_eq!(
            redact("url=https://x/?token=s3cr3t&a=1 password: hunter2", &[]),
            "url=https://x/?token=<redacted> password: <redacted>"
        );
        assert_eq!(
            redact("nothing secret here", &secrets),
            "nothing secret here"
        );
    }

    /// Issue 40 item 7: the exec credential's arguments were shown as the
    /// plugin's failing command line printed them.
    #[test]
    fn exec_credential_arguments_are_redacted() {
        let json = r#"{"image":"registry.example/node:v1","kubelet":{"api_server":"https://10.0.0.1:6443","ca_data":"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n","exec_credential":{"command":"/usr/local/bin/kubelogin","args":["get-token","--client-secret","s3cr3t-client-value","--token=tok3n-value-1234","-v"]}}}"#;
        let c = Config::parse(
            std::path::Path::new("/etc/kubeslot/activator.json"),
            json.as_bytes(),
        )
        .unwrap();
        let secrets = secrets(&c);
        let line = "exec: /usr/local/bin/kubelogin get-token --client-secret s3cr3t-client-value --token=tok3n-value-1234 failed";
        let shown = redact(line, &secrets);
        assert!(
            !shown.contains("s3cr3t-client-value") && !shown.contains("tok3n-value-1234"),
            "{shown}"
        );
        assert!(shown.contains("--client-secret <redacted>"), "{shown}");
    }
}
