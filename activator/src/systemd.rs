//! The systemd boundary trait. (owner: host-side)
