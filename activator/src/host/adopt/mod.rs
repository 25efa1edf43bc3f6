//! `adopt`: take over a node that another tool set up, so the next
//! activation flips away from it and `rollback` can return to it.
//!
//! The host it is for is one provisioned by unbounded-agent: a machine
//! `kube1` (or `kube2` after an agent update) under `/var/lib/machines`,
//! its `.nspawn` file and drop-in, `machines.target.wants` link, and the
//! agent's `/etc/unbounded/agent/<machine>-applied-config.json` (with a
//! `.sha256` sidecar), and no kubeslot state. [`adopt`] records that machine
//! as the active slot, marked adopted and unverified (no image digest: it
//! was never pulled or checked by kubeslot), and keeps its tree and files
//! as they are: the next `activate` stages into the other slot and flips,
//! and the adopted tree stays the rollback target until an image is staged
//! over it. [`config_from_applied`] (pure, golden-tested) turns the applied
//! config into an activator config: API server, cluster CA, bootstrap token
//! or exec credential, cluster DNS, labels, taints, node name, node IP and
//! the KubeletConfiguration object (`kubelet.config`, less what kubeslot
//! renders itself); every other field is listed with the reason it is not
//! carried over. The adopted tree's `/etc/default/kubelet`
//! `KUBELET_EXTRA_ARGS` becomes the host's `/etc/kubeslot/default-kubelet`.
//!
//! It also takes over what the adopted node needs to keep: the kubelet's
//! client certificate (`/var/lib/kubelet/pki` in the adopted tree, and the
//! kubeconfig the kubelet wrote after bootstrapping) is copied into
//! `/var/lib/kubeslot/node/kubelet`, which the next slot binds at
//! `/var/lib/kubelet`, so the node keeps its identity instead of
//! bootstrapping again with a token that has often expired by then. The
//! tree is another tool's and was never verified: it is read through
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so a link in it
//! cannot make the host copy its own files into the node; links inside
//! `pki/` are copied as links (the kubelet's `kubelet-client-current.pem`).
//!
//! unbounded-agent leaves host units that keep acting after the adoption:
//! `unbounded-agent-daemon.service` (`Restart=always`; later agent
//! versions re-provision the node into `kube2`, the slot kubeslot flips
//! to) and `nftables-flush.service` (`RequiredBy=systemd-nspawn@.service`:
//! it flushes the host's whole nftables ruleset before every node start).
//! `adopt` reports them and, with [`Options::disable_agent`], stops and
//! disables them through the [`Systemd`] boundary before anything is
//! recorded. An applied config whose dropped fields change how the node
//! behaves (`Kubelet.ImageCredentialProvider`, an enabled `LocalDNS`,
//! unknown fields, other `/etc/default/kubelet` variables, ...) is written
//! only with `--force`.
//!
//! Given the root handle and the [`Systemd`] boundary (to see whether
//! machines run, and to stop and disable the agent's units when asked). It
//! starts, enables and renders nothing, and it refuses a host kubeslot
//! already manages. Secrets (the token, exec credential environment) are
//! written only into the 0600 config, never into messages; `--dry-run`
//! shows the config with them replaced ([`redacted`]).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::config::{Config, ConfigError, MAX_CONFIG_BYTES};
use crate::lock::{Lock, LockError};
use crate::paths::Root;
use crate::slot::Slot;
use crate::state::{SlotState, SlotStatus, State, StateError};
use crate::systemd::{Systemd, SystemdError};
use kubeslot_image::digest::Digest;

mod identity;
mod kubelet;

use identity::carry_identity;
use kubelet::{carry_extra_args, kubelet_configuration, write_extra_args};

