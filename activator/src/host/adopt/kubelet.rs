//! What the adopted node gave its kubelet beyond the applied config's
//! plain settings: the agent's `Kubelet.Configuration` object (mapped onto
//! `kubelet.cluster_domain`, `server_tls_bootstrap` and `config`, less what
//! kubeslot renders) and the node's `/etc/default/kubelet`
//! (`KUBELET_EXTRA_ARGS`, carried to the host's
//! `/etc/kubeslot/default-kubelet`).
//!
//! Given the applied config's object, or the adopted tree (read through
//! `identity::read_tree_file`: beneath the tree, no link followed); writes
//! only `/etc/kubeslot/default-kubelet`, when `adopt` says so.

use std::path::Path;

use serde_json::{Map, Value};

use crate::paths::Root;
use crate::slot::Slot;

use super::identity::read_tree_file;
use super::{AdoptError, Notes};

/// How the adopted tree's file is named in notes.
const FIELD: &str = "/etc/default/kubelet";

/// `Kubelet.Configuration` fields the agent overwrites with its own value
/// whatever the object says (its docs forbid them): dropping them changes
/// nothing.
const AGENT_FORCED: &[&str] = &[
    "clusterDNS",
    "containerRuntimeEndpoint",
    "resolvConf",
    "registerWithTaints",
    "rotateCertificates",
];

/// The agent's `Kubelet.Configuration` (a KubeletConfiguration object
/// merged over its baseline) as kubeslot's settings: `clusterDomain` and
/// `serverTLSBootstrap` have their own keys, a field the activator renders
/// itself is dropped (noted, as changing the node unless the agent forced
/// it anyway), and the rest goes to `kubelet.config`, which the image's
/// config is merged with the same way.
pub(super) fn kubelet_configuration(
    mut c: Map<String, Value>,
    kubelet: &mut Map<String, Value>,
    notes: &mut Notes,
) {
    const FIELD: &str = "Kubelet.Configuration";
    c.remove("apiVersion");
    c.remove("kind");
    for (key, to) in [
        ("clusterDomain", "cluster_domain"),
        ("serverTLSBootstrap", "server_tls_bootstrap"),
    ] {
        if let Some(v) = c.remove(key) {
            kubelet.insert(to.into(), v);
            notes.carried.push(to.into());
        }
    }
    // the cluster CA is kubeslot's (kubelet.ca_data); the rest of
    // `authentication` is the object's
    for (outer, inner, why) in [
        (
            "authentication",
            "/x509/clientCAFile",
            "the agent sets its own CA file there; kubeslot binds the cluster CA of kubelet.ca_data",
        ),
        (
            "authorization",
            "/mode",
            "the agent forces Webhook, as kubeslot's image",
        ),
    ] {
        if remove_pointer(c.get_mut(outer), inner) {
            notes.drop(&format!("{FIELD}.{outer}{}", inner.replace('/', ".")), why, false);
        }
        if c.get(outer).is_some_and(|v| v.as_object().is_some_and(Map::is_empty)) {
            c.remove(outer);
        }
    }
    let owned = |k: &str| {
        crate::config::KUBELET_OWNED_FIELDS
            .iter()
            .find(|(f, _)| *f == k)
    };
    let dropped: Vec<String> = c
        .keys()
        .filter(|k| AGENT_FORCED.contains(&k.as_str()) || owned(k).is_some())
        .cloned()
        .collect();
    for key in dropped {
        c.remove(&key);
        let forced = AGENT_FORCED.contains(&key.as_str());
        let why = owned(&key).map_or("set by kubeslot's image or activator", |(_, why)| why);
        notes.drop(
            &format!("{FIELD}.{key}"),
            &if forced {
                format!("the agent overwrites it too; {why}")
            } else {
                format!("kubeslot renders it: {why}")
            },
            !forced,
        );
    }
    if !c.is_empty() {
        kubelet.insert("config".into(), Value::Object(c));
        notes.carried.push("config".into());
    }
}

/// Removes the leaf at `pointer` (`/a/b`) below `v`, leaving emptied
/// objects out; whether it was there.
fn remove_pointer(v: Option<&mut Value>, pointer: &str) -> bool {
    let Some(v) = v else { return false };
    let Some((parent, leaf)) = pointer.rsplit_once('/') else {
        return false;
    };
    let Some(Value::Object(m)) = v.pointer_mut(parent) else {
        return false;
    };
    let removed = m.remove(leaf).is_some();
    if m.is_empty() && !parent.is_empty() {
        if let Some((grand, key)) = parent.rsplit_once('/') {
            if let Some(Value::Object(g)) = v.pointer_mut(grand) {
                g.remove(key);
            }
        }
    }
    removed
}

