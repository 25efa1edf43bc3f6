//! A small blocking client for the OCI distribution API: token and basic
//! auth, GET manifest by tag or digest, GET blob streamed, each tried on the
//! configured mirrors in order and then on the registry itself.
//!
//! Given plain per-registry settings ([`RegistrySettings`]: mirrors,
//! `insecure`, credentials with the path of a password file), it speaks just
//! what the activator needs: `GET /v2/<repo>/manifests/<ref>` with the OCI and
//! Docker Accept list, `GET /v2/<repo>/blobs/<digest>` (with `Range` to resume),
//! `Bearer` tokens from the realm a `WWW-Authenticate` challenge names (with
//! basic credentials when configured) and `Basic` auth. Plain HTTP is used
//! only for loopback hosts or hosts marked `insecure`. Manifest bodies are
//! capped at [`MAX_DOCUMENT_BYTES`], their media type must be a known
//! manifest/index type, and their digest must match both the digest asked
//! for and the `Docker-Content-Digest` header.
//!
//! Any failure at one endpoint (connection refused, timeout, 5xx, 404, auth,
//! a wrong digest) moves on to the next; the final error lists every
//! endpoint and why it failed. Content is trusted only through digests, so a
//! mirror can never substitute bytes.
//!
//! It does not resolve tags "once" (that is [`crate::source`]), verify
//! signatures, write anything to disk, or check blob digests (the content
//! store does, while streaming).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine as _;

mod challenge;
mod proxy;
mod tls;

pub use proxy::{bypassed as no_proxy_bypasses, ProxySettings};

pub use challenge::{parse_challenge, Challenge};

/// The registry client's TLS provider (suites, curves, signature checks;
/// no private keys), for other HTTPS clients of the activator to start
/// from: the cluster client adds its key provider for client certificates.
pub fn tls_provider() -> Arc<rustls::crypto::CryptoProvider> {
    tls::provider()
}

use crate::digest::Digest;
use crate::layout::MAX_DOCUMENT_BYTES;
use crate::oci::{
    MEDIA_TYPE_DOCKER_LIST, MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_INDEX, MEDIA_TYPE_MANIFEST,
};
use crate::reference::ImageRef;
use crate::retry::{self, Decision, Pacing};

/// What the client knows about one registry or mirror host (the key of
/// [`Registries`]): plain values, resolved by the caller (the activator
/// joins config paths under its root handle).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistrySettings {
    /// Mirrors tried in order before the registry itself (`host[:port]`,
    /// optionally with an `http(s)://` prefix).
    pub mirrors: Vec<String>,
    /// Plain HTTP. Loopback hosts may always use it; others only when set.
    pub insecure: bool,
    pub credentials: Option<Credentials>,
    /// PEM CA certificate(s) this host's TLS certificate must chain to
    /// (a private CA on an air-gapped mirror), instead of the public roots.
    /// Implies HTTPS, loopback included.
    pub ca_file: Option<PathBuf>,
}

/// Basic credentials whose password is read from a file when a registry
/// asks for it (never kept in a config or printed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    /// The file holding the password or token, as a path to open.
    pub password_file: PathBuf,
}

/// Settings per registry host, as the image reference names it.
pub type Registries = BTreeMap<String, RegistrySettings>;

/// The manifest and index media types the activator accepts, in Accept order.
pub const MANIFEST_MEDIA_TYPES: [&str; 4] = [
    MEDIA_TYPE_INDEX,
    MEDIA_TYPE_MANIFEST,
    MEDIA_TYPE_DOCKER_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST,
];

/// Token responses larger than this are refused.
const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// Why a registry request failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Every endpoint was tried; `attempts` says why each failed.
    #[error("{what}: every endpoint failed: {}", Attempts(.attempts))]
    AllFailed {
        what: String,
        attempts: Vec<(String, String)>,
    },
    #[error("registry {host}: plain HTTP is only used for loopback hosts or registries.\"{host}\".insecure")]
    Insecure { host: String },
    #[error("registry {host}: credentials: password_file {path}: {reason}")]
    Credentials {
        host: String,
        path: String,
        reason: String,
    },
}