#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    #[error("adopt: kubeslot already manages this host ({state}: {what}); adopt takes over a host without kubeslot state")]
    Managed { state: PathBuf, what: String },
    #[error("adopt: no unbounded-agent applied config ({kube1} or {kube2}): name the machine to adopt with --machine")]
    NoMachine { kube1: PathBuf, kube2: PathBuf },
    #[error(
        "adopt: both {kube1} and {kube2} exist: name the machine that runs the node with --machine"
    )]
    Ambiguous { kube1: PathBuf, kube2: PathBuf },
    #[error("adopt: machine {machine}: {tree} is not a directory: nothing to adopt")]
    NoTree { machine: Slot, tree: PathBuf },
    #[error(
        "adopt: machines {machine} and {other} both run: stop the one that is not the node first"
    )]
    BothRunning { machine: Slot, other: Slot },
    #[error("adopt: machine {other} is running, not {machine}: adopt the machine that runs the node (--machine {other}), or stop {other} first")]
    OtherRunning { machine: Slot, other: Slot },
    #[error("adopt: {applied} sets what kubeslot does not carry over, and the node would behave differently without it: {fields}; pass --force to write the config anyway (after checking the list above); nothing was changed")]
    BehaviourDropped { applied: PathBuf, fields: String },
    #[error("adopt: {file} is the adopted node's, not a trusted source: {detail}; nothing was changed{}", also_dropped(.also))]
    KubeletFlags {
        file: PathBuf,
        detail: String,
        /// Other fields that need `--force`.
        also: Vec<String>,
    },
    #[error("adopt: the kubelet identity in {path}: {reason}; nothing was changed")]
    Identity { path: PathBuf, reason: String },
    #[error("applied config {path}: {reason}")]
    Applied { path: PathBuf, reason: String },
    #[error("applied config {path}: {field}: {reason}")]
    Field {
        path: PathBuf,
        field: &'static str,
        reason: String,
    },
    #[error("applied config {path}: content hashes to {actual} but {sidecar} says {expected} (edited or torn; unbounded-agent refuses it too)")]
    Sidecar {
        path: PathBuf,
        sidecar: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("config {path} exists: pass --force to replace it")]
    ConfigExists { path: PathBuf },
    #[error("the written config would not load: {0}")]
    Invalid(#[source] ConfigError),
    #[error("config {path}: cannot write: {reason}")]
    Write { path: PathBuf, reason: String },
}

/// What `adopt` is asked to do.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The machine to adopt; by default the one whose applied config
    /// exists.
    pub machine: Option<Slot>,
    /// Also write an activator config from the applied config.
    pub write_config: Option<WriteConfig>,
    /// Change nothing; say what would be recorded and written.
    pub dry_run: bool,
    /// Stop and disable unbounded-agent's host units ([`AGENT_UNITS`]).
    pub disable_agent: bool,
    /// The activator config in place, whose API server a carried
    /// kubeconfig names when no config is written (none: the kubelet's
    /// kubeconfig is not carried, and it bootstraps again).
    pub config: Option<PathBuf>,
}

/// The activator config `adopt` writes.
#[derive(Clone, Debug)]
pub struct WriteConfig {
    /// Where (the activator config path).
    pub path: PathBuf,
    /// The kubeslot image to activate next (not in the applied config:
    /// the agent's image is a different, thin one).
    pub image: String,
    /// Trusted keys (`trust.public_keys`).
    pub public_keys: Vec<PathBuf>,
    /// Replace an existing config, and write one although fields that
    /// change the node's behaviour are not carried over.
    pub force: bool,
    /// The applied config to read (default: the adopted machine's).
    pub applied: Option<PathBuf>,
}

/// What `adopt` did (or would do, with `dry_run`).
#[derive(Clone, Debug)]
pub struct Adopted {
    pub machine: Slot,
    /// Whether its machine runs now.
    pub running: bool,
    /// The applied config the settings came from, when a config was made.
    pub applied: Option<PathBuf>,
    /// The activator config written (or to be written).
    pub config: Option<Value>,
    /// The config keys filled in, and why each other field was left out.
    pub notes: Notes,
    /// unbounded-agent's host units found on the host.
    pub agent_units: Vec<AgentUnit>,
    /// What became of the adopted node's kubelet identity.
    pub identity: Identity,
    /// The adopted node's `KUBELET_EXTRA_ARGS`, written (or to be written)
    /// to `/etc/kubeslot/default-kubelet`.
    pub extra_args: Option<Vec<String>>,
}

/// One of unbounded-agent's host units that acts after the adoption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentUnit {
    pub unit: &'static str,
    /// What it does to a kubeslot host.
    pub why: &'static str,
    /// Stopped and disabled by this run (`--disable-agent`).
    pub disabled: bool,
}

