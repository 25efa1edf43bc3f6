//! The host's inputs to the image crate, read from the config through the
//! root handle: the trust policy (public key files), the registry settings
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

use kubeslot_image::registry::{Credentials, Registries, RegistrySettings};
use kubeslot_image::retry::{self, Pacing};
use kubeslot_image::signature::TrustedKeys;
use kubeslot_image::verify::{Policy, VerifyError};

use crate::config::{Download, RegistryConfig, Trust};
use crate::paths::Root;

/// Loads the keys named by `trust` (host paths under `root`). A policy that
/// can accept nothing (no key, unsigned refused) is an error now, before
/// anything is resolved.
pub fn policy(trust: &Trust, root: &Root) -> Result<Policy, VerifyError> {
    let paths: Vec<PathBuf> = trust
        .public_keys
        .iter()
        .map(|p| root.join(&p.to_string_lossy()))
        .collect();
    let keys = TrustedKeys::from_pem_files(&paths).map_err(VerifyError::Key)?;
    Policy::usable(keys, trust.allow_unsigned)
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
            };
            (host.clone(), settings)
        })
        .collect()
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
