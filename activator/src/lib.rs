//! The host side of kubeslot: everything that turns a verified image into a
//! running node machine on this host, and back.
//!
//! The core path, in the order a run takes it (resolve → verify → stage →
//! flip → gate → commit), one folder per step:
//!
//! * [`activate`] — the run that walks the path (`activate`, `fetch`,
//!   `rollback`, and `plan` / `--dry-run` without acting), [`activate::plan`]
//!   its one decision and [`activate::report`] what it leaves behind.
//! * [`fetch`] — resolve and verify: where images come from, which
//!   signatures a host accepts, the content store of verified blobs.
//! * [`slots`] — stage: the slot trees (copy and overlay modes, the layer
//!   store) and the records of what a slot holds.
//! * [`render`] — the host files a slot's machine starts with, and what they
//!   are made of (GPU discovery, the kubelet's extra arguments, bundles,
//!   host settings).
//! * [`gate`] — preflight before the flip, the health gate after it, the
//!   diagnostics of a failed gate.
//! * [`cluster`] — the Kubernetes API client the drain, the cluster gate
//!   and the node's reports use (below `gate`), and which pods a drain
//!   evicts and why.
//! * [`rollout`] — the fleet's cluster-wide limit (Leases), the halt and
//!   the Node's desired image, on the `cluster` client (above `gate`).
//!
//! The periphery:
//!
//! * [`host`] — adopt, uninstall, gc, the pod network's host leftovers.
//! * [`config`] — the one input, its schema and validation.
//! * The ground floor every folder stands on: [`paths`] (the root handle),
//!   [`state`], [`lock`], [`slot`], [`systemd`] (the one boundary to the
//!   service manager), [`walk`] and [`remove`] (trees a node wrote),
//!   [`trusted`] (the host files and bind sources kubeslot trusts),
//!   [`progress`], [`failpoint`] and, for tests, `testing`.
//!
//! Arrows run down: ground floor and config < fetch < slots < render <
//! cluster < gate < rollout < host < activate < the binary's `cli` (`ci/lint/modules.py`
//! refuses an arrow up and a cycle).
//!
//! It is given a root handle (`/` in production, a temp dir in tests) and
//! the activator config. The image format and its trust (digests, sources,
//! signatures, the unpacker) come from `kubeslot_image`; nothing here knows
//! about recipes, signing keys or the builder (see ARCHITECTURE.md,
//! "Invariants").

pub mod activate;
pub mod cluster;
pub mod fetch;
pub mod gate;
pub mod render;
pub mod rollout;
pub mod slots;

pub mod host;

pub mod config;
pub mod failpoint;
pub mod lock;
pub mod paths;
pub mod progress;
pub mod remove;
pub mod slot;
pub mod state;
pub mod systemd;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trusted;
pub mod walk;