/// unbounded-agent's host units (in `/etc/systemd/system`) and what each
/// does to a host kubeslot manages.
pub const AGENT_UNITS: &[(&str, &str)] = &[
    (
        "unbounded-agent-daemon.service",
        "unbounded-agent's daemon (Restart=always): later agent versions re-provision the node into kube2, the slot kubeslot flips to",
    ),
    (
        "nftables-flush.service",
        "flushes the host's whole nftables ruleset before every systemd-nspawn@ start (RequiredBy=systemd-nspawn@.service), kubeslot's flips included",
    ),
];

/// The adopted node's kubelet identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// Copied (or, dry-run, to be copied) into the node state: the
    /// entries of `pki/`, and whether the kubelet's kubeconfig came along.
    Carried { pki: Vec<String>, kubeconfig: bool },
    /// The node state already holds a `pki/` (kept as it is).
    Kept(PathBuf),
    /// The adopted tree has none: the new slot bootstraps.
    Absent,
}

/// The outcome of converting an applied config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Notes {
    /// `kubelet.*` keys set, in order.
    pub carried: Vec<String>,
    /// The applied-config fields not carried over.
    pub dropped: Vec<Dropped>,
}

/// One applied-config field not carried over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// Its dotted path (`Kubelet.NodeIP`).
    pub field: String,
    pub why: String,
    /// The node behaves differently without it (`adopt --write-config`
    /// then needs `--force`).
    pub changes_behaviour: bool,
}

impl Notes {
    /// The notes as text (golden-tested; no values, so no secrets).
    pub fn to_text(&self) -> String {
        let mut s = format!("carried over: {}\n", self.carried.join(", "));
        if !self.dropped.is_empty() {
            s += "not carried over:\n";
            for d in &self.dropped {
                s += &format!(
                    "  {}: {}{}\n",
                    d.field,
                    d.why,
                    if d.changes_behaviour {
                        " [changes the node's behaviour]"
                    } else {
                        ""
                    }
                );
            }
        }
        s
    }

    /// The dropped fields that change the node's behaviour.
    pub fn behaviour_changing(&self) -> Vec<&str> {
        self.dropped
            .iter()
            .filter(|d| d.changes_behaviour)
            .map(|d| d.field.as_str())
            .collect()
    }

    fn drop(&mut self, field: &str, why: &str, changes_behaviour: bool) {
        self.dropped.push(Dropped {
            field: field.to_string(),
            why: why.to_string(),
            changes_behaviour,
        });
    }
}

/// Applied-config fields kubeslot knows and does not use, why, and whether
/// the node behaves differently without them.
const KNOWN_DROPPED: &[(&str, &str, bool)] = &[
    ("MachineName", "the Machine custom resource's name; kubeslot does not register Machine objects", false),
    ("Cluster.Version", "the image's kubelet decides the Kubernetes version", false),
    ("CRI", "containerd and runc are baked into kubeslot images", false),
    ("CNI", "the CNI plugins are baked into kubeslot images", false),
    ("OCIImage", "unbounded-agent's thin image; the config's \"image\" is the kubeslot image given with --image", false),
    ("Downloads", "nothing is downloaded at provisioning time", false),
    ("Attest", "TPM attestation is not supported: the bootstrap token must be in the applied config", false),
    ("HostPrefix", "kubeslot installs nothing on the host's /usr", false),
    ("Kubelet.ImageCredentialProvider", "not supported by kubeslot's kubelet settings yet: private images need pull secrets instead", true),
    ("LocalDNS", "not supported: pods use the cluster DNS directly", true),
    ("OfflineArtifacts", "images come from the configured source (an oci-archive for air gaps)", false),
    ("AdditionalHostDevices", "use the config's \"devices\"", true),
    ("AdditionalHostMounts", "not supported: the node loses these mounts", true),
    ("Gantry", "not supported", false),
    ("ProvisioningFormat", "provisioning-time only", false),
    ("Kubelet.Auth.ExecCredential.installHint", "not used by kubeslot's exec credential", false),
    ("Kubelet.Auth.ExecCredential.provideClusterInfo", "kubeslot's kubeconfig sets provideClusterInfo: false", false),
    ("Kubelet.Auth.ExecCredential.interactiveMode", "kubeslot's kubeconfig sets interactiveMode: Never", false),
];

