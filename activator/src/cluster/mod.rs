//! The Kubernetes API as the node sees it (issue 38): [`pods`] decides
//! which pods a drain evicts, which it skips and why, and which budgets
//! stand in the way.

pub mod pods;
