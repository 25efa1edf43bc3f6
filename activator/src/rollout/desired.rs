//! `source.follow: {"annotation": true}`: the image an operator asks a
//! node for, in the Node's own `<prefix>desired-image` annotation (`kubectl
//! annotate nodes -l pool=gpu kubeslot.io/desired-image=REF`), read with
//! the node's own credentials (the node authorizer lets a node get its own
//! Node, no other).

use crate::cluster::{path, Client};

/// The annotation's name under `prefix` (`kubeslot.io/`).
pub fn annotation(prefix: &str) -> String {
    format!("{prefix}desired-image")
}

/// The image reference the Node `node` asks for; `None` when the
/// annotation is unset or empty.
pub fn desired_image(client: &Client, node: &str, prefix: &str) -> Result<Option<String>, String> {
    let key = annotation(prefix);
    let n = client
        .get(&path("v1", None, "nodes", Some(node)))
        .map_err(|e| format!("reading {key} of Node {node}: {e}"))?;
    Ok(n["metadata"]["annotations"][key.as_str()]
        .as_str()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_string))
}
