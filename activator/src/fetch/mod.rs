//! Where images come from and what is kept of them: the first steps of the
//! core path (resolve, verify, fetch) as far as the host is concerned.
//!
//! * [`access`] — the config's `registries`, `trust` and `download`
//!   sections turned into the image crate's inputs through the root handle:
//!   the trust policy and the key files it names, the registry settings,
//!   the pacing of registry requests. The sections' schema is the config's
//!   (`config/registries.rs`); this reads the files they name.
//! * [`store`] — the content store: verified blobs only, reused across runs;
//!   a layer can be unpacked while it downloads ([`store::Store::fetch_streaming`]).
//! * [`parallel`] — a few layers at once, on plain threads.
//!
//! Resolving, verifying and fetching themselves are `kubeslot_image`'s.
//! Nothing here unpacks (that is [`crate::slots`]) or decides what to fetch
//! ([`crate::activate::plan`]).

pub mod access;
pub mod parallel;
pub mod store;
