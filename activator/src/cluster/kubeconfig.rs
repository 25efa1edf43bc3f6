//! Kubeconfig files: the current context's server, CA and credential.
//!
//! Kubeconfigs are YAML. The activator links no YAML library, so this
//! reads the block subset every kubeconfig writer emits (clientcmd, the
//! kubelet after TLS bootstrap, kubeadm, our own renderer): block
//! mappings and sequences, plain, single- and double-quoted scalars, `{}`
//! and `[]`, comments. A file starting with `{` is read as JSON. Anything
//! else (anchors, block scalars, flow collections with content) is refused
//! naming the file and line.
//!
//! Paths a kubeconfig names are read through a translation: the node's
//! kubeconfig names files as the kubelet sees them inside its machine
//! (`/var/lib/kubelet/pki/...`), which live elsewhere on the host.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{Map, Value};

/// What a kubeconfig's current context says, files already read.
#[derive(Clone, Debug)]
pub struct Kubeconfig {
    /// Where it was read from (for errors).
    pub path: PathBuf,
    /// `https://host:port`, no trailing `/`.
    pub server: String,
    /// The CA bundle (PEM); `None`: the bundled public roots.
    pub ca_pem: Option<Vec<u8>>,
    pub credential: Credential,
    /// `insecure-skip-tls-verify` (refused unless no CA is given).
    pub insecure: bool,
}

/// How the client proves who it is.
#[derive(Clone, Debug)]
pub enum Credential {
    None,
    /// A bearer token.
    Token(String),
    /// Client certificate chain and key, PEM.
    Cert {
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
    },
    /// An exec credential plugin (`client.authentication.k8s.io/v1`):
    /// command, arguments, environment.
    Exec {
        command: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
}

/// Maps a path named in a kubeconfig to where it is read on this host.
pub type Translate<'a> = &'a dyn Fn(&Path) -> PathBuf;

impl Kubeconfig {
    /// Reads `path` and the files its current context names (relative
    /// paths beside it, absolute ones through `translate`).
    pub fn load(path: &Path, translate: Translate) -> anyhow::Result<Kubeconfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?;
        let doc =
            parse(&text).map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?;
        Kubeconfig::from_value(path, &doc, translate)
    }

