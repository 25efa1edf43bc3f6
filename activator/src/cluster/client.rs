//! A small blocking Kubernetes API client: JSON over HTTPS on the
//! activator's ureq and rustls, one agent (keep-alive) per client.
//!
//! It knows no kinds: callers build paths with [`path`] and read the
//! `serde_json::Value`s they need. Every answer that is not 2xx becomes an
//! [`Error::Status`] decoded from the API server's `Status` object
//! (reason, code, message, details, `Retry-After`), so callers tell a 404
//! from a 409 from a 429 without parsing text; no answer at all is an
//! [`Error::Transport`] (no API reachable). Nothing is retried here:
//! callers decide (a drain backs off on 429, a patch reads again on 409).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::kubeconfig::{Credential, Kubeconfig};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No HTTP answer: refused, unreachable, TLS, timeout.
    #[error("{method} {url}: no answer from the API server: {message}")]
    Transport {
        method: String,
        url: String,
        message: String,
    },
    /// The API server answered with a non-2xx status.
    #[error("{0}")]
    Status(Box<Status>),
}

/// A decoded `Status` answer.
#[derive(Debug, Clone)]
pub struct Status {
    pub method: String,
    pub path: String,
    /// The HTTP status code (the `Status`'s `code`).
    pub code: u16,
    /// `NotFound`, `AlreadyExists`, `Conflict`, `Forbidden`,
    /// `TooManyRequests`, ... (empty when the body was no `Status`).
    pub reason: String,
    pub message: String,
    /// `details` (name, kind, causes) as sent.
    pub details: Value,
    /// The `Retry-After` header, in seconds.
    pub retry_after: Option<Duration>,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.method, self.path, self.code)?;
        if !self.reason.is_empty() {
            write!(f, " {}", self.reason)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl Error {
    /// The answer's status, when there was one.
    pub fn status(&self) -> Option<&Status> {
        match self {
            Error::Status(s) => Some(s),
            Error::Transport { .. } => None,
        }
    }
    pub fn code(&self) -> Option<u16> {
        self.status().map(|s| s.code)
    }
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }
    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }
    pub fn is_too_many_requests(&self) -> bool {
        self.code() == Some(429)
    }
    pub fn is_forbidden(&self) -> bool {
        self.code() == Some(403)
    }
    /// No answer: the API is not reachable from here now.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Transport { .. })
    }
    pub fn retry_after(&self) -> Option<Duration> {
        self.status().and_then(|s| s.retry_after)
    }
}

/// The patch types the API server takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 7386 JSON merge patch.
    Merge,
    /// Kubernetes' strategic merge patch (merge keys of the built-in kinds).
    Strategic,
    /// RFC 6902 JSON patch.
    Json,
}

impl PatchType {
    fn content_type(self) -> &'static str {
        match self {
            PatchType::Merge => "application/merge-patch+json",
            PatchType::Strategic => "application/strategic-merge-patch+json",
            PatchType::Json => "application/json-patch+json",
        }
    }
}

