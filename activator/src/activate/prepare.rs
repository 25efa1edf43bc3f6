//! Step 5: the image fetched and unpacked beside the target slot, the slot
//! marked dirty, the tree swapped in (copied, or an overlay of the layer
//! store), its host files written and the flip recorded "pending,
//! prepared". The slot mode (overlay or copy) is decided here, per staging.

use std::path::Path;

use kubeslot_image::source::Source;

use crate::activate::plan::Flip;
use crate::activate::report::{Datapoint, Downloads, Report};
use crate::config::{Config, SlotMode};
use crate::failpoint;
use crate::render;
use crate::slot::Slot;
use crate::slots::overlay;
use crate::slots::stage::{self, Verified};
use crate::state::{FlipKind, Pending, PendingPhase, SlotState, SlotStatus, State};

use super::begin::Begun;
use super::{ActivateError, Run};

impl Run<'_> {
    /// Stages the image resolved at the start of the run into `flip.to`
    /// (the digest pinned, nothing resolved again). The slot is marked
    /// dirty only once the image is fetched and unpacked beside it: a
    /// refused blob or layer leaves the slot and its record as they were
    /// (a rollback target stays one).
    pub(super) fn stage_slot(
        &self,
        state: &mut State,
        flip: &Flip,
        source: Source,
        verified: &Verified,
        config: &Config,
        report: &mut Report,
    ) -> Result<(), ActivateError> {
        let to = flip.to;
        let mode = self.slot_mode(config, report)?;
        let (downloads, digest) = match mode {
            SlotMode::Overlay => {
                let (fetched, layers) =
                    stage::prepare_layers(self.root, source, verified, &config.unpack)?;
                failpoint::hit("after-unpack");
                self.mark_dirty(state, to)?;
                overlay::install(
                    self.root,
                    self.systemd,
                    to,
                    Some(verified.image.manifest_digest()),
                    &layers.dirs,
                )?;
                let mut d = Downloads::from(&fetched);
                d.layers_unpacked = Some(layers.unpacked as u64);
                d.layers_reused = Some(layers.reused as u64);
                (d, verified.image.manifest_digest())
            }
            SlotMode::Copy => {
                let prepared = stage::prepare_resolved(
                    self.root,
                    source,
                    verified,
                    &config.unpack,
                    to.machine(),
                )?;
                failpoint::hit("after-unpack");
                self.mark_dirty(state, to)?;
                // A slot that was an overlay becomes a plain tree.
                overlay::remove(self.root, self.systemd, to)?;
                let staged = prepared.install()?;
                // What the image put there, file by file: `rollback` refuses
                // a tree whose image-owned files changed since.
                let tree = self.root.machine_tree(to.machine());
                let record_path = self.root.slot_files_record(to.machine());
                crate::slots::record::record_known(&tree, None, &staged.file_hashes)
                    .and_then(|(r, _)| {
                        if let Some(dir) = record_path.parent() {
                            std::fs::create_dir_all(dir)?;
                        }
                        crate::slots::record::save(&record_path, &r)
                    })
                    .map_err(|e| ActivateError::NotIntact {
                        slot: to,
                        reason: format!("recording its files in {}: {e}", record_path.display()),
                    })?;
                (Downloads::from(&staged.report), staged.manifest_digest)
            }
        };
        failpoint::hit("after-stage");
        report.downloads = Some(downloads);
        if digest != flip.digest {
            return Err(ActivateError::Moved {
                slot: to,
                want: flip.digest,
                got: digest,
            });
        }
        Ok(())
    }

    /// Dirty before the tree changes: a crash from here on leaves a slot
    /// recovery empties, never one that could be started half-written or
    /// under a record that no longer matches its tree.
    pub(super) fn mark_dirty(&self, state: &mut State, to: Slot) -> Result<(), ActivateError> {
        *state.slot_mut(to) = SlotState {
            status: SlotStatus::Dirty,
            ..SlotState::default()
        };
        self.save(state)?;
        failpoint::hit("after-mark-dirty");
        Ok(())
    }

    /// The slot mode of this staging: the config's, or (unset) overlay
    /// when the root is the host's `/` and [`overlay::probe`] passes there,
    /// copy otherwise (the report says why): a mount unit is mounted by the
    /// host's systemd, which a tree prepared under another `--root` is not
    /// managed by. An explicit overlay the host cannot do refuses.
    pub(super) fn slot_mode(
        &self,
        config: &Config,
        report: &mut Report,
    ) -> Result<SlotMode, ActivateError> {
        let mode = match config.slots.mode {
            Some(SlotMode::Copy) => SlotMode::Copy,
            Some(SlotMode::Overlay) => {
                overlay::probe(self.root)
                    .map_err(|reason| ActivateError::OverlayUnsupported { reason })?;
                SlotMode::Overlay
            }
            None if self.root.dir() != Path::new("/") => {
                report.slot_mode = Some(format!(
                    "copy (the root {} is not the host's /: overlay slots are mounted by the host's systemd)",
                    self.root.dir().display()
                ));
                return Ok(SlotMode::Copy);
            }
            None => match overlay::probe(self.root) {
                Ok(()) => SlotMode::Overlay,
                Err(why) => {
                    report.slot_mode = Some(format!("copy (overlay not usable here: {why})"));
                    return Ok(SlotMode::Copy);
                }
            },
        };
        report.slot_mode = Some(mode.name().to_string());
        Ok(mode)
    }

    /// Step 5: the target slot staged and rendered, "pending, prepared".
    pub(super) fn prepare(&self, b: &mut Begun, report: &mut Report) -> Result<(), ActivateError> {
        let (inputs, release) = (b.inputs().to_string(), b.release());
        let (flip, config, state) = (&b.flip, &b.config, &mut b.state);
        let to = flip.to;
        report.phase("stage");
        if !flip.reuse_staged {
            let source = b.source.take().expect("opened in begin");
            self.stage_slot(state, flip, source, &b.verified, config, report)?;
        }
        report.mark(Datapoint::Staged);
        report.phase("render");
        render::save_inputs(self.root, to, config)?;
        self.write_files(b.files.slot(to))?;
        failpoint::hit("after-render");
        *state.slot_mut(to) = SlotState {
            status: SlotStatus::Staged,
            digest: Some(flip.digest),
            inputs: Some(inputs.clone()),
            adopted: false,
        };
        self.save(state)?;
        failpoint::hit("after-staged");
        state.pending = Some(Pending {
            kind: FlipKind::Activate,
            phase: PendingPhase::Prepared,
            to,
            digest: Some(flip.digest),
            from: flip.from,
            inputs,
            release,
        });
        self.save(state)?;
        failpoint::hit("after-pending");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activate::fixture::*;
    use crate::activate::*;

    #[test]
    fn fetch_stages_without_touching_machines_and_activate_reuses_the_slot() {
        let (s, fake, first) = setup("healthy", None, "off");
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let config = Config::load(&s.config).unwrap();
        let kubeslot_image::reference::ImageSource::Layout { dir, .. } = &config.image else {
            panic!("layout source expected");
        };
        let second = image_with(dir, "healthy", "2");
        let calls = fake.calls().len();

        let r = fetch(&s.root, &s.config, &fake, &Options::default()).report;
        assert_eq!(
            (r.exit_code, r.outcome, r.slot, r.digest),
            (0, Some(Outcome::Staged), Some(Slot::Kube2), Some(second)),
            "{r:?}"
        );
        assert!(r.downloads.unwrap().blobs_fetched > 0, "{r:?}");
        assert_eq!(fake.calls().len(), calls, "fetch called systemd");
        let st = State::load(&s.root).unwrap();
        assert_eq!(st.active, Some(Slot::Kube1));
        assert_eq!(st.slot(Slot::Kube1).digest, Some(first));
        assert_eq!(st.slot(Slot::Kube2).status, SlotStatus::Staged);
        assert_eq!(st.slot(Slot::Kube2).digest, Some(second));
        assert!(!s.root.nspawn_file("kube2").exists());

        let r = activate(&s.root, &s.config, &fake, &Options::default()).report;
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        assert!(r.downloads.is_none(), "restaged: {r:?}");
        assert_eq!(State::load(&s.root).unwrap().active, Some(Slot::Kube2));
    }

    #[test]
    fn overlay_slots_share_layers_and_rollback_clean_is_the_verified_image() {
        let (s, fake, first) = setup("healthy", None, "off");
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
        c["slots"] = serde_json::json!({"mode": "overlay"});
        std::fs::write(&s.config, serde_json::to_vec(&c).unwrap()).unwrap();

        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        assert_eq!(r.slot_mode.as_deref(), Some("overlay"));
        let d = r.downloads.unwrap();
        assert_eq!((d.layers_unpacked, d.layers_reused), (Some(1), Some(0)));
        let unit = s.root.mount_unit("kube1");
        let calls = fake.calls();
        let mounted = calls.iter().position(|c| *c == format!("start {unit}"));
        let started = calls
            .iter()
            .position(|c| c == "start systemd-nspawn@kube1.service");
        assert!(mounted < started && mounted.is_some(), "{calls:?}");
        let kube1 = s.root.machine_tree("kube1");
        let verified = files_of(&kube1);
        assert_eq!(verified["etc/fixture-health"], b"healthy");

        // The node writes into its tree: only its upper changes.
        std::fs::write(kube1.join("etc/written-by-node"), b"x").unwrap();
        std::fs::write(kube1.join("etc/version"), b"changed by the node").unwrap();
        let layers_before = files_of(&s.root.layers_dir());

        let config = Config::load(&s.config).unwrap();
        let kubeslot_image::reference::ImageSource::Layout { dir, .. } = &config.image else {
            panic!("layout source expected");
        };
        let second = image_with(dir, "healthy", "2");
        let r = run(&s, &fake);
        assert_eq!(
            (r.outcome, r.slot),
            (Some(Outcome::Committed), Some(Slot::Kube2)),
            "{r:?}"
        );
        let d = r.downloads.unwrap();
        assert_eq!((d.layers_unpacked, d.layers_reused), (Some(1), Some(0)));
        assert_eq!(
            State::load(&s.root).unwrap().slot(Slot::Kube2).digest,
            Some(second)
        );
        // kube1's layer is untouched by the node's writes and by the flip.
        let layers_after = files_of(&s.root.layers_dir());
        for (k, v) in &layers_before {
            assert_eq!(layers_after.get(k), Some(v), "{k}");
        }

        let r = rollback(
            &s.root,
            &fake,
            &RollbackOptions {
                clean: true,
                ..RollbackOptions::default()
            },
        )
        .report;
        assert_eq!(
            (r.outcome, r.slot),
            (Some(Outcome::Committed), Some(Slot::Kube1)),
            "{r:?}"
        );
        assert_eq!(
            State::load(&s.root).unwrap().slot(Slot::Kube1).digest,
            Some(first)
        );
        assert_eq!(files_of(&kube1), verified, "kube1 after rollback --clean");

        // v3 replaces v2 in kube2: v2's layer and metadata layer are
        // mounted by no slot and go.
        let v2_layers = crate::slots::overlay::layers::referenced(&s.root).unwrap();
        let third = image_with(dir, "healthy", "3");
        let r = run_opts(
            &s,
            &fake,
            Options {
                force: true,
                ..Options::default()
            },
        );
        assert_eq!(
            (r.outcome, r.slot),
            (Some(Outcome::Committed), Some(Slot::Kube2)),
            "{r:?}"
        );
        assert_eq!(
            State::load(&s.root).unwrap().slot(Slot::Kube2).digest,
            Some(third)
        );
        assert!(
            r.gc.as_deref().unwrap().contains(", 2 layer dir(s);"),
            "{r:?}"
        );
        let now = crate::slots::overlay::layers::referenced(&s.root).unwrap();
        let gone: Vec<_> = v2_layers.difference(&now).collect();
        assert_eq!(gone.len(), 2, "{gone:?}");
        for g in gone {
            assert!(!g.exists(), "{}", g.display());
            assert!(!crate::slots::record::record_path(g).exists());
        }
        // two layer dirs, two metadata layers (v1's, v3's) and their records
        assert_eq!(std::fs::read_dir(s.root.layers_dir()).unwrap().count(), 8);
    }
}
