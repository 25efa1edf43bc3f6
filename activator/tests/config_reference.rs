//! The host config's reference: every key the activator's config accepts is
//! documented in `docs/host/config.md` ("Host config reference"), and the
//! packaged example uses only keys that exist. The keys are found by asking
//! the real parser: a probe key in an object makes serde's
//! `deny_unknown_fields` name every field of that struct, so a field added
//! to the struct and not to the reference fails here.

use kubeslot_activator::config::Config;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::path::Path;

const PROBE: &str = "__kubeslot_probe__";

/// The smallest config serde accepts, with `value` at `path` (dotted).
fn with(path: &[&str], value: Value) -> Value {
    let mut doc = json!({
        "image": "ghcr.io/example-org/kubeslot/node:1.36.4",
        "kubelet": { "api_server": "https://k8s.example.com:6443" }
    });
    let mut at = &mut doc;
    for (i, key) in path.iter().enumerate() {
        if i + 1 == path.len() {
            at[*key] = value;
            break;
        }
        if at.get(*key).is_none_or(|v| !v.is_object()) {
            at[*key] = Value::Object(Map::new());
        }
        at = at.get_mut(*key).unwrap();
    }
    doc
}

/// What serde says about `value` at `path`: `None` when it parses.
fn error_at(path: &[&str], value: Value) -> Option<String> {
    serde_json::from_value::<Config>(with(path, value))
        .err()
        .map(|e| e.to_string())
}

/// The fields serde names for an unknown key, if `err` is that error.
fn fields_named(err: &str) -> Option<Vec<String>> {
    let rest = err.strip_prefix(&format!("unknown field `{PROBE}`, "))?;
    if rest.starts_with("there are no fields") {
        return Some(Vec::new());
    }
    let list = rest
        .strip_prefix("expected one of ")
        .or_else(|| rest.strip_prefix("expected "))?;
    // serde writes "`a`", "`a` or `b`", "one of `a`, `b`, `c`".
    Some(
        list.split(", ")
            .flat_map(|f| f.split(" or "))
            .map(|f| f.trim().trim_matches('`').to_string())
            .collect(),
    )
}

/// The shapes a value at `path` can take that lead to more keys: a struct
/// (its fields), a map of structs (`<name>` then the struct), a list of
/// structs (`[]` then the struct).
fn probe(path: &mut Vec<String>, keys: &mut BTreeSet<String>) {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    let candidates = [
        json!({ PROBE: 1 }),
        json!({ "probe-entry": { PROBE: 1 } }),
        json!([{ PROBE: 1 }]),
    ];
    for (shape, value) in candidates.into_iter().enumerate() {
        let Some(err) = error_at(&p, value) else {
            continue;
        };
        let Some(fields) = fields_named(&err) else {
            continue;
        };
        let step = match shape {
            0 => None,
            1 => Some("<name>"),
            _ => Some("[]"),
        };
        if let Some(step) = step {
            path.push(step.to_string());
        }
        for f in fields {
            path.push(f);
            keys.insert(path.join("."));
            probe(path, keys);
            path.pop();
        }
        if step.is_some() {
            path.pop();
        }
        return;
    }
}

/// Every key path the config accepts, e.g. `trust.keyless.issuer`,
/// `registries.<name>.mirrors`, as the parser itself names them.
fn config_keys() -> BTreeSet<String> {
    let err = serde_json::from_value::<Config>(json!({ PROBE: 1 }))
        .unwrap_err()
        .to_string();
    let top = fields_named(&err).unwrap_or_else(|| panic!("no field list in {err:?}"));
    let mut keys = BTreeSet::new();
    for f in top {
        let mut path = vec![f.clone()];
        keys.insert(f);
        probe(&mut path, &mut keys);
    }
    keys
}

/// Where the reference lives, from the repository root.
const REFERENCE: &str = "docs/host/config.md";

/// The backticked key paths of the reference's table: the rows of the
/// section that starts at its `# Host config reference` heading and ends at
/// the next heading.
fn documented_keys() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(REFERENCE);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{REFERENCE}: the host config reference: {e}"));
    let start = text
        .find("# Host config reference\n")
        .filter(|&i| i == 0 || text[..i].ends_with('\n'))
        .unwrap_or_else(|| panic!("{REFERENCE} has no heading \"# Host config reference\""));
    let section = &text[start..];
    let end = section[1..].find("\n#").map_or(section.len(), |i| i + 1);
    let mut keys = BTreeSet::new();
    for line in section[..end].lines().filter(|l| l.starts_with("| `")) {
        let key = line[3..].split('`').next().unwrap_or_default();
        keys.insert(key.to_string());
    }
    keys
}

/// The probe finds what it should: nested structs, maps and lists of them.
#[test]
fn the_probe_finds_nested_struct_map_and_list_keys() {
    let keys = config_keys();
    for k in [
        "image",
        "kubelet.api_server",
        "kubelet.exec_credential.command",
        "registries.<name>.credentials.password_file",
        "trust.keyless.trusted_root",
        "containerd.registry_mirrors.<name>.ca_file",
        "health.timeout_secs",
    ] {
        assert!(keys.contains(k), "probe missed {k}: {keys:#?}");
    }
}

/// A key the config accepts and the reference does not explain (or a row
/// for a key that no longer exists) fails, naming it.
#[test]
fn every_config_key_is_in_the_reference() {
    let keys = config_keys();
    let documented = documented_keys();
    let missing: Vec<_> = keys.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&keys).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "{REFERENCE} \"Host config reference\": keys of the config not documented: {missing:?}; \
         rows for keys the config does not have: {stale:?}"
    );
}

/// Every key of the packaged example exists (the example loads with the
/// real loader, which refuses unknown keys) and names its image the way the
/// publishing workflow does: `ghcr.io/<owner>/<repo>/<recipe>`.
#[test]
fn the_packaged_example_uses_real_keys_and_the_workflow_naming() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/activator.example.json");
    let c = Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let raw: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let image = raw["image"].as_str().unwrap();
    let named = image.split('@').next().unwrap_or(image);
    let repo = match named.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => named,
    };
    assert_eq!(
        repo.split('/').count(),
        4,
        "{}: image {image} is not ghcr.io/<owner>/<repo>/<recipe>",
        path.display()
    );
    assert_eq!(
        c.trust.identity.as_deref(),
        Some(repo),
        "{}: trust.identity must be the image's repository",
        path.display()
    );
}
