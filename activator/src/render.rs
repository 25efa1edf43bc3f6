//! Rendering of the host files (nspawn, drop-in, kubelet files). (owner: host-side)