/// Removes and returns `v[path...]`, leaving emptied objects in place.
fn take(v: &mut Value, path: &[&str]) -> Option<Value> {
    let (last, parents) = path.split_last()?;
    let mut cur = v;
    for p in parents {
        cur = cur.get_mut(*p)?;
    }
    cur.as_object_mut()?.remove(*last)
}

/// The dotted paths of what is left in `v` (a known field reported as a
/// whole, anything else leaf by leaf).
fn leftovers(v: &Value, prefix: &str, out: &mut Notes) {
    let Value::Object(m) = v else {
        if !prefix.is_empty() {
            // nobody knows what it does: the operator decides
            out.drop(
                prefix,
                "unknown field: not carried over, and what it did is not known",
                true,
            );
        }
        return;
    };
    for (k, child) in m {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if child.as_object().is_some_and(Map::is_empty) || child.is_null() {
            continue;
        }
        if let Some((_, why, changes)) = KNOWN_DROPPED.iter().find(|(f, _, _)| *f == path) {
            out.drop(&path, why, *changes);
        } else {
            leftovers(child, &path, out);
        }
    }
}

/// Turns an applied config (unbounded-agent's `AgentConfig` JSON,
/// PascalCase) into an activator config for `image` trusting
/// `public_keys`, with notes. `path` names the file in errors.
pub fn config_from_applied(
    path: &Path,
    bytes: &[u8],
    image: &str,
    public_keys: &[PathBuf],
) -> Result<(Value, Notes), AdoptError> {
    let field = |field: &'static str, reason: &str| AdoptError::Field {
        path: path.to_path_buf(),
        field,
        reason: reason.to_string(),
    };
    let mut v: Value = serde_json::from_slice(bytes).map_err(|e| AdoptError::Applied {
        path: path.to_path_buf(),
        reason: format!("not JSON: {e}"),
    })?;
    if !v.is_object() {
        return Err(AdoptError::Applied {
            path: path.to_path_buf(),
            reason: "not a JSON object".into(),
        });
    }
    let mut notes = Notes::default();
    let mut kubelet = Map::new();

    let api = take(&mut v, &["Kubelet", "ApiServer"])
        .and_then(|s| s.as_str().map(str::to_string))
        .filter(|s| !s.is_empty())
        .ok_or_else(|| field("Kubelet.ApiServer", "missing"))?;
    // the agent prepends the scheme when it is missing; so do we
    let api = if api.starts_with("https://") {
        api
    } else {
        format!("https://{api}")
    };
    kubelet.insert("api_server".into(), api.into());
    notes.carried.push("api_server".into());

    let ca64 = take(&mut v, &["Cluster", "CaCertBase64"])
        .and_then(|s| s.as_str().map(str::to_string))
        .ok_or_else(|| field("Cluster.CaCertBase64", "missing"))?;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(ca64.trim())
        .map_err(|_| field("Cluster.CaCertBase64", "not base64"))?;
    let ca = String::from_utf8(ca)
        .ok()
        .filter(|p| p.contains("-----BEGIN CERTIFICATE-----"))
        .ok_or_else(|| {
            field(
                "Cluster.CaCertBase64",
                "does not decode to a PEM certificate",
            )
        })?;
    kubelet.insert("ca_data".into(), ca.into());
    notes.carried.push("ca_data".into());

    carry_auth(path, &mut v, &mut kubelet, &mut notes)?;

    carry_optional(&mut v, &mut kubelet, &mut notes);
    leftovers(&v, "", &mut notes);

    let config = json!({
        "image": image,
        "trust": {"public_keys": public_keys},
        "kubelet": kubelet,
    });
    // The result must load as the activator will load it.
    Config::parse(path, &serde_json::to_vec(&config).expect("json"))
        .map_err(AdoptError::Invalid)?;
    Ok((config, notes))
}