/// The API path of a resource (collection when `name` is `None`):
/// `path("v1", None, "nodes", Some("n1"))` is `/api/v1/nodes/n1`,
/// `path("policy/v1", Some("ns"), "poddisruptionbudgets", None)` is
/// `/apis/policy/v1/namespaces/ns/poddisruptionbudgets`.
pub fn path(
    api_version: &str,
    namespace: Option<&str>,
    plural: &str,
    name: Option<&str>,
) -> String {
    let mut p = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    if let Some(ns) = namespace {
        p.push_str("/namespaces/");
        p.push_str(&encode(ns));
    }
    p.push('/');
    p.push_str(plural);
    if let Some(n) = name {
        p.push('/');
        p.push_str(&encode(n));
    }
    p
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// How much of an answer is read (a list of every pod on a node fits).
const MAX_BODY: u64 = 64 << 20;
/// Items asked for per page of a list.
const PAGE: &str = "500";

/// A client for one API server, as one identity.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    server: String,
    token: Option<String>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Client {
    /// A client for the kubeconfig's current context. An exec credential
    /// plugin runs once, here (a run is shorter than what it issues).
    /// `timeout` bounds each request.
    pub fn new(kc: &Kubeconfig, timeout: Duration) -> anyhow::Result<Client> {
        let fail = |what: String| anyhow::anyhow!("kubeconfig {}: {what}", kc.path.display());
        let credential = match &kc.credential {
            Credential::Exec { command, args, env } => {
                exec_credential(command, args, env).map_err(fail)?
            }
            other => other.clone(),
        };
        let mut tls =
            ureq::tls::TlsConfig::builder().unversioned_rustls_crypto_provider(provider());
        if let Some(ca) = &kc.ca_pem {
            let roots =
                certificates(ca).map_err(|e| fail(format!("certificate-authority: {e}")))?;
            tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(roots)));
        } else if kc.insecure {
            return Err(fail(
                "insecure-skip-tls-verify is refused: name the cluster's CA".into(),
            ));
        }
        let mut token = None;
        match credential {
            Credential::Cert { cert_pem, key_pem } => {
                let chain = certificates(&cert_pem)
                    .map_err(|e| fail(format!("client-certificate: {e}")))?;
                let key = ureq::tls::PrivateKey::from_pem(&key_pem)
                    .map_err(|e| fail(format!("client-key: {e}")))?;
                tls = tls.client_cert(Some(ureq::tls::ClientCert::new_with_certs(&chain, key)));
            }
            Credential::Token(t) => token = Some(t),
            Credential::None | Credential::Exec { .. } => {}
        }
        let agent = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10).min(timeout)))
            .timeout_global(Some(timeout))
            .max_redirects(0)
            .user_agent(concat!("kubeslot/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Ok(Client {
            agent,
            server: kc.server.clone(),
            token,
        })
    }

    /// The server's URL (`https://host:port`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// One request: `path` is an API path (`/api/v1/...`), `query` its
    /// parameters (encoded here), `body` JSON sent as `content_type`.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        body: Option<(&str, &Value)>,
    ) -> Result<Value, Error> {
        let mut url = format!("{}{path}", self.server);
        for (i, (k, v)) in query.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&encode(k));
            url.push('=');
            url.push_str(&encode(v));
        }
        let transport = |message: String| Error::Transport {
            method: method.to_string(),
            url: url.clone(),
            message,
        };
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(&url)
            .header("Accept", "application/json");
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let payload = match body {
            Some((content_type, b)) => {
                req = req.header("Content-Type", content_type);
                serde_json::to_vec(b).expect("JSON serializes")
            }
            None => Vec::new(),
        };
        let req = req.body(payload).map_err(|e| transport(e.to_string()))?;
        let mut resp = self.agent.run(req).map_err(|e| transport(e.to_string()))?;
        let code = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| transport(format!("reading the answer ({code}): {e}")))?;
        let value: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        if (200..300).contains(&code) {
            return Ok(value);
        }
        let is_status = value["kind"] == "Status";
        let text = |k: &str| value[k].as_str().unwrap_or("").to_string();
        Err(Error::Status(Box::new(Status {
            method: method.to_string(),
            path: path.to_string(),
            code,
            reason: if is_status {
                text("reason")
            } else {
                String::new()
            },
            message: if is_status {
                text("message")
            } else {
                match &value {
                    Value::String(s) => s.trim().chars().take(200).collect(),
                    other => other.to_string(),
                }
            },
            details: value.get("details").cloned().unwrap_or(Value::Null),
            retry_after,
        })))
    }

    pub fn get(&self, path: &str) -> Result<Value, Error> {
        self.request("GET", path, &[], None)
    }

    /// Every item of a collection, following `continue` tokens; `query`
    /// adds selectors (`labelSelector`, `fieldSelector`).
    pub fn list(&self, path: &str, query: &[(&str, &str)]) -> Result<Vec<Value>, Error> {
        let mut items = Vec::new();
        let mut token = String::new();
        loop {
            let mut q: Vec<(&str, &str)> = query.to_vec();
            q.push(("limit", PAGE));
            if !token.is_empty() {
                q.push(("continue", &token));
            }
            let mut page = self.request("GET", path, &q, None)?;
            if let Some(Value::Array(list)) = page.get_mut("items").map(Value::take) {
                items.extend(list);
            }
            match page["metadata"]["continue"].as_str() {
                Some(t) if !t.is_empty() => token = t.to_string(),
                _ => return Ok(items),
            }
        }
    }

    /// POST `body` to a collection (or a subresource such as
    /// `pods/NAME/eviction`).
    pub fn create(&self, path: &str, body: &Value) -> Result<Value, Error> {
        self.request("POST", path, &[], Some(("application/json", body)))
    }

    pub fn patch(&self, path: &str, kind: PatchType, patch: &Value) -> Result<Value, Error> {
        self.request("PATCH", path, &[], Some((kind.content_type(), patch)))
    }

    /// DELETE, with `DeleteOptions` when given (grace period,
    /// preconditions).
    pub fn delete(&self, path: &str, options: Option<&Value>) -> Result<Value, Error> {
        self.request(
            "DELETE",
            path,
            &[],
            options.map(|o| ("application/json", o)),
        )
    }
}

