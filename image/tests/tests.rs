//! `kubeslot-image`'s black-box tests, one binary (`mod` per file; the
//! unpacker's corpus and differential tests live with the activator, in
//! `activator/tests/unpack.rs`).

mod keyless;
mod no_panics;
mod unpack_order;