struct Attempts<'a>(&'a [(String, String)]);

impl fmt::Display for Attempts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (endpoint, why)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{endpoint}: {why}")?;
        }
        Ok(())
    }
}

/// One place a repository can be read from: a mirror or the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `host[:port]`.
    pub host: String,
    /// `http` or `https`.
    pub scheme: &'static str,
    pub mirror: bool,
    /// The `registries` key whose `insecure` and `credentials` apply: the
    /// mirror's own host, or the registry as the image names it (so
    /// `docker.io` settings apply to `registry-1.docker.io`).
    pub settings_key: String,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.mirror { "mirror" } else { "registry" };
        write!(f, "{kind} {}://{}", self.scheme, self.host)
    }
}

/// A manifest or index as a registry served it, digest checked.
#[derive(Clone, Debug)]
pub struct Document {
    pub media_type: String,
    pub digest: Digest,
    pub bytes: Vec<u8>,
    /// Which endpoint served it (for logs and reports).
    pub endpoint: String,
}

/// An open blob response.
pub struct BlobStream {
    pub reader: Box<dyn Read + Send>,
    /// The byte offset the stream starts at: the offset asked for when the
    /// endpoint honoured `Range`, else 0.
    pub start: u64,
    pub endpoint: String,
}

/// Whether a `host[:port]` is a loopback address (plain HTTP allowed).
pub fn is_loopback(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name == "localhost"
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The distribution API client for one config's registries.
pub struct Client {
    agent: ureq::Agent,
    /// Agents for hosts with a `ca_file`, made at first use.
    ca_agents: Mutex<HashMap<String, ureq::Agent>>,
    registries: Registries,
    /// `Authorization` values per (endpoint host, repository).
    auth: Mutex<HashMap<(String, String), String>>,
    /// Backoff on 429/503, the run's deadline, and what was sent.
    pacing: Arc<Pacing>,
    /// The config's egress proxy (`None`: ureq's default, the environment).
    proxies: Option<Box<proxy::Proxies>>,
}

/// What one endpoint said, before the caller decides to move on.
type Attempt<T> = Result<T, String>;

impl Client {
    pub fn new(registries: &Registries) -> Client {
        Client {
            agent: Client::agent(None),
            ca_agents: Mutex::new(HashMap::new()),
            registries: registries.clone(),
            auth: Mutex::new(HashMap::new()),
            pacing: Arc::new(Pacing::default()),
            proxies: None,
        }
    }

    /// Every request through the egress proxy `settings` says (and no
    /// other: the environment's is ignored). An unparsable proxy URL is an
    /// error naming the field.
    pub fn with_proxy(mut self, settings: &ProxySettings) -> Result<Client, String> {
        self.proxies = Some(Box::new(proxy::Proxies::new(settings)?));
        Ok(self)
    }

    /// The proxy a request to `scheme://authority` goes through, when the
    /// config names proxies (`Some(None)`: directly); `None` without.
    fn proxy_for(&self, scheme: &str, authority: &str) -> Option<Option<ureq::Proxy>> {
        self.proxies
            .as_ref()
            .map(|p| p.for_request(scheme, authority))
    }

    /// An agent trusting `roots` (the bundled public roots when `None`).
    fn agent(roots: Option<Vec<ureq::tls::Certificate<'static>>>) -> ureq::Agent {
        let mut tls =
            ureq::tls::TlsConfig::builder().unversioned_rustls_crypto_provider(tls::provider());
        if let Some(roots) = roots {
            tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(roots)));
        }
        ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            .max_redirects(5)
            // Credentials go only to the host they are configured for: a
            // redirect (to blob storage, or anywhere a hostile mirror
            // points) never carries the Authorization header.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::Never)
            .user_agent(concat!("kubeslot/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent()
    }

    /// The agent for `settings_key`'s host: one trusting its `ca_file`
    /// when it has one (read and parsed at first use; an error names the
    /// file), else the shared one.
    fn agent_for(&self, settings_key: &str, via_proxy: bool) -> Attempt<ureq::Agent> {
        let ca = self
            .registries
            .get(settings_key)
            .and_then(|r| r.ca_file.clone());
        // through a proxy with a CA: that CA, and the registry's own
        let proxy_ca = self
            .proxies
            .as_ref()
            .and_then(|p| p.ca_file.clone())
            .filter(|_| via_proxy);
        if ca.is_none() && proxy_ca.is_none() {
            return Ok(self.agent.clone());
        }
        let key = format!("{settings_key}\0{}", proxy_ca.is_some());
        let mut agents = self.ca_agents.lock().expect("ca agents");
        if let Some(a) = agents.get(&key) {
            return Ok(a.clone());
        }
        let mut roots = Vec::new();
        if let Some(ca) = &ca {
            roots.extend(read_roots("ca_file", ca)?);
        }
        if let Some(ca) = &proxy_ca {
            roots.extend(read_roots("proxy.ca", ca)?);
        }
        let agent = Client::agent(Some(roots));
        agents.insert(key, agent.clone());
        Ok(agent)
    }

    /// Uses `pacing` (shared with the caller, who reads its counters) for
    /// waits on 429/503 and for the deadline.
    pub fn with_pacing(mut self, pacing: Arc<Pacing>) -> Client {
        self.pacing = pacing;
        self
    }

    fn scheme_for(&self, host: &str, settings_key: &str) -> &'static str {
        let settings = self.registries.get(settings_key);
        if settings.is_some_and(|r| r.ca_file.is_some()) {
            return "https";
        }
        let insecure = settings.is_some_and(|r| r.insecure);
        if insecure || is_loopback(host) {
            "http"
        } else {
            "https"
        }
    }

    /// The mirrors of `image`'s registry in order, then the registry itself.
    pub fn endpoints(&self, image: &ImageRef) -> Vec<Endpoint> {
        let mut out = Vec::new();
        if let Some(cfg) = self.registries.get(&image.registry) {
            for m in &cfg.mirrors {
                let host = m
                    .trim_start_matches("https://")
                    .trim_start_matches("http://")
                    .trim_end_matches('/');
                // User info is never sent, shown or logged (hosts refuse
                // it in their config): only the host[:port] is kept.
                let host = host.rsplit_once('@').map_or(host, |(_, h)| h).to_string();
                out.push(Endpoint {
                    scheme: self.scheme_for(&host, &host),
                    settings_key: host.clone(),
                    host,
                    mirror: true,
                });
            }
        }
        let host = image.api_host().to_string();
        out.push(Endpoint {
            scheme: self.scheme_for(&host, &image.registry),
            settings_key: image.registry.clone(),
            host,
            mirror: false,
        });
        out
    }

    /// Fetches the manifest or index `reference` (a tag or a digest) of
    /// `image`'s repository from the first endpoint that serves a valid one.
    pub fn manifest(&self, image: &ImageRef, reference: &str) -> Result<Document, RegistryError> {
        let wanted: Option<Digest> = reference.parse().ok();
        let mut attempts = Vec::new();
        for ep in self.endpoints(image) {
            match self.manifest_at(&ep, &image.repository, reference, wanted) {
                Ok(Some(doc)) => return Ok(doc),
                Ok(None) => attempts.push((ep.to_string(), "HTTP 404 not found".to_string())),
                Err(why) => attempts.push((ep.to_string(), why)),
            }
        }
        Err(RegistryError::AllFailed {
            what: format!(
                "manifest {}/{}:{reference}",
                image.registry, image.repository
            ),
            attempts,
        })
    }

    /// Like [`Client::manifest`], but `Ok(None)` when no endpoint served it
    /// and at least one answered 404: used for optional artifacts such as
    /// `.sig` tags. When every endpoint failed otherwise (all down), it is an
    /// error, so an unreachable registry is never mistaken for "unsigned".
    /// (A 404 can only ever make the trust check stricter: a missing
    /// signature is refused unless the policy allows unsigned images.)
    pub fn manifest_or_missing(
        &self,
        image: &ImageRef,
        reference: &str,
    ) -> Result<Option<Document>, RegistryError> {
        let wanted: Option<Digest> = reference.parse().ok();
        let mut attempts = Vec::new();
        let mut any_missing = false;
        for ep in self.endpoints(image) {
            match self.manifest_at(&ep, &image.repository, reference, wanted) {
                Ok(Some(doc)) => return Ok(Some(doc)),
                Ok(None) => {
                    any_missing = true;
                    attempts.push((ep.to_string(), "HTTP 404 not found".to_string()));
                }
                Err(why) => attempts.push((ep.to_string(), why)),
            }
        }
        if any_missing {
            return Ok(None);
        }
        Err(RegistryError::AllFailed {
            what: format!(
                "manifest {}/{}:{reference}",
                image.registry, image.repository
            ),
            attempts,
        })
    }

    /// The referrers index of `digest` from the OCI referrers API
    /// (`GET /v2/<repo>/referrers/<digest>`), or `None` when the registry
    /// does not have the API (404, or 400/405 from registries that route the
    /// path elsewhere): the caller then reads the fallback tag. Endpoints
    /// are tried in order as for manifests.
    pub fn referrers(
        &self,
        image: &ImageRef,
        digest: &Digest,
    ) -> Result<Option<Document>, RegistryError> {
        let mut attempts = Vec::new();
        for ep in self.endpoints(image) {
            match self.referrers_at(&ep, &image.repository, digest) {
                Ok(found) => return Ok(found),
                Err(why) => attempts.push((ep.to_string(), why)),
            }
        }
        Err(RegistryError::AllFailed {
            what: format!(
                "referrers of {digest} in {}/{}",
                image.registry, image.repository
            ),
            attempts,
        })
    }

    fn referrers_at(
        &self,
        ep: &Endpoint,
        repo: &str,
        digest: &Digest,
    ) -> Attempt<Option<Document>> {
        let path = format!("/v2/{repo}/referrers/{digest}");
        let resp = self.get(ep, repo, &path, &[("Accept", crate::oci::MEDIA_TYPE_INDEX)])?;
        match resp.status().as_u16() {
            200 => {}
            400 | 404 | 405 => return Ok(None),
            status => return Err(format!("HTTP {status} for {path}")),
        }
        let bytes = read_document(resp, &path)?;
        Ok(Some(Document {
            media_type: crate::oci::MEDIA_TYPE_INDEX.to_string(),
            digest: Digest::of(&bytes),
            bytes,
            endpoint: ep.to_string(),
        }))
    }

    fn manifest_at(
        &self,
        ep: &Endpoint,
        repo: &str,
        reference: &str,
        wanted: Option<Digest>,
    ) -> Attempt<Option<Document>> {
        let path = format!("/v2/{repo}/manifests/{reference}");
        let accept = MANIFEST_MEDIA_TYPES.join(", ");
        let resp = self.get(ep, repo, &path, &[("Accept", accept.as_str())])?;
        let status = resp.status().as_u16();
        if status == 404 {
            return Ok(None);
        }
        if status != 200 {
            return Err(format!("HTTP {status} for {path}"));
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let content_type = header("content-type").unwrap_or_default();
        let header_digest = header("docker-content-digest");
        let bytes = read_document(resp, &path)?;
        let digest = Digest::of(&bytes);
        if let Some(w) = wanted {
            if w != digest {
                return Err(format!("{path}: served content hashes to {digest}"));
            }
        }
        if let Some(h) = header_digest {
            if h != digest.to_string() {
                return Err(format!(
                    "{path}: Docker-Content-Digest {h} but content hashes to {digest}"
                ));
            }
        }
        let media_type =
            document_media_type(&content_type, &bytes).map_err(|e| format!("{path}: {e}"))?;
        Ok(Some(Document {
            media_type,
            digest,
            bytes,
            endpoint: ep.to_string(),
        }))
    }

    /// Opens blob `digest` of `image`'s repository, asking for the bytes
    /// from `offset` on (`Range`) when `offset > 0`.
    pub fn blob(
        &self,
        image: &ImageRef,
        digest: &Digest,
        offset: u64,
    ) -> Result<BlobStream, RegistryError> {
        let mut attempts = Vec::new();
        for ep in self.endpoints(image) {
            match self.blob_at(&ep, &image.repository, digest, offset) {
                Ok(s) => return Ok(s),
                Err(why) => attempts.push((ep.to_string(), why)),
            }
        }
        Err(RegistryError::AllFailed {
            what: format!("blob {digest} of {}/{}", image.registry, image.repository),
            attempts,
        })
    }

    fn blob_at(
        &self,
        ep: &Endpoint,
        repo: &str,
        digest: &Digest,
        offset: u64,
    ) -> Attempt<BlobStream> {
        let path = format!("/v2/{repo}/blobs/{digest}");
        let range = format!("bytes={offset}-");
        let headers: &[(&str, &str)] = if offset > 0 {
            &[("Range", range.as_str())]
        } else {
            &[]
        };
        let resp = self.get(ep, repo, &path, headers)?;
        let status = resp.status().as_u16();
        let start = match status {
            200 => 0,
            206 => {
                let cr = resp
                    .headers()
                    .get("content-range")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                match parse_content_range_start(cr) {
                    Some(s) if s == offset => s,
                    _ => return Err(format!("{path}: 206 with unusable Content-Range {cr:?}")),
                }
            }
            _ => return Err(format!("HTTP {status} for {path}")),
        };
        Ok(BlobStream {
            reader: Box::new(resp.into_body().into_reader()),
            start,
            endpoint: ep.to_string(),
        })
    }

    /// GET at one endpoint, asked again while it answers 429 or 503 and
    /// [`Pacing::decide`] says to wait (honouring `Retry-After`, within the
    /// deadline). Every other answer, and the last 429/503 of a mirror that
    /// keeps refusing, goes back to the caller, which moves on as for any
    /// failure.
    fn get(
        &self,
        ep: &Endpoint,
        repo: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Attempt<ureq::http::Response<ureq::Body>> {
        let mut refusals = 0;
        loop {
            self.pacing.check_deadline()?;
            let resp = self.get_once(ep, repo, path, headers)?;
            let status = resp.status().as_u16();
            if !retry::is_throttled(status) {
                return Ok(resp);
            }
            refusals += 1;
            self.pacing.throttled();
            let header = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok());
            let after = header.and_then(|v| retry::retry_after(v, SystemTime::now()));
            // A mirror that keeps refusing is left for the next endpoint.
            match self.pacing.decide(refusals, after, ep.mirror) {
                Decision::Wait(wait) => {
                    self.pacing.notice(&format!(
                        "{ep}: HTTP {status} for {}: waiting {:.1} s ({}refusal {refusals})",
                        short_path(path),
                        wait.as_secs_f64(),
                        header.map_or(String::new(), |h| format!("Retry-After {h}, "))
                    ));
                    std::thread::sleep(wait);
                    self.pacing.waited(wait);
                }
                Decision::Stop(why) => return Err(format!("HTTP {status} for {path}: {why}")),
            }
        }
    }

    /// One GET with cached auth; on a 401 answers the challenge once and
    /// retries. Cut off at the deadline, body included.
    fn get_once(
        &self,
        ep: &Endpoint,
        repo: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Attempt<ureq::http::Response<ureq::Body>> {
        let url = format!("{}://{}{}", ep.scheme, ep.host, path);
        let key = (ep.host.clone(), repo.to_string());
        let mut auth = self.auth.lock().expect("auth cache").get(&key).cloned();
        for attempt in 0..2 {
            let proxy = self.proxy_for(ep.scheme, &ep.host);
            let via_proxy = proxy.as_ref().is_some_and(Option::is_some);
            let mut req = self.agent_for(&ep.settings_key, via_proxy)?.get(&url);
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            if let Some(a) = &auth {
                req = req.header("Authorization", a.as_str());
            }
            // An HTTPS endpoint's redirects stay HTTPS: a downgrade to
            // plain HTTP is refused (ureq's https_only covers redirect
            // targets).
            let mut config = req
                .config()
                .timeout_global(self.pacing.remaining())
                .https_only(ep.scheme == "https");
            if let Some(proxy) = proxy {
                config = config.proxy(proxy);
            }
            req = config.build();
            self.pacing.sent();
            let resp = req.call().map_err(|e| describe(&e))?;
            if resp.status().as_u16() == 401 && attempt == 0 {
                let challenge = resp
                    .headers()
                    .get("www-authenticate")
                    .and_then(|v| v.to_str().ok())
                    .and_then(parse_challenge)
                    .ok_or_else(|| {
                        format!("HTTP 401 for {path} without a usable WWW-Authenticate challenge")
                    })?;
                let value = self.answer(ep, repo, &challenge)?;
                self.auth
                    .lock()
                    .expect("auth cache")
                    .insert(key.clone(), value.clone());
                auth = Some(value);
                continue;
            }
            return Ok(resp);
        }
        Err(format!("HTTP 401 for {path}: credentials refused"))
    }

    fn basic(&self, host: &str) -> Attempt<Option<String>> {
        let Some(creds) = self
            .registries
            .get(host)
            .and_then(|r| r.credentials.as_ref())
        else {
            return Ok(None);
        };
        let p = &creds.password_file;
        let password = std::fs::read_to_string(p)
            .map_err(|e| format!("credentials: password_file {}: {e}", p.display()))?;
        let pair = format!(
            "{}:{}",
            creds.username,
            password.trim_end_matches(['\n', '\r'])
        );
        Ok(Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )))
    }

    /// Turns a challenge into an `Authorization` value.
    fn answer(&self, ep: &Endpoint, repo: &str, c: &Challenge) -> Attempt<String> {
        let basic = self.basic(&ep.settings_key)?;
        match c.scheme.as_str() {
            "basic" => basic.ok_or_else(|| {
                format!(
                    "requires basic auth and registries.\"{}\".credentials is not set",
                    ep.host
                )
            }),
            "bearer" => {
                let realm_url = c
                    .params
                    .get("realm")
                    .ok_or("Bearer challenge without a realm")?;
                // What errors show of it: a registry's realm may carry
                // user info, which no message repeats.
                let realm = &without_user_info(realm_url);
                let realm_host = realm_url
                    .strip_prefix("https://")
                    .or_else(|| realm_url.strip_prefix("http://"))
                    .ok_or_else(|| format!("token realm {realm:?} is not an http(s) URL"))?;
                let authority = realm_host.split(['/', '?', '#']).next().unwrap_or_default();
                let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
                let plain = realm_url.starts_with("http://");
                // A plain-HTTP realm only on loopback or on the (insecure)
                // registry host itself: anywhere else a token (and the
                // credentials it is asked with) would cross the network in
                // clear text.
                if plain && !is_loopback(host) && !(ep.scheme == "http" && host == ep.host) {
                    return Err(format!(
                        "token realm {realm} is plain HTTP on another host than {} (token realms must be https, or the insecure registry itself)",
                        ep.host
                    ));
                }
                let scope = c
                    .params
                    .get("scope")
                    .cloned()
                    .unwrap_or_else(|| format!("repository:{repo}:pull"));
                // A realm on the registry's own host is reached with its CA.
                let proxy = self.proxy_for(if plain { "http" } else { "https" }, authority);
                let via_proxy = proxy.as_ref().is_some_and(Option::is_some);
                let agent = if host == ep.host {
                    self.agent_for(&ep.settings_key, via_proxy)?
                } else {
                    // no registry's CA: only the proxy's, through it
                    self.agent_for("", via_proxy)?
                };
                // An https realm stays https: a redirect to plain HTTP would
                // send the credentials' answer (the token) in clear text.
                let mut config = agent.get(realm_url.as_str()).config().https_only(!plain);
                if let Some(proxy) = proxy {
                    config = config.proxy(proxy);
                }
                let mut req = config.build().query("scope", &scope);
                if let Some(service) = c.params.get("service") {
                    req = req.query("service", service);
                }
                if let Some(b) = &basic {
                    req = req.header("Authorization", b.as_str());
                }
                let resp = req
                    .call()
                    .map_err(|e| format!("token realm {realm}: {}", describe(&e)))?;
                let status = resp.status().as_u16();
                if status != 200 {
                    return Err(format!("token realm {realm}: HTTP {status}"));
                }
                let mut bytes = Vec::new();
                resp.into_body()
                    .into_reader()
                    .take(MAX_TOKEN_BYTES)
                    .read_to_end(&mut bytes)
                    .map_err(|e| format!("token realm {realm}: {e}"))?;
                #[derive(serde::Deserialize)]
                struct Token {
                    token: Option<String>,
                    access_token: Option<String>,
                }
                let t: Token = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("token realm {realm}: invalid token response: {e}"))?;
                let token = t
                    .token
                    .or(t.access_token)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| format!("token realm {realm}: response holds no token"))?;
                Ok(format!("Bearer {token}"))
            }
            other => Err(format!("unsupported auth scheme {other:?}")),
        }
    }
}

