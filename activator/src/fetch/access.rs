//! The host's inputs to the image crate, read from the config through the
//! root handle: the trust policy (public key files, the keyless policy's
//! `trusted_root.json`), the registry settings
//! (mirrors, `insecure`, password files) and the pacing of registry requests
//! (the `download` deadline, or the short one of a mere look at the image;
//! waits shown as progress lines).
//!
//! Given the config's `trust`, `registries` and `download` sections and the
//! root, it turns host paths into paths under the root and nothing else:
//! signature checking is `kubeslot_image::verify`, fetching is
//! `kubeslot_image::registry`, backing off is `kubeslot_image::retry`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use kubeslot_image::keyless::{KeylessPolicy, TrustedRoot};
use kubeslot_image::reference::{Identity, ImageSource};
use kubeslot_image::registry::{Credentials, ProxySettings, Registries, RegistrySettings};
use kubeslot_image::retry::{self, Pacing};
use kubeslot_image::signature::TrustedKeys;
use kubeslot_image::verify::{Policy, VerifyError};

use crate::config::{Download, Keyless, ProxyConfig, RegistryConfig, Trust};
use crate::paths::Root;

/// Loads the keys named by `trust` (host paths under `root`) and the
/// identity signatures must name ([`identity`]). A policy that can accept
/// nothing (no key, unsigned refused) is an error now, before anything is
/// resolved.
pub fn policy(trust: &Trust, image: &ImageSource, root: &Root) -> Result<Policy, VerifyError> {
    let paths: Vec<PathBuf> = trust
        .public_keys
        .iter()
        .map(|p| root.join(&p.to_string_lossy()))
        .collect();
    for p in &paths {
        crate::trusted::check_file(p, "a signing key (trust.public_keys)").map_err(|e| {
            VerifyError::Key(kubeslot_image::signature::SignatureError::Key {
                path: e.path,
                reason: e.reason,
            })
        })?;
    }
    let keys = TrustedKeys::from_pem_files(&paths).map_err(VerifyError::Key)?;
    let keyless = match &trust.keyless {
        Some(k) => Some(keyless(k, root)?),
        None => None,
    };
    let policy = Policy::usable_with(keys, keyless, trust.allow_unsigned)?;
    if let Some(id) = &trust.identity {
        Identity::repository(id).map_err(|e| VerifyError::BadIdentity {
            identity: id.clone(),
            reason: e.reason.to_string(),
        })?;
    }
    let identity = identity(trust, image);
    if identity.is_none() && !trust.allow_unsigned {
        return Err(VerifyError::NoIdentity);
    }
    Ok(policy.with_identity(identity))
}

/// `trust.keyless` as a policy: its rules and the trusted root read from
/// the host (under `root`) and parsed now, so a missing or malformed root
/// is a config error before anything is resolved.
fn keyless(k: &Keyless, root: &Root) -> Result<KeylessPolicy, VerifyError> {
    let rules = k.rules().map_err(VerifyError::Keyless)?;
    let path = root.join(&k.trusted_root.to_string_lossy());
    crate::trusted::check_file(
        &path,
        "the keyless trusted root (trust.keyless.trusted_root)",
    )
    .map_err(|e| VerifyError::Keyless(e.to_string()))?;
    let bytes = std::fs::read(&path)
        .map_err(|e| VerifyError::Keyless(format!("trusted_root {}: {e}", path.display())))?;
    let root = TrustedRoot::parse(&bytes)
        .map_err(|e| VerifyError::Keyless(format!("trusted_root {}: {e}", path.display())))?;
    Ok(KeylessPolicy { root, rules })
}

/// The identity this host's signatures must name: `trust.identity`, else
/// the repository of a registry image (never a mirror's: mirrors serve the
/// image, they do not rename it). `None` only for a layout or archive
/// without `trust.identity`, which the config allows only with
/// `allow_unsigned` (then any identity is accepted, and unsigned too).
pub fn identity(trust: &Trust, image: &ImageSource) -> Option<Identity> {
    match (&trust.identity, image) {
        (Some(id), _) => Identity::repository(id).ok(),
        (None, ImageSource::Registry(r)) => Some(Identity::of_image(r)),
        (None, _) => None,
    }
}

/// The registry client's settings for the config's `registries`, with each
/// `password_file` under `root`.
pub fn registries(config: &BTreeMap<String, RegistryConfig>, root: &Root) -> Registries {
    config
        .iter()
        .map(|(host, r)| {
            let settings = RegistrySettings {
                mirrors: r.mirrors.clone(),
                insecure: r.insecure,
                credentials: r.credentials.as_ref().map(|c| Credentials {
                    username: c.username.clone(),
                    password_file: root.join(&c.password_file.to_string_lossy()),
                }),
                ca_file: r.ca_file.as_ref().map(|p| root.join(&p.to_string_lossy())),
            };
            (host.clone(), settings)
        })
        .collect()
}

/// The registry client's proxy for the config's `proxy`, its `ca` under
/// `root`.
pub fn proxy(config: Option<&ProxyConfig>, root: &Root) -> Option<ProxySettings> {
    config.map(|p| ProxySettings {
        https: p.https.clone(),
        http: p.http.clone(),
        no_proxy: p.no_proxy.clone(),
        ca_file: p.ca.as_ref().map(|c| root.join(&c.to_string_lossy())),
    })
}

/// The pacing of one run's registry requests: the default backoff, the
/// config's deadline (counted from now), every wait announced on stderr.
pub fn pacing(download: &Download) -> Pacing {
    paced(Duration::from_secs(download.deadline_secs))
}

/// How long a look at the image (`plan`, `activate --dry-run`,
/// `preflight`) may spend on registries: someone is waiting for the
/// answer, so a busy registry is reported, not waited out for the
/// download deadline of a real run.
pub const INSPECT_DEADLINE: Duration = Duration::from_secs(30);

/// [`pacing`] for a look at the image: the config's deadline, at most
/// [`INSPECT_DEADLINE`].
pub fn inspect_pacing(download: &Download) -> Pacing {
    paced(Duration::from_secs(download.deadline_secs).min(INSPECT_DEADLINE))
}

fn paced(deadline: Duration) -> Pacing {
    Pacing::new(retry::Policy {
        deadline: Some(deadline),
        ..retry::Policy::default()
    })
    .with_notice(|line| crate::progress::line(|| line.to_string()))
}