/// The kubelet credential: a bootstrap token or an exec credential
/// (exactly one).
fn carry_auth(
    path: &Path,
    v: &mut Value,
    kubelet: &mut Map<String, Value>,
    notes: &mut Notes,
) -> Result<(), AdoptError> {
    let field = |field: &'static str, reason: &str| AdoptError::Field {
        path: path.to_path_buf(),
        field,
        reason: reason.to_string(),
    };
    let token = take(v, &["Kubelet", "Auth", "BootstrapToken"])
        .and_then(|t| t.as_str().map(str::to_string))
        .filter(|t| !t.is_empty());
    let exec = take(v, &["Kubelet", "Auth", "ExecCredential"]).filter(|e| !e.is_null());
    match (token, exec) {
        (Some(_), Some(_)) => {
            return Err(field(
                "Kubelet.Auth",
                "both BootstrapToken and ExecCredential are set",
            ))
        }
        (None, None) => {
            return Err(field(
                "Kubelet.Auth",
                "neither BootstrapToken nor ExecCredential is set (an attested host's token is not in its applied config)",
            ))
        }
        (Some(t), None) => {
            kubelet.insert("bootstrap_token".into(), t.into());
            notes.carried.push("bootstrap_token".into());
        }
        (None, Some(mut e)) => {
            let command = take(&mut e, &["command"])
                .and_then(|c| c.as_str().map(str::to_string))
                .filter(|c| !c.is_empty())
                .ok_or_else(|| field("Kubelet.Auth.ExecCredential.command", "missing"))?;
            let mut exec = Map::new();
            exec.insert("command".into(), command.into());
            if let Some(args) = take(&mut e, &["args"]).filter(|a| !a.is_null()) {
                exec.insert("args".into(), args);
            }
            if let Some(env) = take(&mut e, &["env"]).filter(|a| !a.is_null()) {
                // [{"name", "value"}] → {"name": "value"}
                let mut map = Map::new();
                for item in env.as_array().into_iter().flatten() {
                    let (Some(n), Some(val)) = (
                        item.get("name").and_then(Value::as_str),
                        item.get("value").and_then(Value::as_str),
                    ) else {
                        return Err(field(
                            "Kubelet.Auth.ExecCredential.env",
                            "entries must be {\"name\", \"value\"} strings",
                        ));
                    };
                    map.insert(n.into(), val.into());
                }
                exec.insert("env".into(), map.into());
            }
            if let Some(api) = take(&mut e, &["apiVersion"]).filter(|a| !a.is_null()) {
                exec.insert("api_version".into(), api);
            }
            kubelet.insert("exec_credential".into(), exec.into());
            notes.carried.push("exec_credential".into());
            // what is left of it is reported below
            v["Kubelet"]["Auth"]["ExecCredential"] = e;
        }
    }

    Ok(())
}

/// The settings an applied config may leave out: cluster DNS, node name,
/// labels, taints, node IP, the KubeletConfiguration (a LocalDNS that is
/// off is dropped silently).
fn carry_optional(v: &mut Value, kubelet: &mut Map<String, Value>, notes: &mut Notes) {
    if let Some(dns) =
        take(v, &["Cluster", "ClusterDNS"]).and_then(|d| d.as_str().map(str::to_string))
    {
        let list: Vec<Value> = dns
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.to_string().into())
            .collect();
        if !list.is_empty() {
            kubelet.insert("cluster_dns".into(), list.into());
            notes.carried.push("cluster_dns".into());
        }
    }
    match take(v, &["NodeName"]).and_then(|n| n.as_str().map(str::to_string)) {
        Some(n) if !n.is_empty() => {
            kubelet.insert("node_name".into(), n.into());
            notes.carried.push("node_name".into());
        }
        _ => notes.drop(
            "NodeName",
            "absent: unbounded-agent named the node after the host, and so does kubeslot by default",
            false,
        ),
    }
    if let Some(labels) =
        take(v, &["Kubelet", "Labels"]).filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
    {
        kubelet.insert("labels".into(), labels);
        notes.carried.push("labels".into());
    }
    if let Some(taints) = take(v, &["Kubelet", "RegisterWithTaints"])
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
    {
        kubelet.insert("taints".into(), taints);
        notes.carried.push("taints".into());
    }
    if let Some(ip) = take(v, &["Kubelet", "NodeIP"])
        .and_then(|s| s.as_str().map(str::to_string))
        .filter(|s| !s.is_empty())
    {
        kubelet.insert("node_ip".into(), ip.into());
        notes.carried.push("node_ip".into());
    }
    if let Some(Value::Object(c)) = take(v, &["Kubelet", "Configuration"]) {
        kubelet_configuration(c, kubelet, notes);
    }
    // LocalDNS switched off changes nothing
    if v.pointer("/LocalDNS/Enabled") != Some(&Value::Bool(true))
        && take(v, &["LocalDNS"]).is_some()
    {
        notes.drop("LocalDNS", "not enabled", false);
    }
}

