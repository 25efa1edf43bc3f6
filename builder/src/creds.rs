//! Registry credentials: which user and password (or token) to present to a
//! registry host, from the usual places.
//!
//! Given the registry host and an optional `--creds-file`, it looks, in this
//! order, at: the creds file (`user:password`, or a docker `config.json`),
//! the environment (`KUBESLOT_REGISTRY_USER` / `KUBESLOT_REGISTRY_PASSWORD`,
//! and `GITHUB_TOKEN` for `ghcr.io`, as CI provides it), then the docker
//! config (`$DOCKER_CONFIG/config.json` or `~/.docker/config.json`, its
//! `auths` entries with base64 `user:password`). Nothing found means
//! anonymous. It deliberately does not run docker credential helpers (they
//! execute programs named by a config file) and never logs a secret.

use std::path::{Path, PathBuf};

use base64::Engine as _;

/// Environment variable holding the registry user name.
pub const ENV_USER: &str = "KUBESLOT_REGISTRY_USER";
/// Environment variable holding the registry password or token.
pub const ENV_PASSWORD: &str = "KUBESLOT_REGISTRY_PASSWORD";

/// What to present to a registry.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    Anonymous,
    Basic { user: String, password: String },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => write!(f, "Anonymous"),
            Credentials::Basic { user, .. } => write!(f, "Basic({user}, ***)"),
        }
    }
}

/// Why credentials could not be read; names the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum CredsError {
    #[error("credentials file {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("credentials file {path}: {reason}")]
    Format { path: PathBuf, reason: String },
}

/// Finds the credentials for `registry` (`host[:port]`).
pub fn lookup(registry: &str, creds_file: Option<&Path>) -> Result<Credentials, CredsError> {
    lookup_in(registry, creds_file, |k| std::env::var(k).ok())
}

/// [`lookup`] with the environment given as a function (tests pass a map).
fn lookup_in(
    registry: &str,
    creds_file: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Credentials, CredsError> {
    if let Some(path) = creds_file {
        return from_file(path, registry);
    }
    if let (Some(user), Some(password)) = (env(ENV_USER), env(ENV_PASSWORD)) {
        return Ok(Credentials::Basic { user, password });
    }
    if registry == "ghcr.io" {
        if let Some(token) = env("GITHUB_TOKEN") {
            // ghcr.io accepts any user name with a token as the password.
            let user = env("GITHUB_ACTOR").unwrap_or_else(|| "token".into());
            return Ok(Credentials::Basic {
                user,
                password: token,
            });
        }
    }
    let docker_config = match env("DOCKER_CONFIG") {
        Some(dir) => Some(PathBuf::from(dir).join("config.json")),
        None => env("HOME").map(|h| PathBuf::from(h).join(".docker/config.json")),
    };
    if let Some(path) = docker_config {
        if path.is_file() {
            let text = read(&path)?;
            if let Some(c) = from_docker_config(&text, &path, registry)? {
                return Ok(c);
            }
        }
    }
    Ok(Credentials::Anonymous)
}

fn read(path: &Path) -> Result<String, CredsError> {
    std::fs::read_to_string(path).map_err(|source| CredsError::Read {
        path: path.to_path_buf(),
        error: source,
    })
}

/// A `--creds-file`: either `user:password` on one line or a docker config.
fn from_file(path: &Path, registry: &str) -> Result<Credentials, CredsError> {
    let text = read(path)?;
    if text.trim_start().starts_with('{') {
        return from_docker_config(&text, path, registry)?.ok_or_else(|| CredsError::Format {
            path: path.to_path_buf(),
            reason: format!("no auths entry for registry {registry}"),
        });
    }
    let line = text.trim_end_matches(['\n', '\r']);
    match line.split_once(':') {
        Some((user, password)) if !user.is_empty() && !line.contains('\n') => {
            Ok(Credentials::Basic {
                user: user.to_string(),
                password: password.to_string(),
            })
        }
        _ => Err(CredsError::Format {
            path: path.to_path_buf(),
            reason: "expected one line `user:password` or a docker config.json".into(),
        }),
    }
}

/// The docker config's entry for `registry`, keys compared without scheme
/// and path (`https://index.docker.io/v1/` serves `docker.io`).
fn from_docker_config(
    text: &str,
    path: &Path,
    registry: &str,
) -> Result<Option<Credentials>, CredsError> {
    let format = |reason: String| CredsError::Format {
        path: path.to_path_buf(),
        reason,
    };
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format(format!("invalid JSON: {e}")))?;
    let Some(auths) = json.get("auths").and_then(|a| a.as_object()) else {
        return Ok(None);
    };
    let wanted = normalise_host(registry);
    for (key, entry) in auths {
        if normalise_host(key) != wanted {
            continue;
        }
        if let (Some(user), Some(password)) = (
            entry.get("username").and_then(|v| v.as_str()),
            entry.get("password").and_then(|v| v.as_str()),
        ) {
            return Ok(Some(Credentials::Basic {
                user: user.into(),
                password: password.into(),
            }));
        }
        let Some(b64) = entry.get("auth").and_then(|v| v.as_str()) else {
            continue;
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| format(format!("auths.{key}.auth is not base64: {e}")))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|_| format(format!("auths.{key}.auth is not UTF-8")))?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or_else(|| format(format!("auths.{key}.auth is not user:password")))?;
        return Ok(Some(Credentials::Basic {
            user: user.into(),
            password: password.into(),
        }));
    }
    Ok(None)
}

