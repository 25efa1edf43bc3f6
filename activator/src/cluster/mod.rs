//! The Kubernetes API, as this node sees it (issue 38): a small blocking
//! client ([`client`]) reading a kubeconfig ([`kubeconfig`]), by default
//! the node's own (the kubelet's credentials after TLS bootstrap, kept in
//! the node state across flips), and [`pods`]: which pods a drain evicts,
//! which it skips and why, and which budgets stand in the way.
//!
//! It stands below `gate` and `activate` (`ci/lint/modules.py`): the
//! drain before a flip, the cluster gate after it and what the node
//! reports to the cluster all use it; it uses only the ground floor.

pub mod client;
pub mod drain;
pub mod kubeconfig;
pub mod node;
pub mod pods;
pub mod report;

pub use client::{path, Client, Error, PatchType, Status};
pub use kubeconfig::{Credential, Kubeconfig};
