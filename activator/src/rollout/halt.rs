//! The halt: a node starts no new update while the operator's pause switch
//! is set, or once `halt_after` nodes of the fleet report a rollback of the
//! digest it would move to (the Node annotations every node writes after a
//! run, issue 38).

use std::collections::BTreeMap;
use std::fmt;

/// The annotation each node writes with its last run's result
/// (`committed`, `rolled-back: <reason>`, ...).
pub const LAST_RESULT: &str = "kubeslot.io/last-result";
/// The annotation naming the digest the last run moved to (or tried to).
pub const LAST_DIGEST: &str = "kubeslot.io/last-digest";
/// The pause switch's key in its ConfigMap: `"true"` pauses.
pub const PAUSED_KEY: &str = "paused";

/// A Node as the halt sees it.
#[derive(Clone, Debug, Default)]
pub struct NodeInfo {
    pub name: String,
    pub annotations: BTreeMap<String, String>,
}

/// What the halt reads, in the rollout's namespace.
pub trait FleetApi {
    /// The Nodes matching `selector` (a label selector, empty for all).
    fn list_nodes(&mut self, selector: &str) -> Result<Vec<NodeInfo>, String>;
    /// A ConfigMap's `data`, `None` for a 404.
    fn get_config_map(&mut self, name: &str) -> Result<Option<BTreeMap<String, String>>, String>;
}

/// Why new starts stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Halted {
    /// The pause switch is set (its `reason`, when the operator wrote one).
    Paused { switch: String, reason: String },
    /// Enough nodes rolled the digest back.
    RolledBack {
        digest: String,
        nodes: Vec<String>,
        halt_after: usize,
    },
}

impl fmt::Display for Halted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Halted::Paused { switch, reason } => {
                write!(f, "the rollout is paused (ConfigMap {switch} has {PAUSED_KEY}: \"true\")")?;
                if !reason.is_empty() {
                    write!(f, ": {reason}")?;
                }
                Ok(())
            }
            Halted::RolledBack {
                digest,
                nodes,
                halt_after,
            } => write!(
                f,
                "the rollout of {digest} is halted: {} node(s) rolled it back ({}), halt_after is {halt_after}",
                nodes.len(),
                nodes.join(", ")
            ),
        }
    }
}

/// Whether the switch named `switch` pauses the rollout.
pub fn paused(api: &mut dyn FleetApi, switch: &str) -> Result<Option<Halted>, String> {
    let Some(data) = api.get_config_map(switch)? else {
        return Ok(None);
    };
    if data.get(PAUSED_KEY).map(|v| v.trim()) != Some("true") {
        return Ok(None);
    }
    Ok(Some(Halted::Paused {
        switch: switch.to_string(),
        reason: data.get("reason").cloned().unwrap_or_default(),
    }))
}

/// The nodes (of `nodes`) whose last run rolled `digest` back.
pub fn rolled_back(nodes: &[NodeInfo], digest: &str) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| {
            n.annotations.get(LAST_DIGEST).map(String::as_str) == Some(digest)
                && n.annotations
                    .get(LAST_RESULT)
                    .is_some_and(|r| r.starts_with("rolled-back"))
        })
        .map(|n| n.name.clone())
        .collect()
}

/// The halt by rollbacks: `Some` once `halt_after` (> 0) nodes rolled
/// `digest` back.
pub fn by_rollbacks(nodes: &[NodeInfo], digest: &str, halt_after: usize) -> Option<Halted> {
    let bad = rolled_back(nodes, digest);
    (halt_after > 0 && bad.len() >= halt_after).then(|| Halted::RolledBack {
        digest: digest.to_string(),
        nodes: bad,
        halt_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, digest: &str, result: &str) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            annotations: [
                (LAST_DIGEST.to_string(), digest.to_string()),
                (LAST_RESULT.to_string(), result.to_string()),
            ]
            .into(),
        }
    }

    #[test]
    fn rollbacks_of_the_same_digest_halt_at_the_threshold() {
        let nodes = [
            node("a", "sha256:1", "rolled-back: gate failed"),
            node("b", "sha256:2", "rolled-back: gate failed"),
            node("c", "sha256:1", "committed"),
            node("d", "sha256:1", "rolled-back: node not Ready"),
        ];
        assert_eq!(rolled_back(&nodes, "sha256:1"), ["a", "d"]);
        assert_eq!(by_rollbacks(&nodes, "sha256:1", 3), None);
        let h = by_rollbacks(&nodes, "sha256:1", 2).expect("halted");
        assert_eq!(
            h.to_string(),
            "the rollout of sha256:1 is halted: 2 node(s) rolled it back (a, d), halt_after is 2"
        );
        assert_eq!(
            by_rollbacks(&nodes, "sha256:1", 0),
            None,
            "0 turns the halt off"
        );
    }
}
