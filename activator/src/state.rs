//! The slot state machine's persistent record: `/var/lib/kubeslot/state.json`
//! plus a `state.json.sha256` sidecar.
//!
//! Owns the [`State`] document and its atomic load/save.
//! It is given the root handle; it does not decide transitions (that is
//! `plan`/`activate`) and does not lock (callers hold `lock::Lock`).
//!
//! Why a sidecar: a state file that is torn or edited by hand must not be
//! trusted silently. The writes are ordered so that a crash between them is
//! recognisable: the state is written (temp, fsync, rename, fsync dir) and then
//! its digest; a state whose digest does not match is reported, never guessed.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use kubeslot_image::atomic::{self, AtomicError};
use kubeslot_image::Digest;
use serde::{Deserialize, Serialize};

use crate::paths::Root;
use crate::slot::Slot;

/// The serde name of a unit-variant enum (`previous`, `rolled-back`): text
/// output speaks the same words as `state.json` and `report.json`.
pub(crate) fn serde_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

impl fmt::Display for SlotStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_name(self))
    }
}

impl fmt::Display for FlipKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_name(self))
    }
}

impl fmt::Display for PendingPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_name(self))
    }
}

/// What a slot's tree holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotStatus {
    /// Nothing usable (never staged, or given up).
    #[default]
    Empty,
    /// Being replaced: the tree may be partial. Never started in this state.
    Dirty,
    /// A complete verified tree and rendered files, not yet run.
    Staged,
    /// The committed, running node.
    Active,
    /// The previously committed node, kept for rollback.
    Previous,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotState {
    pub status: SlotStatus,
    /// The manifest digest of the tree (absent when empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    /// The hash of the host files rendered for this slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<String>,
    /// The tree was set up by another tool (unbounded-agent) and taken over
    /// by `adopt`: it has no image digest, was never verified, and keeps the
    /// host files that tool wrote; it stays a rollback target until a flip
    /// stages an image over it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

/// Why a flip is under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlipKind {
    /// A new image (or new host files) from `activate`.
    Activate,
    /// Back to the previous slot, from `rollback`.
    Rollback,
}

/// How far a flip got; recorded before each irreversible step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PendingPhase {
    /// The target is staged and rendered; no machine was touched yet.
    Prepared,
    /// The one try is under way: the old machine may be stopped, the new one
    /// starting or being health-checked. A run that finds this phase rolls
    /// back and marks the digest bad (the try was used up).
    Trying,
}

/// A flip that has not been committed or rolled back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pending {
    pub kind: FlipKind,
    pub phase: PendingPhase,
    /// The slot being switched to.
    pub to: Slot,
    /// The image it holds (absent for a rollback to an adopted tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    /// The slot that was active (restarted on rollback), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Slot>,
    /// The host-file inputs hash of the target (what a bad mark records).
    #[serde(default)]
    pub inputs: String,
    /// The release an activation commits (recorded in
    /// [`State::releases`] by the commit); absent for a rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<Release>,
}

/// A committed release of one signing identity: the newest one a host ran
/// is the floor for the next activation (an older one is refused as a
/// downgrade unless allowed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Release {
    /// The repository its signature names (`trust.identity`).
    pub identity: String,
    /// Its platform manifest digest.
    pub digest: Digest,
    /// The signed image config's `created` (RFC 3339), as written.
    pub created: String,
}

impl Release {
    /// `created` in seconds since the epoch, when it parses.
    pub fn created_secs(&self) -> Option<i64> {
        kubeslot_image::time::parse_rfc3339(&self.created)
    }
}

/// A digest that failed its health gate (or was rolled away from), with the
/// rendered-inputs hash it failed with: the same image with changed host
/// files may be tried again, the same pair is not retried automatically.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BadImage {
    pub digest: Digest,
    pub inputs: String,
    pub reason: String,
    pub at: String,
}

/// `state.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    pub version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<Slot>,
    pub slots: BTreeMap<Slot, SlotState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
    #[serde(default)]
    pub bad: Vec<BadImage>,
    /// Per signing identity, the newest release committed on this host.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub releases: BTreeMap<String, Release>,
    /// The Node kubeslot cordoned for a drain and has not uncordoned yet
    /// (saved before the cordon): the next run, or the boot's, uncordons
    /// it. A Node an operator cordoned is never recorded here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordoned: Option<Cordoned>,
}

/// What uncordoning needs without the config (recovery runs before it is
/// read): the Node, the kubeconfig and the machine whose files it names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cordoned {
    pub node: String,
    /// The kubeconfig as a path under the root.
    pub kubeconfig: PathBuf,
    pub machine: String,
    pub request_timeout_secs: u64,
}

