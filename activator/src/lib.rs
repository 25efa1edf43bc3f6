//! The trusted core of kubeslot: everything a host relies on to turn an image
//! reference into a verified tree in a `systemd-nspawn` slot.
//!
//! The builder links this library for the formats and runs its verification
//! over its own output; nothing here knows about recipes, signing keys or the
//! builder (see ARCHITECTURE.md, "Invariants").

pub mod archive;
pub mod config;
pub mod digest;
pub mod gpu;
pub mod layout;
pub mod oci;
pub mod paths;
pub mod reference;
pub mod registry;
pub mod render;
pub mod report;
pub mod signature;
pub mod source;
pub mod stage;
pub mod state;
pub mod store;
pub mod systemd;
pub mod unpack;
pub mod verify;

pub use digest::Digest;
pub use reference::{ImageRef, ImageSource};
