//! The rollout's calls through the activator's API client
//! ([`crate::cluster::Client`]), as the rollout identity: Leases and the
//! pause switch in one namespace, Nodes cluster-wide. Counts its requests
//! (the fleet simulation reports them per node).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;

use super::halt::{FleetApi, NodeInfo};
use super::lease::{lease_from, Lease, LeaseApi, LeaseError};
use crate::cluster::{path, Client, Error};

/// The rollout's view of the API server.
#[derive(Clone, Debug)]
pub struct ClusterApi {
    client: Client,
    namespace: String,
    /// Requests sent (shared by clones).
    pub requests: Arc<AtomicU64>,
}

impl ClusterApi {
    pub fn new(client: Client, namespace: &str) -> ClusterApi {
        ClusterApi {
            client,
            namespace: namespace.to_string(),
            requests: Arc::default(),
        }
    }

    fn leases(&self, name: Option<&str>) -> String {
        path(
            "coordination.k8s.io/v1",
            Some(&self.namespace),
            "leases",
            name,
        )
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
}

fn lease_error(e: Error) -> LeaseError {
    if e.is_conflict() {
        LeaseError::Conflict
    } else {
        LeaseError::Api(e.to_string())
    }
}

impl LeaseApi for ClusterApi {
    fn list_leases(&mut self) -> Result<Vec<Lease>, LeaseError> {
        self.count();
        let items = self
            .client
            .list(&self.leases(None), &[])
            .map_err(lease_error)?;
        Ok(items.iter().map(lease_from).collect())
    }

    fn create_lease(&mut self, body: &Value) -> Result<Lease, LeaseError> {
        self.count();
        self.client
            .create(&self.leases(None), body)
            .map(|v| lease_from(&v))
            .map_err(lease_error)
    }

    fn update_lease(&mut self, name: &str, body: &Value) -> Result<Lease, LeaseError> {
        self.count();
        self.client
            .request(
                "PUT",
                &self.leases(Some(name)),
                &[],
                Some(("application/json", body)),
            )
            .map(|v| lease_from(&v))
            .map_err(lease_error)
    }
}

impl FleetApi for ClusterApi {
    fn list_nodes(&mut self, selector: &str) -> Result<Vec<NodeInfo>, String> {
        self.count();
        let query: &[(&str, &str)] = if selector.is_empty() {
            &[]
        } else {
            &[("labelSelector", selector)]
        };
        let items = self
            .client
            .list(&path("v1", None, "nodes", None), query)
            .map_err(|e| e.to_string())?;
        Ok(items
            .iter()
            .map(|n| NodeInfo {
                name: n["metadata"]["name"].as_str().unwrap_or("").to_string(),
                annotations: serde_json::from_value(n["metadata"]["annotations"].clone())
                    .unwrap_or_default(),
            })
            .collect())
    }

    fn get_config_map(&mut self, name: &str) -> Result<Option<BTreeMap<String, String>>, String> {
        self.count();
        match self
            .client
            .get(&path("v1", Some(&self.namespace), "configmaps", Some(name)))
        {
            Ok(v) => Ok(Some(
                serde_json::from_value(v["data"].clone()).unwrap_or_default(),
            )),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }
}