/// `url` with the user info of its authority (`user:password@`) replaced
/// by `<user info>@`, for messages.
pub fn without_user_info(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((_, host)) => {
            let sep = if scheme.is_empty() { "" } else { "://" };
            format!("{scheme}{sep}<user info>@{host}{tail}")
        }
        None => url.to_string(),
    }
}

/// `/v2/<repo>/blobs/sha256:<12 hex>…` → `blobs/sha256:<12 hex>`, for
/// progress lines (errors keep the whole path).
fn short_path(path: &str) -> String {
    let tail = path
        .rsplit_once("/blobs/")
        .map(|(_, d)| ("blobs", d))
        .or_else(|| {
            path.rsplit_once("/manifests/")
                .map(|(_, r)| ("manifests", r))
        });
    match tail {
        Some((kind, r)) if r.starts_with("sha256:") && r.len() > 19 => {
            format!("{kind}/{}", &r[..19])
        }
        Some((kind, r)) => format!("{kind}/{r}"),
        None => path.to_string(),
    }
}

/// A short reason for a transport error.
/// The PEM certificates in `path` (the config's `field`), at least one.
fn read_roots(
    field: &str,
    path: &std::path::Path,
) -> Attempt<Vec<ureq::tls::Certificate<'static>>> {
    let pem = std::fs::read(path).map_err(|e| format!("{field} {}: {e}", path.display()))?;
    let mut roots = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item.map_err(|e| format!("{field} {}: {e}", path.display()))? {
            ureq::tls::PemItem::Certificate(c) => roots.push(c),
            _ => {
                return Err(format!(
                    "{field} {}: holds something other than certificates",
                    path.display()
                ))
            }
        }
    }
    if roots.is_empty() {
        return Err(format!(
            "{field} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(roots)
}

fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Io(io) => format!("connection failed: {io}"),
        // Only the pacing's deadline sets a global timeout.
        ureq::Error::Timeout(ureq::Timeout::Global) => {
            "cut off at the download deadline".to_string()
        }
        other => other.to_string(),
    }
}

