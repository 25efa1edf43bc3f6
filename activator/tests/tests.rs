//! The activator's black-box tests, one binary (as ripgrep does): each
//! module is one subject, and the crate and its dependencies are linked
//! once instead of once per file. No module needs a process of its own
//! (none changes the environment, the working directory, the umask or
//! other process-wide state; the binary's own runs get theirs through
//! `Command`).

mod cluster;
mod config_reference;
mod differential;
mod fetch;
mod help;
mod host;
mod identity;
mod keyless;
mod overlay;
mod render;
mod rollout;
mod security;
mod throttle;
mod unpack;