/// Reads an applied config and checks its `.sha256` sidecar as
/// unbounded-agent does (a missing sidecar is accepted: the agent's own
/// crash window).
fn read_applied(path: &Path) -> Result<Vec<u8>, AdoptError> {
    let applied = |reason: String| AdoptError::Applied {
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| applied(e.to_string()))?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(applied(format!("larger than {MAX_CONFIG_BYTES} bytes")));
    }
    let bytes = std::fs::read(path).map_err(|e| applied(e.to_string()))?;
    let mut sidecar = path.as_os_str().to_owned();
    sidecar.push(".sha256");
    let sidecar = PathBuf::from(sidecar);
    if let Ok(text) = std::fs::read_to_string(&sidecar) {
        let actual = Digest::of(&bytes).hex();
        if text.trim() != actual {
            return Err(AdoptError::Sidecar {
                path: path.to_path_buf(),
                sidecar,
                expected: text.trim().to_string(),
                actual,
            });
        }
    }
    Ok(bytes)
}

/// Records the machine as the adopted active slot (and writes the config),
/// under the run lock. See the module doc.
pub fn adopt(root: &Root, systemd: &dyn Systemd, opts: &Options) -> Result<Adopted, AdoptError> {
    let lock = Lock::try_exclusive(root)?;
    let mut state = State::load_repairing(root)?;
    refuse_managed(root, &state)?;
    let machine = match opts.machine {
        Some(m) => m,
        None => machine_of_applied(root)?,
    };
    let tree = root.machine_tree(machine.machine());
    if !tree.is_dir() {
        return Err(AdoptError::NoTree { machine, tree });
    }
    let running_of = |s: Slot| -> Result<bool, AdoptError> {
        Ok(systemd.is_active(&s.unit())? || systemd.machine_registered(s.machine())?)
    };
    let running = running_of(machine)?;
    let other = machine.other();
    if running_of(other)? {
        return Err(if running {
            AdoptError::BothRunning { machine, other }
        } else {
            AdoptError::OtherRunning { machine, other }
        });
    }
    // The config first, in memory: a bad applied config changes nothing.
    let mut made = None;
    let mut extra = None;
    let mut token_mode = true;
    if let Some(w) = &opts.write_config {
        let applied = w
            .applied
            .clone()
            .unwrap_or_else(|| root.unbounded_applied_config(machine.machine()));
        let bytes = read_applied(&applied)?;
        let (config, mut notes) = config_from_applied(&applied, &bytes, &w.image, &w.public_keys)?;
        extra = carry_extra_args(root, machine, &mut notes)?;
        let extra_file = root.kubelet_extra_args();
        if extra.is_some() && extra_file.exists() && !w.force {
            return Err(AdoptError::ConfigExists { path: extra_file });
        }
        if w.path.exists() && !w.force {
            return Err(AdoptError::ConfigExists {
                path: w.path.clone(),
            });
        }
        let changing = notes.behaviour_changing();
        if !w.force && !opts.dry_run {
            kubelet::refuse_unforced(machine, extra.as_deref(), &notes)?;
        }
        if !changing.is_empty() && !w.force && !opts.dry_run {
            return Err(AdoptError::BehaviourDropped {
                applied,
                fields: changing.join(", "),
            });
        }
        token_mode = config.pointer("/kubelet/bootstrap_token").is_some();
        made = Some((applied, config, notes, w));
    }
    // The API server a carried kubeconfig names: the config's (the one
    // written, else the one in place), never the adopted tree's.
    let server = match &made {
        Some((_, config, _, _)) => config
            .pointer("/kubelet/api_server")
            .and_then(Value::as_str)
            .map(str::to_string),
        None => opts
            .config
            .as_deref()
            .and_then(|p| Config::load(p).ok())
            .filter(|c| c.kubelet.bootstrap_token.is_some())
            .map(|c| c.kubelet.api_server),
    }
    .filter(|_| token_mode);
    // unbounded-agent's units go before anything is recorded: its daemon
    // must not re-provision the slot the next activation stages into.
    let agent_units = agent_units(root, systemd, opts)?;
    let identity = carry_identity(root, machine, server.as_deref(), opts.dry_run)?;
    if !opts.dry_run {
        *state.slot_mut(machine) = SlotState {
            status: SlotStatus::Active,
            adopted: true,
            ..SlotState::default()
        };
        state.active = Some(machine);
        state.save(root)?;
    }
    // The config is written after the lock is released: a path unit
    // watching it starts an activation at once, which must find the
    // adoption recorded and the lock free.
    drop(lock);
    let mut adopted = Adopted {
        machine,
        running,
        applied: None,
        config: None,
        notes: Notes::default(),
        agent_units,
        identity,
        extra_args: None,
    };
    if let Some((applied, config, notes, w)) = made {
        if !opts.dry_run {
            // before the config: a path unit watching it starts the
            // activation that renders them
            if let Some(args) = &extra {
                write_extra_args(root, args)?;
            }
            write_config(&w.path, &config)?;
        }
        adopted.extra_args = extra;
        adopted.applied = Some(applied);
        adopted.config = Some(config);
        adopted.notes = notes;
    }
    Ok(adopted)
}

