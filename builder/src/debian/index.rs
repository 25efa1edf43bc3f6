//! Reading apt's `Packages` indexes (deb822 stanzas): the fields the lock
//! needs (name, version, architecture, pool path, size, sha256) and the
//! Essential/Priority flags that define a minbase. It is given files apt
//! already verified against a signed InRelease; it does not check
//! signatures or fetch anything.

use std::collections::BTreeMap;
use std::path::Path;

use super::error::{io_err, DebianError};

/// One binary package stanza of a `Packages` index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub package: String,
    pub version: String,
    pub architecture: String,
    /// `Filename:`, the pool path relative to the repository root.
    pub filename: String,
    pub size: u64,
    pub sha256: String,
    pub essential: bool,
    pub priority: String,
}

/// Splits deb822 text into stanzas of (field, value); continuation lines
/// are joined with newlines.
pub fn stanzas(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut out = Vec::new();
    let mut cur: BTreeMap<String, String> = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in text.lines() {
        if line.trim().is_empty() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            last = None;
        } else if line.starts_with(' ') || line.starts_with('\t') {
            if let Some(v) = last.as_ref().and_then(|k| cur.get_mut(k)) {
                v.push('\n');
                v.push_str(line.trim());
            }
        } else if let Some((k, v)) = line.split_once(':') {
            cur.insert(k.trim().to_string(), v.trim().to_string());
            last = Some(k.trim().to_string());
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Parses a `Packages` file; every stanza must carry the fields the lock pins.
pub fn read_packages(path: &Path) -> Result<Vec<IndexEntry>, DebianError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    parse_packages(&text).map_err(|reason| DebianError::Index {
        path: path.to_path_buf(),
        reason,
    })
}

pub fn parse_packages(text: &str) -> Result<Vec<IndexEntry>, String> {
    let mut out = Vec::new();
    for st in stanzas(text) {
        let field = |k: &str| {
            st.get(k).cloned().ok_or_else(|| {
                format!(
                    "stanza of package {} has no {k} field",
                    st.get("Package").map(String::as_str).unwrap_or("?")
                )
            })
        };
        let sha256 = field("SHA256")?;
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "package {}: SHA256 {sha256} is not 64 hex digits",
                field("Package")?
            ));
        }
        out.push(IndexEntry {
            package: field("Package")?,
            version: field("Version")?,
            architecture: field("Architecture")?,
            filename: field("Filename")?,
            size: field("Size")?
                .parse()
                .map_err(|e| format!("package {}: Size: {e}", st["Package"]))?,
            sha256: sha256.to_ascii_lowercase(),
            essential: st.get("Essential").is_some_and(|v| v == "yes"),
            priority: st.get("Priority").cloned().unwrap_or_default(),
        });
    }
    Ok(out)
}

/// The names a minbase installs besides the recipe's packages (as
/// mmdebstrap's `minbase` variant): every `Essential: yes` and every
/// `Priority: required` package, sorted and unique.
pub fn minbase_names(entries: &[IndexEntry]) -> Vec<String> {
    let mut names: Vec<String> = entries
        .iter()
        .filter(|e| e.essential || e.priority == "required")
        .map(|e| e.package.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Package: dash\nVersion: 0.5.12-2\nArchitecture: amd64\nEssential: yes\nPriority: required\nDescription: shell\n more text\nFilename: pool/main/d/dash/dash_0.5.12-2_amd64.deb\nSize: 100\nSHA256: AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n\nPackage: apt\nVersion: 2.6.1\nArchitecture: amd64\nPriority: required\nFilename: pool/main/a/apt/apt_2.6.1_amd64.deb\nSize: 7\nSHA256: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\n\nPackage: vim\nVersion: 9\nArchitecture: amd64\nPriority: optional\nFilename: pool/main/v/vim/vim_9_amd64.deb\nSize: 7\nSHA256: cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc\n";

    #[test]
    fn parses_stanzas_and_minbase() {
        let e = parse_packages(SAMPLE).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].sha256, "a".repeat(64));
        assert!(e[0].essential);
        assert_eq!(e[1].size, 7);
        assert_eq!(minbase_names(&e), vec!["apt", "dash"]);
    }

    #[test]
    fn a_stanza_without_sha256_is_an_error() {
        let err =
            parse_packages("Package: x\nVersion: 1\nArchitecture: all\nFilename: p\nSize: 1\n")
                .unwrap_err();
        assert!(err.contains("package x has no SHA256"), "{err}");
    }
}