/// Every certificate in a PEM bundle (at least one).
fn certificates(pem: &[u8]) -> Result<Vec<ureq::tls::Certificate<'static>>, String> {
    let mut out = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        if let ureq::tls::PemItem::Certificate(c) = item.map_err(|e| e.to_string())? {
            out.push(c);
        }
    }
    if out.is_empty() {
        return Err("no PEM certificate in it".into());
    }
    Ok(out)
}

/// The registry client's TLS (AES-GCM, P-256/P-384) with a key provider
/// that loads the client key (ECDSA as the kubelet's, or RSA as kubeadm's
/// admin keys).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = (*kubeslot_image::registry::tls_provider()).clone();
    p.key_provider = &ClientKeys;
    Arc::new(p)
}

#[derive(Debug)]
struct ClientKeys;

impl rustls::crypto::KeyProvider for ClientKeys {
    fn load_private_key(
        &self,
        key: rustls::pki_types::PrivateKeyDer<'static>,
    ) -> Result<Arc<dyn rustls::sign::SigningKey>, rustls::Error> {
        // ECDSA (the kubelet's own keys) or RSA (kubeadm's), the kinds
        // Kubernetes issues; not `any_supported_type`, whose Ed25519 arm
        // alone links ring's Curve25519 code (about 100 KB of the binary).
        use rustls::crypto::ring::sign;
        if let Ok(k) = sign::any_ecdsa_type(&key) {
            return Ok(k);
        }
        match sign::RsaSigningKey::new(&key) {
            Ok(k) => Ok(Arc::new(k)),
            Err(_) => Err(rustls::Error::General(
                "the client key is neither ECDSA (P-256, P-384) nor RSA".into(),
            )),
        }
    }
}