    fn from_value(path: &Path, kc: &Value, translate: Translate) -> anyhow::Result<Kubeconfig> {
        let fail = |what: String| anyhow::anyhow!("kubeconfig {}: {what}", path.display());
        let current = kc["current-context"].as_str().unwrap_or("");
        let named = |list: &str, name: &str| -> Option<Value> {
            let items = kc[list].as_array()?;
            // no current context: a file with one entry means that one
            if name.is_empty() && items.len() == 1 {
                return items.first().cloned();
            }
            items.iter().find(|e| e["name"] == name).cloned()
        };
        let ctx = named("contexts", current)
            .ok_or_else(|| fail(format!("no context {current:?} (current-context)")))?;
        let cluster_name = ctx["context"]["cluster"].as_str().unwrap_or("");
        let cluster = named("clusters", cluster_name).ok_or_else(|| {
            fail(format!(
                "no cluster {cluster_name:?} (its context names it)"
            ))
        })?;
        let c = &cluster["cluster"];
        let server = c["server"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| fail(format!("cluster {cluster_name:?} has no server")))?;
        if !server.starts_with("https://") {
            return Err(fail(format!(
                "server {server:?} is not https:// (the activator speaks TLS only)"
            )));
        }
        let base = path.parent().unwrap_or(Path::new("/"));
        let read = |data: &str, file: &str, of: &Value| -> anyhow::Result<Option<Vec<u8>>> {
            if let Some(d) = of[data].as_str().filter(|d| !d.is_empty()) {
                let clean: String = d.split_whitespace().collect();
                return base64::engine::general_purpose::STANDARD
                    .decode(clean)
                    .map(Some)
                    .map_err(|e| fail(format!("{data}: not base64: {e}")));
            }
            let Some(f) = of[file].as_str().filter(|f| !f.is_empty()) else {
                return Ok(None);
            };
            let p = if Path::new(f).is_absolute() {
                translate(Path::new(f))
            } else {
                base.join(f)
            };
            std::fs::read(&p)
                .map(Some)
                .map_err(|e| fail(format!("{file} {f} (read at {}): {e}", p.display())))
        };
        let ca_pem = read("certificate-authority-data", "certificate-authority", c)?;
        let insecure = c["insecure-skip-tls-verify"] == Value::Bool(true);
        let user_name = ctx["context"]["user"].as_str().unwrap_or("");
        let user = named("users", user_name).unwrap_or_default();
        let u = &user["user"];
        let credential =
            if let Some(cert_pem) = read("client-certificate-data", "client-certificate", u)? {
                let key_pem = read("client-key-data", "client-key", u)?.ok_or_else(|| {
                    fail(format!(
                        "user {user_name:?} has a client certificate and no key"
                    ))
                })?;
                Credential::Cert { cert_pem, key_pem }
            } else if let Some(t) = u["token"].as_str().filter(|t| !t.is_empty()) {
                Credential::Token(t.to_string())
            } else if let Some(t) = read("", "tokenFile", u)? {
                Credential::Token(String::from_utf8_lossy(&t).trim().to_string())
            } else if let Some(command) = u["exec"]["command"].as_str() {
                let strings = |v: &Value| -> Vec<String> {
                    v.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|a| a.as_str().map(str::to_string))
                        .collect()
                };
                let env = u["exec"]["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
                        (s("name"), s("value"))
                    })
                    .collect();
                Credential::Exec {
                    command: command.to_string(),
                    args: strings(&u["exec"]["args"]),
                    env,
                }
            } else {
                Credential::None
            };
        Ok(Kubeconfig {
            path: path.to_path_buf(),
            server: server.trim_end_matches('/').to_string(),
            ca_pem,
            credential,
            insecure,
        })
    }
}

/// A kubeconfig's text as JSON: JSON itself, or the YAML block subset.
pub fn parse(text: &str) -> Result<Value, String> {
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"));
    }
    let mut lines = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let body = raw.trim_end();
        let content = body.trim_start_matches(' ');
        if content.is_empty() || content.starts_with('#') || content == "---" {
            continue;
        }
        if content.starts_with('\t') {
            return Err(format!("line {}: a tab in the indentation", n + 1));
        }
        lines.push(Line {
            n: n + 1,
            indent: body.len() - content.len(),
            text: content.to_string(),
        });
    }
    let mut p = Parser { lines, i: 0 };
    if p.lines.is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let indent = p.lines[0].indent;
    let v = p.node(indent)?;
    if let Some(l) = p.lines.get(p.i) {
        return Err(format!("line {}: unexpected indentation", l.n));
    }
    Ok(v)
}

struct Line {
    n: usize,
    indent: usize,
    text: String,
}

struct Parser {
    lines: Vec<Line>,
    i: usize,
}

impl Parser {
    /// The block node whose first line is the current one, at `indent`.
    fn node(&mut self, indent: usize) -> Result<Value, String> {
        let l = &self.lines[self.i];
        if l.text == "-" || l.text.starts_with("- ") {
            self.sequence(indent)
        } else {
            self.mapping(indent)
        }
    }

    fn sequence(&mut self, indent: usize) -> Result<Value, String> {
        let mut items = Vec::new();
        while let Some(l) = self.lines.get(self.i) {
            if l.indent != indent || !(l.text == "-" || l.text.starts_with("- ")) {
                break;
            }
            let rest = l.text[1..].trim_start_matches(' ').to_string();
            if rest.is_empty() {
                self.i += 1;
                items.push(self.nested(indent)?);
                continue;
            }
            // "- key: value" opens a mapping at the column after the dash
            let col = indent + (l.text.len() - rest.len());
            if split_key(&rest).is_some() {
                let l = &mut self.lines[self.i];
                l.indent = col;
                l.text = rest;
                items.push(self.mapping(col)?);
            } else {
                let n = l.n;
                self.i += 1;
                items.push(scalar(&rest).map_err(|e| format!("line {n}: {e}"))?);
            }
        }
        Ok(Value::Array(items))
    }

