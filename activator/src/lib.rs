//! The host side of kubeslot: everything that turns a verified image into a
//! running node machine on this host, and back.
//!
//! It is given a root handle (`/` in production, a temp dir in tests) and the
//! activator config; it owns the host's view: config, well-known paths,
//! the content store, state and report, slots, host-file rendering, GPU
//! discovery, the health gate and the systemd boundary. The image format and
//! its trust (digests, sources, signatures, the unpacker) come from
//! `kubeslot_image`; nothing here knows about recipes, signing keys or the
//! builder (see ARCHITECTURE.md, "Invariants").

pub mod activate;
pub mod adopt;
pub mod bundle;
pub mod config;
pub mod diagnostics;
pub mod dirattrs;
pub mod extra_args;
pub mod failpoint;
pub mod fingerprint;
pub mod gc;
pub mod gpu;
pub mod health;
pub mod host_network;
pub mod host_settings;
pub mod intact;
pub mod integrity;
pub mod layers;
pub mod lock;
pub mod metalayer;
pub mod overlay;
pub mod paths;
pub mod plan;
pub mod preflight;
pub mod progress;
pub mod remove;
pub mod render;
pub mod report;
pub mod slot;
pub mod stage;
pub mod state;
pub mod store;
pub mod systemd;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trust;
pub mod uninstall;
pub mod walk;