/// Runs an exec credential plugin (`client.authentication.k8s.io/v1`):
/// its token, or its client certificate and key.
fn exec_credential(
    command: &str,
    args: &[String],
    env: &[(String, String)],
) -> Result<Credential, String> {
    let info = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "spec": {"interactive": false},
    });
    let out = std::process::Command::new(command)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("KUBERNETES_EXEC_INFO", info.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("exec credential plugin {command}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "exec credential plugin {command}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("exec credential plugin {command}: its output is not JSON: {e}"))?;
    let st = &v["status"];
    if let (Some(c), Some(k)) = (
        st["clientCertificateData"].as_str(),
        st["clientKeyData"].as_str(),
    ) {
        return Ok(Credential::Cert {
            cert_pem: c.as_bytes().to_vec(),
            key_pem: k.as_bytes().to_vec(),
        });
    }
    st["token"]
        .as_str()
        .map(|t| Credential::Token(t.to_string()))
        .ok_or_else(|| {
            format!(
                "exec credential plugin {command}: no token or client certificate in its status"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::KeyProvider;
    use rustls::pki_types::PrivateKeyDer;
    use rustls::SignatureScheme;

    #[test]
    fn paths_name_groups_namespaces_and_encode_names() {
        assert_eq!(path("v1", None, "nodes", Some("n1")), "/api/v1/nodes/n1");
        assert_eq!(
            path("policy/v1", Some("ns"), "poddisruptionbudgets", None),
            "/apis/policy/v1/namespaces/ns/poddisruptionbudgets"
        );
        assert_eq!(encode("a b/c=d,e"), "a%20b%2Fc%3Dd%2Ce");
    }
    // Throwaway keys made for this test (`openssl genpkey`), nothing else.
    const RSA_PKCS8: &str = "-----BEGIN PRIVATE KEY-----\n\
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDpYNY63A32bVD7\n\
MxGrliwUIzfEKkU72oCiu6O6ly16Juee9qmGZDrvaad1Jz+D4xC9VLtfp2x4CrJk\n\
WRpl5GWj8ZiAjNJ1IeCgP6BNFFPtq75IaSYqX9aABONrMq/tL8oRKSkNBgVXl+D2\n\
OCJeaQaklJtLmErQZADRQYUZ1OQ27SQZKzSXcBqlE4KJd4pqlVsut+j+pbWtdVay\n\
sd78awjXbIg97thTIUxJoMrhTUmTdpdi5ZuSPdRp0SqFO9dapU58QduIyzv6/b4R\n\
qKU9lvj9IXlYtFEqFyS+Fg2hNLTWh/VNJy8/SUwVB45IytWQBqG6M75gpfZpRJ94\n\
xBaVt2JtAgMBAAECggEANYI6tEWinOr9C49uwH7+zcIyZdOESsAjSMyJcn15k52K\n\
cz/eaB4ghiadGsccML7V5ncgPAMM42wecVQdsZl/tWpuGyFOmsUg9dUIyct8n8yG\n\
JR+YvNP7ACC+zOQTAqi3pZ4gl6gW/vmnfoSp2qgtefxJq/g3xRZ8un3RiPXvOmlO\n\
Q1IfykzOJic3qRLrAe0QCGscit7vDSpH8PfgiVqHsb9aYV0fSbZ8/mDHKE9p393r\n\
IlWvL3uLxekWrS06CXaCbT+78mnupRi9pMctHolff9VaaqlwDvmalQ1AwslQyHQI\n\
RZbNUZvNOpIgVRr7meFeOQlaR90B/h1SaYAr8amwgQKBgQD6ypHnUkCjsCUYrl29\n\
Cu023dIKnKIQ5ra/UNpdMAUFqFc8fqAhs6sPI0rPmHqtSTXLM5yOkmm/pR0tFEZ5\n\
SI4fbckyuiPZWqfWaGeHMx89B7a0Ib/mP/XVsIfHLmUZDJeCKf6rMZ7bl/2L02Vk\n\
ZSvhXShR/xA581q69bPwuLo9gQKBgQDuOa8LEPudJ3Kl8JvFTzKwxKTSmRG4wBgu\n\
nB1+jIn59lY+ETh6SimDnuaqm/UCT3p65/WbsnkR9li42/BTPqmVV2UTkx3KVnCu\n\
yZ1bSxNqlk6d8ciKK4/HbsVWVJYXSM2Vki16uRR72qv+TmBiAt2Cd0ez7qqawV9+\n\
SQ0ZaGly7QKBgBTj2MFu/Ylk+8IRjCdaCKZgVcWihHFp9mD7SCUpAdIV0qZsWcRU\n\
5fPN2cZvChDzHzL86paJpZtcEpEVtkUWARinGXJLRP8u6PoYGj+Nx5Va1iItCYIR\n\
Y9XX7Ydu2ub6QIiMHPV/nZ7nCyyhgDmbn8sW6mviFiTtm2olW0a67HCBAoGBAKJA\n\
L3Q+EOEsaO2UPsPX+RJkHE5DasqGKvIz6fKzDZZtrLeBSxIfSL8YjspMhkcYkrb7\n\
HVD58XPGcQ8W3UwVNbM9Xt5CKNwSm5SwRLhVHdhOnyT79DYHDVorm8P8wG0DbOIe\n\
OVOIkub4PIRsJUEb6npdezyVpSTZ54w/fOh9MLTRAoGAZasc/4waIU7LEaGdus6v\n\
lhtVzuSn1Bgaoy9snl22ephsMVhTdqUhlWupAaI13a1Qc2WzU7/OAdoAoZYFYTKX\n\
nI8QEa8KoNu1HYAuU4Y+slU8Jdg8wAJRZ7HbEqpuUy4zHfF9Rgs0oD3EkEYQCGd0\n\
X+gw4ntoXrmU3gqHqRyCbcw=\n\
-----END PRIVATE KEY-----\n";
    const RSA_PKCS1: &str = "-----BEGIN RSA PRIVATE KEY-----\n\
MIIEowIBAAKCAQEA6WDWOtwN9m1Q+zMRq5YsFCM3xCpFO9qAorujupcteibnnvap\n\
hmQ672mndSc/g+MQvVS7X6dseAqyZFkaZeRlo/GYgIzSdSHgoD+gTRRT7au+SGkm\n\
Kl/WgATjazKv7S/KESkpDQYFV5fg9jgiXmkGpJSbS5hK0GQA0UGFGdTkNu0kGSs0\n\
l3AapROCiXeKapVbLrfo/qW1rXVWsrHe/GsI12yIPe7YUyFMSaDK4U1Jk3aXYuWb\n\
kj3UadEqhTvXWqVOfEHbiMs7+v2+EailPZb4/SF5WLRRKhckvhYNoTS01of1TScv\n\
P0lMFQeOSMrVkAahujO+YKX2aUSfeMQWlbdibQIDAQABAoIBADWCOrRFopzq/QuP\n\
bsB+/s3CMmXThErAI0jMiXJ9eZOdinM/3mgeIIYmnRrHHDC+1eZ3IDwDDONsHnFU\n\
HbGZf7VqbhshTprFIPXVCMnLfJ/MhiUfmLzT+wAgvszkEwKot6WeIJeoFv75p36E\n\
qdqoLXn8Sav4N8UWfLp90Yj17zppTkNSH8pMziYnN6kS6wHtEAhrHIre7w0qR/D3\n\
4Ilah7G/WmFdH0m2fP5gxyhPad/d6yJVry97i8XpFq0tOgl2gm0/u/Jp7qUYvaTH\n\
LR6JX3/VWmqpcA75mpUNQMLJUMh0CEWWzVGbzTqSIFUa+5nhXjkJWkfdAf4dUmmA\n\
K/GpsIECgYEA+sqR51JAo7AlGK5dvQrtNt3SCpyiEOa2v1DaXTAFBahXPH6gIbOr\n\
DyNKz5h6rUk1yzOcjpJpv6UdLRRGeUiOH23JMroj2Vqn1mhnhzMfPQe2tCG/5j/1\n\
1bCHxy5lGQyXgin+qzGe25f9i9NlZGUr4V0oUf8QOfNauvWz8Li6PYECgYEA7jmv\n\
CxD7nSdypfCbxU8ysMSk0pkRuMAYLpwdfoyJ+fZWPhE4ekopg57mqpv1Ak96euf1\n\
m7J5EfZYuNvwUz6plVdlE5MdylZwrsmdW0sTapZOnfHIiiuPx27FVlSWF0jNlZIt\n\
erkUe9qr/k5gYgLdgndHs+6qmsFffkkNGWhpcu0CgYAU49jBbv2JZPvCEYwnWgim\n\
YFXFooRxafZg+0glKQHSFdKmbFnEVOXzzdnGbwoQ8x8y/OqWiaWbXBKRFbZFFgEY\n\
pxlyS0T/Luj6GBo/jceVWtYiLQmCEWPV1+2Hbtrm+kCIjBz1f52e5wssoYA5m5/L\n\
Fupr4hYk7ZtqJVtGuuxwgQKBgQCiQC90PhDhLGjtlD7D1/kSZBxOQ2rKhiryM+ny\n\
sw2Wbay3gUsSH0i/GI7KTIZHGJK2+x1Q+fFzxnEPFt1MFTWzPV7eQijcEpuUsES4\n\
VR3YTp8k+/Q2Bw1aK5vD/MBtA2ziHjlTiJLm+DyEbCVBG+p6XXs8laUk2eeMP3zo\n\
fTC00QKBgGWrHP+MGiFOyxGhnbrOr5YbVc7kp9QYGqMvbJ5dtnqYbDFYU3alIZVr\n\
qQGiNd2tUHNls1O/zgHaAKGWBWEyl5yPEBGvCqDbtR2ALlOGPrJVPCXYPMACUWex\n\
2xKqblMuMx3xfUYLNKA9xJBGEAhndF/oMOJ7aF65lN4Kh6kcgm3M\n\
-----END RSA PRIVATE KEY-----\n";
    const EC_SEC1: &str = "-----BEGIN EC PRIVATE KEY-----\n\
MHcCAQEEIP3LtAIjgEffeQgNOYTjfo4odwaicJDQxQ8AQQW4WXDCoAoGCCqGSM49\n\
AwEHoUQDQgAEi/PiuGpxKiwPl2UZyHA6VpBq9C7hjXYH19Yy1XIV86N6c851e2Om\n\
Inyued5dCfEO1A9AN1yC02v0/tVPjBRuBQ==\n\
-----END EC PRIVATE KEY-----\n";
    const ED25519: &str = "-----BEGIN PRIVATE KEY-----\n\
MC4CAQAwBQYDK2VwBCIEIKF7tWQ8dFRpYNz8QMftQkcd8E90opTrIfdmzh3sN9LW\n\
-----END PRIVATE KEY-----\n";

    fn load(pem: &str) -> Result<Arc<dyn rustls::sign::SigningKey>, rustls::Error> {
        use rustls::pki_types::pem::PemObject;
        ClientKeys.load_private_key(PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap())
    }

    #[test]
    fn client_keys_are_the_kinds_kubernetes_issues() {
        for (what, pem, scheme) in [
            ("RSA, PKCS#8", RSA_PKCS8, SignatureScheme::RSA_PSS_SHA256),
            ("RSA, PKCS#1", RSA_PKCS1, SignatureScheme::RSA_PSS_SHA256),
            (
                "ECDSA P-256, SEC1",
                EC_SEC1,
                SignatureScheme::ECDSA_NISTP256_SHA256,
            ),
        ] {
            let key = load(pem).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(key.choose_scheme(&[scheme]).is_some(), "{what}");
        }
        // Ed25519 is not one (and its code is not linked)
        let err = load(ED25519).expect_err("an Ed25519 key is refused");
        assert!(err.to_string().contains("neither ECDSA"), "{err}");
    }
}
