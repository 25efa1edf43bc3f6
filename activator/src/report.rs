//! report.json. (owner: host-side)