/// The adopted tree's `/etc/default/kubelet` (the agent's
/// `KUBELET_EXTRA_ARGS` convention): its extra arguments, checked as the
/// host file is; other variables, and arguments kubeslot cannot take over
/// (a flag it owns), are noted as not carried over.
pub(super) fn carry_extra_args(
    root: &Root,
    machine: Slot,
    notes: &mut Notes,
) -> Result<Option<Vec<String>>, AdoptError> {
    let Some(bytes) = read_tree_file(root, machine, "etc/default/kubelet")? else {
        return Ok(None);
    };
    let shown = Path::new("/var/lib/machines")
        .join(machine.machine())
        .join("etc/default/kubelet");
    match crate::render::extra_args::from_agent_file(&shown, &String::from_utf8_lossy(&bytes)) {
        Ok((args, others)) => {
            for var in others {
                notes.drop(
                    &format!("{FIELD} {var}"),
                    "the agent's kubelet unit passed it; kubeslot's passes only KUBELET_EXTRA_ARGS (move its flags there)",
                    true,
                );
            }
            if args.is_empty() {
                return Ok(None);
            }
            notes.carried.push(format!(
                "kubelet extra args ({})",
                Root::host().kubelet_extra_args().display()
            ));
            Ok(Some(args))
        }
        Err(e) => {
            notes.drop(
                &format!("{FIELD} {}", crate::render::extra_args::VARIABLE),
                &kubeslot_image::error_chain(&e),
                true,
            );
            Ok(None)
        }
    }
}

/// The adopted tree's kubelet flags without `--force`: refused, shown in
/// full. The tree is the node's (anything it ran could have written its
/// `/etc/default/kubelet`), and what `adopt` writes to the host's
/// `/etc/kubeslot/default-kubelet` reaches every later node's kubelet. So
/// carried flags (`extra`) need `--force`, and flags the check refused
/// (a flag kubeslot owns, one that turns off the node's security) are
/// named with the rule they broke; with `--force` those are left behind.
pub(super) fn refuse_unforced(
    machine: Slot,
    extra: Option<&[String]>,
    notes: &Notes,
) -> Result<(), AdoptError> {
    let file = Path::new("/var/lib/machines")
        .join(machine.machine())
        .join("etc/default/kubelet");
    let field = format!("{FIELD} {}", crate::render::extra_args::VARIABLE);
    let also = |skip: &str| -> Vec<String> {
        notes
            .behaviour_changing()
            .into_iter()
            .filter(|f| *f != skip)
            .map(str::to_string)
            .collect()
    };
    if let Some(refused) = notes.dropped.iter().find(|d| d.field == field) {
        return Err(AdoptError::KubeletFlags {
            file,
            detail: format!(
                "{}; such flags are never carried over: pass --force to adopt without its {} (or remove them from the file)",
                refused.why,
                crate::render::extra_args::VARIABLE
            ),
            also: also(&field),
        });
    }
    if let Some(args) = extra {
        return Err(AdoptError::KubeletFlags {
            file,
            detail: format!(
                "it sets kubelet flags that would reach every later node's kubelet: {}=\"{}\"; check each and pass --force to carry them over to {}",
                crate::render::extra_args::VARIABLE,
                args.join(" "),
                Root::host().kubelet_extra_args().display()
            ),
            also: also(""),
        });
    }
    Ok(())
}

/// Writes `/etc/kubeslot/default-kubelet` (0644; an existing one was
/// refused without `--force` before anything changed).
pub(super) fn write_extra_args(root: &Root, args: &[String]) -> Result<(), AdoptError> {
    let path = root.kubelet_extra_args();
    let text = format!(
        "# Carried over by `kubeslot-activator adopt` from the adopted node's\n\
         # /etc/default/kubelet: appended to the kubelet's arguments.\n\
         {}=\"{}\"\n",
        crate::render::extra_args::VARIABLE,
        args.join(" ")
    );
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| AdoptError::Write {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    }
    kubeslot_image::atomic::write_file(&path, text.as_bytes()).map_err(|e| AdoptError::Write {
        path: path.clone(),
        reason: kubeslot_image::error_chain(&e),
    })
}
