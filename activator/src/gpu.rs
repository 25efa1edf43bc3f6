//! GPU discovery. (owner: host-side)
