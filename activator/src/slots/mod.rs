//! The two slots' trees and what makes them (the core path's "stage"): an
//! image staged into a slot, copied (unpacked and swapped in) or as an
//! overlay of the layer store, and the records of what a slot holds.
//!
//! * [`stage`] — resolve → verify → fetch into the content store → unpack
//!   into a private directory → swap into place: the primitive that
//!   `activate`'s step 5 (`activate/prepare.rs`) calls.
//! * [`overlay`] — overlay mode: the slot's mount unit (`mod.rs`), the
//!   layer store (`layers.rs`), the per-image metadata layer
//!   (`metalayer.rs`) and the directory attributes both copy
//!   (`dirattrs.rs`).
//! * What a slot holds, from the cheapest record to the strictest check:
//!   [`fingerprint`] (the image digest, entry count and size of a tree:
//!   is it still the tree a flip committed away from), [`record`] (every
//!   entry's kind, mode, owner, xattrs and content hash, and the check of
//!   a tree against it: `verify-layers`, layer reuse, rollback) and
//!   [`rollback_target`] (whether a rollback target is still its image:
//!   the records checked, less what a node writes by design).
//!
//! Which slot, which mode and when is the run's ([`crate::activate`]);
//! nothing here reads or writes the state.

pub mod fingerprint;
pub mod overlay;
pub mod record;
pub mod rollback_target;
pub mod stage;