    fn mapping(&mut self, indent: usize) -> Result<Value, String> {
        let mut map = Map::new();
        while let Some(l) = self.lines.get(self.i) {
            if l.indent != indent || l.text == "-" || l.text.starts_with("- ") {
                if l.indent > indent {
                    return Err(format!("line {}: unexpected indentation", l.n));
                }
                break;
            }
            let n = l.n;
            let (key, value) =
                split_key(&l.text).ok_or_else(|| format!("line {n}: expected `key: value`"))?;
            let key = match scalar(&key).map_err(|e| format!("line {n}: {e}"))? {
                Value::String(s) => s,
                other => other.to_string(),
            };
            self.i += 1;
            let v = if value.is_empty() {
                self.nested(indent)?
            } else {
                scalar(&value).map_err(|e| format!("line {n}: {e}"))?
            };
            map.insert(key, v);
        }
        Ok(Value::Object(map))
    }

    /// The value after `key:` with nothing on its line: a deeper block, a
    /// sequence at the key's own indentation (as Go's YAML writes them),
    /// or null.
    fn nested(&mut self, indent: usize) -> Result<Value, String> {
        match self.lines.get(self.i) {
            Some(l) if l.indent > indent => {
                let i = l.indent;
                self.node(i)
            }
            Some(l) if l.indent == indent && (l.text == "-" || l.text.starts_with("- ")) => {
                self.sequence(indent)
            }
            _ => Ok(Value::Null),
        }
    }
}

/// `key: value` (or `key:`) split at the first `: ` outside quotes.
fn split_key(text: &str) -> Option<(String, String)> {
    let bytes = text.as_bytes();
    let mut quote = None;
    for (i, &b) in bytes.iter().enumerate() {
        match (quote, b) {
            (None, b'"' | b'\'') if i == 0 => quote = Some(b),
            (Some(q), c) if c == q => quote = None,
            (None, b':') if i + 1 == bytes.len() || bytes[i + 1] == b' ' => {
                return Some((text[..i].to_string(), text[i + 1..].trim().to_string()));
            }
            _ => {}
        }
    }
    None
}

