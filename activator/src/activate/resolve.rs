//! The image a run works on, resolved and verified once
//! ([`open_verified`]), what staging it would write ([`disk_use`]), and
//! the host-file inputs hash a slot and a bad mark record.
//!
//! Reads the image source and the content store; writes nothing but an
//! `oci-archive`'s extraction (removed with the source).

use std::sync::Arc;

use kubeslot_image::digest::Digest;
use kubeslot_image::oci::Platform;
use kubeslot_image::retry::Pacing;
use kubeslot_image::source::Source;

use crate::activate::report::{Datapoint, Report};
use crate::config::Config;
use crate::gate::preflight;
use crate::paths::Root;
use crate::render::{self, HostFacts, HostFiles};
use crate::slot::Slot;
use crate::slots::stage::{self, Verified};
use crate::state::{SlotStatus, State};

use super::ActivateError;

/// The image a run works on, resolved once at its start: the open source
/// (an `oci-archive` extracted once, into the machines dir) and the verified
/// selection. Staging consumes the source and uses the selection, so every
/// source kind is resolved exactly once per run and a tag that moves
/// meanwhile changes nothing.
pub struct Resolved {
    pub source: Source,
    pub verified: Verified,
}

impl Resolved {
    /// The digest this host keys the image by: its platform manifest, what
    /// the signature covers for this host (directly, or through a signed
    /// index that names it). A signed manifest re-wrapped in another index
    /// is the same image.
    pub fn digest(&self) -> Digest {
        self.verified.image.manifest_digest()
    }

    /// The top-level digest the reference resolved to (the index, or the
    /// manifest itself for a single-platform image), shown beside it.
    pub fn index_digest(&self) -> Digest {
        self.verified.image.image_digest()
    }
}

/// Opens the configured source, resolves the reference once and checks the
/// trust policy (fail closed), for a look at the image (`plan`,
/// `preflight`): registries get [`crate::fetch::access::INSPECT_DEADLINE`] at most,
/// not the download deadline of a run. Fetches no layer.
pub fn open_verified(root: &Root, config: &Config) -> Result<Resolved, ActivateError> {
    open_verified_paced(
        root,
        config,
        Arc::new(crate::fetch::access::inspect_pacing(&config.download)),
    )
}

/// [`open_verified`] whose registry requests (and the staging that takes
/// the source) go through `pacing`.
pub fn open_verified_paced(
    root: &Root,
    config: &Config,
    pacing: Arc<Pacing>,
) -> Result<Resolved, ActivateError> {
    open_and_verify(root, config, pacing, &mut |_| {})
}

/// [`open_verified_paced`] that records the report's `resolved` and
/// `verified` datapoints.
pub(super) fn open_verified_marked(
    root: &Root,
    config: &Config,
    pacing: Arc<Pacing>,
    report: &mut Report,
) -> Result<Resolved, ActivateError> {
    open_and_verify(root, config, pacing, &mut |p| report.mark(p))
}

fn open_and_verify(
    root: &Root,
    config: &Config,
    pacing: Arc<Pacing>,
    mark: &mut dyn FnMut(Datapoint),
) -> Result<Resolved, ActivateError> {
    let policy = crate::fetch::access::policy(&config.trust, &config.image, root)?;
    let scratch = root.machines_dir();
    let registries = crate::fetch::access::registries(&config.registries, root);
    let proxy = crate::fetch::access::proxy(config.proxy.as_ref(), root);
    let source =
        Source::open_proxied(&config.image, &registries, proxy.as_ref(), &scratch, pacing)?;
    let verified =
        stage::resolve_and_verify_with(&source, &policy, &Platform::host(), &mut || {
            mark(Datapoint::Resolved)
        })?;
    mark(Datapoint::Verified);
    Ok(Resolved { source, verified })
}

/// Resolves the configured reference once and checks the trust policy.
pub fn resolve(root: &Root, config: &Config) -> Result<Digest, ActivateError> {
    Ok(open_verified(root, config)?.digest())
}

/// What activating the configured image would write on this host
/// (resolved and verified, no layer fetched; the state read, not
/// repaired): nothing when the slot the next flip uses holds it already,
/// else what the content store lacks plus the unpacked tree. For the
/// `preflight` command.
pub fn disk_use(root: &Root, config: &Config) -> Result<preflight::DiskUse, ActivateError> {
    let r = open_verified(root, config)?;
    let (state, _repair) = State::load_torn(root)?;
    let digest = r.digest();
    let target = state.slot(state.active.map_or(Slot::Kube1, Slot::other));
    if target.status == SlotStatus::Staged && target.digest == Some(digest) {
        return Ok(preflight::DiskUse::Staged);
    }
    Ok(preflight::DiskUse::Needs(preflight::DiskNeed::of(
        root,
        &r.verified.image,
    )))
}