/// The media type of a served manifest: from `Content-Type`, else the
/// body's `mediaType`; both must agree when both are set, and it must be a
/// known manifest or index type.
/// A document's body, capped at [`MAX_DOCUMENT_BYTES`].
fn read_document(resp: ureq::http::Response<ureq::Body>, path: &str) -> Attempt<Vec<u8>> {
    let mut bytes = Vec::new();
    resp.into_body()
        .into_reader()
        .take(MAX_DOCUMENT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading {path}: {e}"))?;
    if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
        return Err(format!(
            "{path}: document larger than the {MAX_DOCUMENT_BYTES}-byte limit"
        ));
    }
    Ok(bytes)
}

pub fn document_media_type(content_type: &str, bytes: &[u8]) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        media_type: Option<String>,
    }
    let body: Option<String> = serde_json::from_slice::<Probe>(bytes)
        .map_err(|e| format!("not a JSON manifest: {e}"))?
        .media_type;
    let header = content_type.split(';').next().unwrap_or("").trim();
    let header = (!header.is_empty() && MANIFEST_MEDIA_TYPES.contains(&header)).then_some(header);
    let chosen = match (header, body.as_deref()) {
        (Some(h), Some(b)) if h != b => {
            return Err(format!("Content-Type {h} but mediaType {b}"));
        }
        (Some(h), _) => h.to_string(),
        (None, Some(b)) => b.to_string(),
        (None, None) => return Err(format!("unknown media type {content_type:?}")),
    };
    if !MANIFEST_MEDIA_TYPES.contains(&chosen.as_str()) {
        return Err(format!(
            "media type {chosen} is not a manifest or index type"
        ));
    }
    Ok(chosen)
}

