//! The host around the slots, off the core path: taking over a node that
//! another tool set up ([`adopt`]), taking kubeslot off the host
//! ([`uninstall`]), garbage collection of the content and layer stores
//! ([`gc`]), and what a node's pod network leaves in the host's network
//! namespace ([`network`], cleaned between flips and by `uninstall`).
//!
//! Each is one command's library side; the core path calls only [`gc`]
//! (after a commit) and [`network`].

pub mod adopt;
pub mod gc;
pub mod network;
pub mod uninstall;