/// A run's host files for both slots, rendered once from (config, host
/// facts) and carried: the inputs hash, whether the active slot's files are
/// current, what staging writes and what `plan` diffs all read these.
pub struct Rendered {
    kube1: HostFiles,
    kube2: HostFiles,
}

impl Rendered {
    pub fn new(config: &Config, facts: &HostFacts) -> Rendered {
        Rendered {
            kube1: render::render(config, Slot::Kube1, facts),
            kube2: render::render(config, Slot::Kube2, facts),
        }
    }

    /// `slot`'s files.
    pub fn slot(&self, slot: Slot) -> &HostFiles {
        match slot {
            Slot::Kube1 => &self.kube1,
            Slot::Kube2 => &self.kube2,
        }
    }

    /// The hash that names a set of host-file inputs (the files rendered
    /// for kube1, so the value does not depend on the slot): what a bad
    /// mark and a slot record.
    pub fn inputs_hash(&self) -> String {
        let mut text = String::new();
        for f in &self.kube1.files {
            text += &format!(
                "{}\0{:o}\0{}\0{}\0",
                f.path.display(),
                f.mode,
                f.contents.len(),
                f.contents
            );
        }
        Digest::of(text.as_bytes()).hex()
    }

    /// Whether `slot`'s host files on disk are these.
    pub fn current(&self, root: &Root, slot: Slot) -> bool {
        render::diff(root, self.slot(slot))
            .iter()
            .all(|d| d.diff.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activate::fixture::*;
    use crate::activate::*;

    #[test]
    fn a_tag_moved_between_resolve_and_stage_cannot_change_what_is_staged() {
        let (s, _fake, first) = setup("healthy", None, "off");
        let config = Config::load(&s.config).unwrap();
        let resolved = open_verified(&s.root, &config).unwrap();
        assert_eq!(resolved.digest(), first);
        // the tag now names another image
        let kubeslot_image::reference::ImageSource::Layout { dir, .. } = &config.image else {
            panic!("layout source expected");
        };
        let moved = image(dir, "moved");
        assert_ne!(moved, first);
        assert_eq!(resolve(&s.root, &config).unwrap(), moved);

        let staged = stage::stage_resolved(
            &s.root,
            resolved.source,
            &resolved.verified,
            &config.unpack,
            "kube1",
        )
        .unwrap();
        assert_eq!(staged.manifest_digest, first);
        let tree = s.root.machine_tree("kube1");
        assert_eq!(
            std::fs::read_to_string(tree.join("etc/fixture-health")).unwrap(),
            "healthy"
        );
    }

    #[test]
    fn an_archive_source_is_extracted_once_per_run() {
        let (s, fake, digest) = setup("healthy", None, "off");
        let dir = s.config.parent().unwrap().to_path_buf();
        let archive = dir.join("image.oci.tar");
        std::fs::write(&archive, archive_of(&dir.join("img"))).unwrap();
        let watch = watch_opens(&archive);
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
        c["image"] = format!("oci-archive:{}:t", archive.display()).into();
        std::fs::write(&s.config, serde_json::to_vec(&c).unwrap()).unwrap();

        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        assert_eq!(r.digest, Some(digest));
        assert_eq!(opens(&watch), 1, "the archive was not read exactly once");
        // an up-to-date run resolves (and so extracts) once too
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::UpToDate));
        assert_eq!(opens(&watch), 1);
        // nothing of the extraction is left
        let left: Vec<_> = std::fs::read_dir(s.root.machines_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().starts_with(".archive-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn the_disk_need_counts_what_the_store_lacks_and_reads_stored_layer_sizes() {
        let (s, fake, _) = setup("healthy", None, "off");
        let config = Config::load(&s.config).unwrap();
        let image = open_verified(&s.root, &config).unwrap().verified.image;
        let blobs: u64 =
            image.manifest.config.size + image.layers.iter().map(|(d, _, _)| d.size).sum::<u64>();
        // an empty store: everything to fetch, the tree estimated
        let need = preflight::DiskNeed::of(&s.root, &image);
        assert_eq!(
            (need.fetch, need.exact_layers, need.layers),
            (blobs, 0, 1),
            "{need:?}"
        );
        assert_eq!(need.tree, image.layers[0].0.size * 4);
        // once stored: nothing to fetch, the tree from the gzip trailer
        // plus a tenth (the layer's tar is 2560 bytes: a header and a data
        // block for etc/fixture-health, a header for the empty
        // etc/version, the two end blocks)
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let need = preflight::DiskNeed::of(&s.root, &image);
        assert_eq!((need.fetch, need.exact_layers), (0, 1), "{need:?}");
        assert_eq!(need.tree, 2560 + 256);
    }

    #[test]
    fn a_manifest_rewrapped_in_a_new_index_is_the_same_image() {
        let (s, fake, manifest) = setup("healthy", None, "off");
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let index = rewrap_in_index(&img_dir(&s), "a new wrapper");
        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::UpToDate), "{r:?}");
        assert_eq!((r.digest, r.index_digest), (Some(manifest), Some(index)));
    }
}