/// `bytes START-END/TOTAL` → START.
fn parse_content_range_start(v: &str) -> Option<u64> {
    let rest = v.trim().strip_prefix("bytes ")?;
    rest.split('-').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.3.4.5",
            "[::1]:5000",
        ] {
            assert!(is_loopback(h), "{h}");
        }
        for h in [
            "ghcr.io",
            "10.0.0.1:5000",
            "localhost.example:80",
            "[2001:db8::1]:5000",
        ] {
            assert!(!is_loopback(h), "{h}");
        }
    }

    #[test]
    fn endpoints_mirrors_first_and_schemes() {
        let mut regs = BTreeMap::new();
        regs.insert(
            "ghcr.io".to_string(),
            RegistrySettings {
                ca_file: None,
                mirrors: vec!["https://mirror.internal:5000/".into(), "127.0.0.1:9".into()],
                ..Default::default()
            },
        );
        regs.insert(
            "mirror.internal:5000".to_string(),
            RegistrySettings {
                ca_file: None,
                insecure: true,
                ..Default::default()
            },
        );
        let c = Client::new(&regs);
        let eps = c.endpoints(&"ghcr.io/a/b:v1".parse().unwrap());
        let shown: Vec<String> = eps.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "mirror http://mirror.internal:5000",
                "mirror http://127.0.0.1:9",
                "registry https://ghcr.io"
            ]
        );
        let hub = c.endpoints(&"ubuntu".parse().unwrap());
        assert_eq!(hub[0].host, "registry-1.docker.io");
        assert_eq!(hub[0].scheme, "https");
        // Settings are looked up by the registry as the image names it.
        regs.insert(
            "docker.io".to_string(),
            RegistrySettings {
                ca_file: None,
                insecure: true,
                ..Default::default()
            },
        );
        let c = Client::new(&regs);
        let hub = c.endpoints(&"ubuntu".parse().unwrap());
        assert_eq!(
            (hub[0].scheme, hub[0].settings_key.as_str()),
            ("http", "docker.io")
        );
    }

    #[test]
    fn media_types() {
        let m = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}"#;
        assert_eq!(
            document_media_type(
                "application/vnd.oci.image.manifest.v1+json; charset=utf-8",
                m
            )
            .unwrap(),
            MEDIA_TYPE_MANIFEST
        );
        assert_eq!(
            document_media_type("application/json", m).unwrap(),
            MEDIA_TYPE_MANIFEST
        );
        assert!(document_media_type(MEDIA_TYPE_INDEX, m)
            .unwrap_err()
            .contains("but mediaType"));
        assert!(document_media_type("text/html", b"{}").is_err());
        assert!(document_media_type("", br#"{"mediaType":"application/evil"}"#).is_err());
        assert!(document_media_type(MEDIA_TYPE_INDEX, b"<html>").is_err());
    }

    #[test]
    fn content_range() {
        assert_eq!(parse_content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(parse_content_range_start("bytes */200"), None);
    }
}
