//! The checks around a flip: [`preflight`] before the running node is
//! stopped for a new one (does this host have what a node machine needs),
//! [`health`] after the new machine starts (the gate a flip must pass to be
//! committed) and [`diagnostics`] (what a report carries when a machine
//! failed its gate).
//!
//! They check and tell; what a failure means (a refused flip, a rollback,
//! a bad mark) is decided by [`crate::activate`].

pub mod cluster;
pub mod diagnostics;
pub mod health;
pub mod listener;
pub mod preflight;