fn normalise_host(key: &str) -> String {
    let k = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = k.split('/').next().unwrap_or(k);
    match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".into(),
        h => h.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_auths() {
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        let text = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}},"127.0.0.1:5000":{{"auth":"{auth}"}}}}}}"#
        );
        let p = Path::new("config.json");
        let want = Credentials::Basic {
            user: "alice".into(),
            password: "s3cret".into(),
        };
        assert_eq!(
            from_docker_config(&text, p, "docker.io").unwrap(),
            Some(want.clone())
        );
        assert_eq!(
            from_docker_config(&text, p, "127.0.0.1:5000").unwrap(),
            Some(want)
        );
        assert_eq!(from_docker_config(&text, p, "ghcr.io").unwrap(), None);
        let bad = r#"{"auths":{"ghcr.io":{"auth":"!!"}}}"#;
        let e = from_docker_config(bad, p, "ghcr.io").unwrap_err();
        assert!(e.to_string().contains("auths.ghcr.io.auth"), "{e}");
    }

    #[test]
    fn github_token_only_for_ghcr_and_env_before_docker_config() {
        let dir = tempfile::tempdir().unwrap();
        let auth = base64::engine::general_purpose::STANDARD.encode("carol:fromconfig");
        std::fs::write(
            dir.path().join("config.json"),
            format!(r#"{{"auths":{{"ghcr.io":{{"auth":"{auth}"}},"r.example:5000":{{"auth":"{auth}"}}}}}}"#),
        )
        .unwrap();
        let config_dir = dir.path().to_str().unwrap().to_string();
        let env = |vars: &'static [(&'static str, &'static str)]| {
            let config_dir = config_dir.clone();
            move |k: &str| {
                if k == "DOCKER_CONFIG" {
                    return Some(config_dir.clone());
                }
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let basic = |user: &str, password: &str| Credentials::Basic {
            user: user.into(),
            password: password.into(),
        };
        let token = &[("GITHUB_TOKEN", "ghp_x"), ("GITHUB_ACTOR", "ci-bot")];
        assert_eq!(
            lookup_in("ghcr.io", None, env(token)).unwrap(),
            basic("ci-bot", "ghp_x")
        );
        // The token is never sent to another registry: its docker config entry wins.
        assert_eq!(
            lookup_in("r.example:5000", None, env(token)).unwrap(),
            basic("carol", "fromconfig")
        );
        let user_pw = &[
            ("KUBESLOT_REGISTRY_USER", "dave"),
            ("KUBESLOT_REGISTRY_PASSWORD", "tok"),
            ("GITHUB_TOKEN", "ghp_x"),
        ];
        assert_eq!(
            lookup_in("ghcr.io", None, env(user_pw)).unwrap(),
            basic("dave", "tok")
        );
        assert_eq!(
            lookup_in("ghcr.io", None, env(&[])).unwrap(),
            basic("carol", "fromconfig")
        );
        assert_eq!(
            lookup_in("other.example", None, env(&[])).unwrap(),
            Credentials::Anonymous
        );
    }

    #[test]
    fn creds_file_forms() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "bob:pa:ss\n").unwrap();
        assert_eq!(
            from_file(&plain, "x").unwrap(),
            Credentials::Basic {
                user: "bob".into(),
                password: "pa:ss".into()
            }
        );
        let bad = dir.path().join("bad");
        std::fs::write(&bad, "nocolon").unwrap();
        let e = from_file(&bad, "x").unwrap_err().to_string();
        assert!(e.contains("user:password") && e.contains("bad"), "{e}");
        assert!(!format!("{:?}", from_file(&plain, "x").unwrap()).contains("pa:ss"));
    }
}