/// One scalar: quoted, plain (a trailing ` #` comment dropped), `{}`, `[]`.
fn scalar(text: &str) -> Result<Value, String> {
    if let Some(inner) = text.strip_prefix('\'') {
        let end = inner.rfind('\'').ok_or("an unterminated 'string'")?;
        return Ok(Value::String(inner[..end].replace("''", "'")));
    }
    if text.starts_with('"') {
        let end = text
            .rfind('"')
            .filter(|&e| e > 0)
            .ok_or("an unterminated \"string\"")?;
        return serde_json::from_str(&text[..=end])
            .map_err(|e| format!("a \"string\" YAML allows and this reader does not: {e}"));
    }
    let plain = match text.find(" #") {
        Some(i) => text[..i].trim_end(),
        None => text,
    };
    Ok(match plain {
        "{}" => Value::Object(Map::new()),
        "[]" => Value::Array(Vec::new()),
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        "null" | "~" => Value::Null,
        s if s.starts_with(['{', '[', '&', '*', '|', '>', '!']) => {
            return Err(format!(
            "{s:?}: flow collections, anchors, tags and block scalars are not read in kubeconfigs"
        ))
        }
        s => Value::String(s.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_the_kubelet_writes_after_tls_bootstrap() {
        // clientcmd's output: sequences at their key's indentation
        let text = "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: TFMwdA==\n    server: https://10.0.0.1:6443\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n    namespace: default\n    user: default-auth\n  name: default-context\ncurrent-context: default-context\nkind: Config\npreferences: {}\nusers:\n- name: default-auth\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n";
        let v = parse(text).unwrap();
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://10.0.0.1:6443"
        );
        assert_eq!(v["clusters"][0]["name"], "default-cluster");
        assert_eq!(v["contexts"][0]["context"]["user"], "default-auth");
        assert_eq!(v["preferences"], json!({}));
        assert_eq!(
            v["users"][0]["user"]["client-key"],
            "/var/lib/kubelet/pki/kubelet-client-current.pem"
        );
    }

    #[test]
    fn reads_quotes_nested_sequences_and_comments() {
        let text = "# a comment\nusers:\n  - name: \"kubelet\"\n    user:\n      exec:\n        command: '/usr/bin/cred''s'\n        args:\n          - get\n          - \"--x=a: b\"\n        env:\n        - name: A\n          value: b # trailing\ncurrent-context: x\n";
        let v = parse(text).unwrap();
        let exec = &v["users"][0]["user"]["exec"];
        assert_eq!(exec["command"], "/usr/bin/cred's");
        assert_eq!(exec["args"], json!(["get", "--x=a: b"]));
        assert_eq!(exec["env"], json!([{"name": "A", "value": "b"}]));
        assert_eq!(v["current-context"], "x");
    }

    #[test]
    fn refuses_what_it_does_not_read_naming_the_line() {
        let e = parse("a:\n  b: |\n    text\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("block scalars"), "{e}");
        let e = parse("a: 1\n   b: 2\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let e = parse("a: 1\nnot a mapping\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("key: value"), "{e}");
    }

    #[test]
    fn the_current_context_picks_cluster_and_user_and_paths_are_translated() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("inside/pki")).unwrap();
        std::fs::write(dir.path().join("inside/pki/c.pem"), "CERT+KEY").unwrap();
        std::fs::write(dir.path().join("ca.crt"), "CA").unwrap();
        let kc = dir.path().join("kubeconfig");
        std::fs::write(
            &kc,
            "clusters:\n- name: other\n  cluster:\n    server: https://wrong\n- name: c\n  cluster:\n    server: https://api:6443/\n    certificate-authority: ca.crt\ncontexts:\n- name: ctx\n  context: {cluster: c, user: u}\n",
        )
        .unwrap();
        // a flow mapping with content is refused, naming the file
        let e = Kubeconfig::load(&kc, &|p| p.to_path_buf()).unwrap_err();
        assert!(format!("{e}").contains(&kc.display().to_string()), "{e}");
        std::fs::write(
            &kc,
            "clusters:\n- name: other\n  cluster:\n    server: https://wrong\n- name: c\n  cluster:\n    server: https://api:6443/\n    certificate-authority: ca.crt\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\ncurrent-context: ctx\nusers:\n- name: u\n  user:\n    client-certificate: /var/lib/kubelet/pki/c.pem\n    client-key: /var/lib/kubelet/pki/c.pem\n",
        )
        .unwrap();
        let inside = dir.path().join("inside");
        let k = Kubeconfig::load(&kc, &|p| {
            inside.join(p.strip_prefix("/var/lib/kubelet").unwrap())
        })
        .unwrap();
        assert_eq!(k.server, "https://api:6443");
        assert_eq!(k.ca_pem.as_deref(), Some(&b"CA"[..]));
        match k.credential {
            Credential::Cert { cert_pem, key_pem } => {
                assert_eq!(cert_pem, b"CERT+KEY");
                assert_eq!(key_pem, b"CERT+KEY");
            }
            other => panic!("{other:?}"),
        }
        // a missing file is named with where it was looked for
        let e = Kubeconfig::load(&kc, &|p| p.to_path_buf()).unwrap_err();
        assert!(format!("{e}").contains("/var/lib/kubelet/pki/c.pem"), "{e}");
    }
}