/// `; also needs --force: ...` for a refusal's other fields.
fn also_dropped(also: &[String]) -> String {
    if also.is_empty() {
        String::new()
    } else {
        format!(
            " (also not carried over, and needing --force: {})",
            also.join(", ")
        )
    }
}

/// Refuses a host whose state records anything (kubeslot manages it).
fn refuse_managed(root: &Root, state: &State) -> Result<(), AdoptError> {
    let managed: Vec<String> = Slot::ALL
        .iter()
        .filter(|s| state.slot(**s).status != SlotStatus::Empty)
        .map(|s| format!("{s} {}", state.slot(*s).status))
        .chain(state.active.map(|a| format!("{a} active")))
        .chain(
            state
                .pending
                .as_ref()
                .map(|p| format!("a flip to {} pending", p.to)),
        )
        .collect();
    if !managed.is_empty() {
        return Err(AdoptError::Managed {
            state: root.state_file(),
            what: managed.join(", "),
        });
    }
    Ok(())
}

/// The machine whose applied config unbounded-agent left (exactly one).
fn machine_of_applied(root: &Root) -> Result<Slot, AdoptError> {
    let [k1, k2] = Slot::ALL.map(|s| root.unbounded_applied_config(s.machine()));
    match (k1.exists(), k2.exists()) {
        (true, false) => Ok(Slot::Kube1),
        (false, true) => Ok(Slot::Kube2),
        (true, true) => Err(AdoptError::Ambiguous {
            kube1: k1,
            kube2: k2,
        }),
        (false, false) => Err(AdoptError::NoMachine {
            kube1: k1,
            kube2: k2,
        }),
    }
}

/// unbounded-agent's units installed on the host, stopped and disabled
/// when `opts` say so (not on a dry run).
fn agent_units(
    root: &Root,
    systemd: &dyn Systemd,
    opts: &Options,
) -> Result<Vec<AgentUnit>, AdoptError> {
    let mut agent_units = Vec::new();
    for (unit, why) in AGENT_UNITS {
        let file = root.systemd_system_dir().join(unit);
        if std::fs::symlink_metadata(&file).is_err() {
            continue;
        }
        let disable = opts.disable_agent && !opts.dry_run;
        if disable {
            systemd.stop(unit)?;
            systemd.disable(unit)?;
        }
        agent_units.push(AgentUnit {
            unit,
            why,
            disabled: disable,
        });
    }
    Ok(agent_units)
}

/// Writes the made config (it holds the credential: root only, 0600).
fn write_config(path: &Path, config: &Value) -> Result<(), AdoptError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| AdoptError::Write {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    let mut bytes = serde_json::to_vec_pretty(config).expect("json");
    bytes.push(b'\n');
    kubeslot_image::atomic::write_file_mode(path, &bytes, 0o600).map_err(|e| AdoptError::Write {
        path: path.to_path_buf(),
        reason: kubeslot_image::error_chain(&e),
    })
}

/// What stands in for a secret in shown configs.
pub const REDACTED: &str = "<secret: not shown>";