impl Default for State {
    fn default() -> Self {
        State {
            version: 1,
            active: None,
            slots: Slot::ALL
                .iter()
                .map(|s| (*s, SlotState::default()))
                .collect(),
            pending: None,
            bad: Vec::new(),
            releases: BTreeMap::new(),
            cordoned: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state: {0}")]
    Write(#[source] AtomicError),
    #[error("state {path}: invalid: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("state {path}: content hashes to {actual} but the sidecar {sidecar} says {expected} (torn write or edited by hand; inspect and remove both files to start over)")]
    Sidecar {
        path: PathBuf,
        sidecar: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("state {path}: unsupported version {version}")]
    Version { path: PathBuf, version: u32 },
}

fn sidecar_path(root: &Root) -> PathBuf {
    let mut p = root.state_file().into_os_string();
    p.push(".sha256");
    PathBuf::from(p)
}

impl State {
    pub fn slot(&self, slot: Slot) -> &SlotState {
        self.slots.get(&slot).unwrap_or(&EMPTY)
    }

    pub fn slot_mut(&mut self, slot: Slot) -> &mut SlotState {
        self.slots.entry(slot).or_default()
    }

    /// The digest committed in the active slot.
    pub fn active_digest(&self) -> Option<Digest> {
        self.active.and_then(|s| self.slot(s).digest)
    }

    pub fn is_bad(&self, digest: &Digest, inputs: &str) -> Option<&BadImage> {
        self.bad
            .iter()
            .find(|b| &b.digest == digest && b.inputs == inputs)
    }

    /// Records `release` as committed: it becomes the identity's floor
    /// unless an even newer one is recorded (a downgrade committed with
    /// `--allow-downgrade` does not lower the floor).
    pub fn record_release(&mut self, release: Release) {
        let newer = match self.releases.get(&release.identity) {
            None => true,
            Some(old) => match (release.created_secs(), old.created_secs()) {
                (Some(new), Some(old)) => new >= old,
                (Some(_), None) => true,
                (None, _) => false,
            },
        };
        if newer {
            self.releases.insert(release.identity.clone(), release);
        }
    }

    /// Lifts `digest`'s mark for `inputs`: what a commit of it does.
    pub fn unmark_bad(&mut self, digest: &Digest, inputs: &str) {
        self.bad
            .retain(|b| !(&b.digest == digest && b.inputs == inputs));
    }

    pub fn mark_bad(&mut self, digest: Digest, inputs: String, reason: String) {
        self.unmark_bad(&digest, &inputs);
        self.bad.push(BadImage {
            digest,
            inputs,
            reason,
            at: kubeslot_image::time::now_rfc3339(),
        });
    }

    /// Reads the state; a missing file is the empty state of a fresh host.
    pub fn load(root: &Root) -> Result<State, StateError> {
        let path = root.state_file();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
            Err(source) => return Err(StateError::Read { path, source }),
        };
        let sidecar = sidecar_path(root);
        let expected = match std::fs::read_to_string(&sidecar) {
            Ok(s) => s.trim().to_string(),
            // The first save ever, killed between its writes: only `.next`
            // can vouch for the state (see `load_torn`).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => MISSING.to_string(),
            Err(source) => {
                return Err(StateError::Read {
                    path: sidecar,
                    source,
                })
            }
        };
        let actual = Digest::of(&bytes).hex();
        if expected != actual {
            return Err(StateError::Sidecar {
                path,
                sidecar,
                expected,
                actual,
            });
        }
        parse(&path, &bytes)
    }

    /// Writes the state, then its sidecar, each atomically.
    ///
    /// A crash between the two leaves a state whose sidecar names the
    /// previous content; `load` then refuses it. To make that window
    /// harmless the sidecar is written first under a second name and the
    /// state file is only trusted when one of the two matches.
    pub fn save(&self, root: &Root) -> Result<(), StateError> {
        let path = root.state_file();
        let dir = root.state_dir();
        std::fs::create_dir_all(&dir).map_err(|source| StateError::Read {
            path: dir.clone(),
            source,
        })?;
        let mut bytes = serde_json::to_vec_pretty(self).expect("state serialises");
        bytes.push(b'\n');
        let hex = Digest::of(&bytes).hex();
        let sidecar = sidecar_path(root);
        let next = next_sidecar_path(root);
        // 1. the digest of what we are about to write, under `.next`
        atomic::write_file(&next, format!("{hex}\n").as_bytes()).map_err(StateError::Write)?;
        // 2. the state itself
        atomic::write_file(&path, &bytes).map_err(StateError::Write)?;
        // A crash here leaves a state only `.next` vouches for.
        crate::failpoint::hit("state-between-writes");
        // 3. the sidecar proper
        atomic::write_file(&sidecar, format!("{hex}\n").as_bytes()).map_err(StateError::Write)?;
        Ok(())
    }

    /// Like [`State::load`], but also accepts a state matching the `.next`
    /// sidecar (a save that died between its writes) without writing
    /// anything: returns the state and, when the sidecar needs that repair,
    /// what the next locked run will repair. For `status`.
    pub fn load_torn(root: &Root) -> Result<(State, Option<String>), StateError> {
        match State::load(root) {
            Err(StateError::Sidecar {
                path,
                sidecar,
                expected,
                actual,
            }) => {
                let next = next_sidecar_path(root);
                let next_hex = std::fs::read_to_string(&next)
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default();
                if next_hex != actual {
                    return Err(StateError::Sidecar {
                        path,
                        sidecar,
                        expected,
                        actual,
                    });
                }
                let state = parse(
                    &path,
                    &std::fs::read(&path).map_err(|source| StateError::Read {
                        path: path.clone(),
                        source,
                    })?,
                )?;
                let stale = if expected == MISSING {
                    "is missing (the first save)".to_string()
                } else {
                    format!("still names the previous content ({expected})")
                };
                let repair = format!(
                    "{} was saved but {} {stale}; {} vouches for it ({actual}): the next activate, fetch or rollback rewrites the sidecar",
                    path.display(),
                    sidecar.display(),
                    next.display()
                );
                Ok((state, Some(repair)))
            }
            other => other.map(|s| (s, None)),
        }
    }

    /// Like [`State::load`], but also accepts a state matching the `.next`
    /// sidecar (a save that died between its writes), then repairs the
    /// sidecar. Only for a caller holding the run lock.
    pub fn load_repairing(root: &Root) -> Result<State, StateError> {
        let (state, repair) = State::load_torn(root)?;
        if repair.is_some() {
            // the bytes on disk are what `.next` vouched for; re-read them
            // rather than trusting that re-serialising is byte-identical
            let on_disk = std::fs::read(root.state_file()).map_err(|source| StateError::Read {
                path: root.state_file(),
                source,
            })?;
            let actual = Digest::of(&on_disk).hex();
            let sidecar = sidecar_path(root);
            atomic::write_file(&sidecar, format!("{actual}\n").as_bytes())
                .map_err(StateError::Write)?;
            return State::load(root);
        }
        Ok(state)
    }
}

/// Parses and version-checks state bytes read from `path`.
fn parse(path: &std::path::Path, bytes: &[u8]) -> Result<State, StateError> {
    let state: State = serde_json::from_slice(bytes).map_err(|source| StateError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    if state.version != 1 {
        return Err(StateError::Version {
            path: path.to_path_buf(),
            version: state.version,
        });
    }
    Ok(state)
}

/// What a missing sidecar "says" in a [`StateError::Sidecar`].
const MISSING: &str = "nothing (missing)";

fn next_sidecar_path(root: &Root) -> PathBuf {
    let mut p = root.state_file().into_os_string();
    p.push(".sha256.next");
    PathBuf::from(p)
}

static EMPTY: SlotState = SlotState {
    status: SlotStatus::Empty,
    digest: None,
    inputs: None,
    adopted: false,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_sidecar() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        assert_eq!(State::load(&root).unwrap(), State::default());
        let mut s = State {
            active: Some(Slot::Kube2),
            ..State::default()
        };
        s.slot_mut(Slot::Kube2).status = SlotStatus::Active;
        s.slot_mut(Slot::Kube2).digest = Some(Digest::of(b"x"));
        s.save(&root).unwrap();
        assert_eq!(State::load(&root).unwrap(), s);

        // a torn or edited state is refused, naming both files
        std::fs::write(root.state_file(), b"{}").unwrap();
        let e = State::load(&root).unwrap_err().to_string();
        assert!(e.contains("state.json") && e.contains("sidecar"), "{e}");
        assert!(State::load_repairing(&root).is_err());
    }

    #[test]
    fn a_save_that_died_between_writes_is_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let s = State::default();
        s.save(&root).unwrap();
        // simulate: `.next` and state written, sidecar not yet
        let t = State {
            active: Some(Slot::Kube1),
            ..State::default()
        };
        let mut bytes = serde_json::to_vec_pretty(&t).unwrap();
        bytes.push(b'\n');
        let hex = Digest::of(&bytes).hex();
        std::fs::write(next_sidecar_path(&root), format!("{hex}\n")).unwrap();
        std::fs::write(root.state_file(), &bytes).unwrap();
        assert!(State::load(&root).is_err());
        // read-only: the state and what would be repaired, nothing written
        let sidecar = std::fs::read(sidecar_path(&root)).unwrap();
        let (got, repair) = State::load_torn(&root).unwrap();
        assert_eq!(got, t);
        assert!(repair.unwrap().contains("state.json.sha256"));
        assert_eq!(std::fs::read(sidecar_path(&root)).unwrap(), sidecar);
        assert!(State::load(&root).is_err());
        assert_eq!(State::load_repairing(&root).unwrap(), t);
        assert_eq!(State::load(&root).unwrap(), t);
    }

    #[test]
    fn bad_marks_are_per_digest_and_inputs() {
        let mut s = State::default();
        let d = Digest::of(b"img");
        s.mark_bad(d, "a".into(), "health".into());
        assert!(s.is_bad(&d, "a").is_some());
        assert!(s.is_bad(&d, "b").is_none());
        s.mark_bad(d, "a".into(), "again".into());
        assert_eq!(s.bad.len(), 1);
    }
}