/// `config` with its secrets (the bootstrap token, the exec credential's
/// arguments and environment values) replaced by [`REDACTED`]: what
/// `--dry-run` prints.
pub fn redacted(config: &Value) -> Value {
    let mut v = config.clone();
    if let Some(t) = v.pointer_mut("/kubelet/bootstrap_token") {
        *t = REDACTED.into();
    }
    if let Some(Value::Object(env)) = v.pointer_mut("/kubelet/exec_credential/env") {
        for val in env.values_mut() {
            *val = REDACTED.into();
        }
    }
    // Arguments often carry a token or a secret's path (`--token=...`).
    if let Some(Value::Array(args)) = v.pointer_mut("/kubelet/exec_credential/args") {
        for arg in args.iter_mut() {
            *arg = REDACTED.into();
        }
    }
    v
}

#[cfg(test)]
mod tests {
    //! Golden conversions of applied configs written from unbounded-agent's
    //! documented schema (`testdata/adopt/<scenario>/applied-config.json`
    //! → `activator.json` and `notes.txt`, or `error.txt`);
    //! `KUBESLOT_UPDATE_GOLDEN=1` rewrites the expected files.

    use super::*;

    fn scenarios() -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/adopt");
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        v.sort();
        v
    }

    fn golden(path: &Path, got: &str) {
        if std::env::var_os("KUBESLOT_UPDATE_GOLDEN").is_some() {
            std::fs::write(path, got).unwrap();
            return;
        }
        let want = std::fs::read_to_string(path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (KUBESLOT_UPDATE_GOLDEN=1 writes it)",
                path.display()
            )
        });
        assert_eq!(got, want, "{} differs", path.display());
    }

    #[test]
    fn applied_configs_convert_as_the_golden_files_say() {
        let all = scenarios();
        assert!(all.len() >= 5, "{all:?}");
        for dir in all {
            let applied = dir.join("applied-config.json");
            let bytes = std::fs::read(&applied).unwrap();
            // the file name in errors is the host path, not the checkout's
            let shown = Path::new("/etc/unbounded/agent/kube1-applied-config.json");
            match config_from_applied(
                shown,
                &bytes,
                "ghcr.io/example/kubeslot-node:v1.35.1",
                &[PathBuf::from("/etc/kubeslot/trust/release.pub")],
            ) {
                Ok((config, notes)) => {
                    let mut text = serde_json::to_string_pretty(&config).unwrap();
                    text.push('\n');
                    golden(&dir.join("activator.json"), &text);
                    golden(&dir.join("notes.txt"), &notes.to_text());
                    assert!(!dir.join("error.txt").exists(), "{}", dir.display());
                    // no value of the applied config reaches the notes,
                    // nor the config as --dry-run shows it
                    let shown = serde_json::to_string(&redacted(&config)).unwrap();
                    for secret in ["abcdef.0123456789abcdef", "s3cr3t"] {
                        assert!(!notes.to_text().contains(secret), "{}", dir.display());
                        assert!(!shown.contains(secret), "{}: {shown}", dir.display());
                    }
                    assert!(shown.contains(REDACTED), "{}: {shown}", dir.display());
                    let changing = notes.behaviour_changing();
                    let name = dir.file_name().unwrap().to_str().unwrap();
                    let want: &[&str] = match name {
                        "later-schema" => &["FutureField.Knob", "LocalDNS"],
                        "kubelet-configuration" => &["Kubelet.Configuration.healthzPort"],
                        _ => &[],
                    };
                    assert_eq!(changing, want, "{name}");
                }
                Err(e) => {
                    golden(
                        &dir.join("error.txt"),
                        &format!("{}\n", kubeslot_image::error_chain(&e)),
                    );
                    assert!(!dir.join("activator.json").exists(), "{}", dir.display());
                }
            }
        }
    }

    #[test]
    fn a_sidecar_that_does_not_match_is_refused_and_a_missing_one_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kube1-applied-config.json");
        std::fs::write(&p, b"{}").unwrap();
        read_applied(&p).unwrap();
        std::fs::write(
            dir.path().join("kube1-applied-config.json.sha256"),
            format!("{}\n", Digest::of(b"{}").hex()),
        )
        .unwrap();
        read_applied(&p).unwrap();
        std::fs::write(dir.path().join("kube1-applied-config.json.sha256"), "00\n").unwrap();
        let e = read_applied(&p).unwrap_err().to_string();
        assert!(
            e.contains("kube1-applied-config.json.sha256 says 00"),
            "{e}"
        );
    }
}
