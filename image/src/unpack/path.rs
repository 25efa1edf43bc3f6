//! In-image paths: [`ImagePath`], a tar entry name (or hardlink target)
//! parsed into plain components that can only ever name something beneath
//! the unpack target.
//!
//! It is given raw name bytes and the limits. It owns the name rules
//! (`..`, absolute, empty, NUL, length, depth) and nothing else: it does not
//! know about whiteouts, the filesystem or symlinks (a component is a name,
//! never resolved here).

use super::rules::{Limits, Rule};

/// A normalised relative path: components joined by `/`, without `.`,
/// empty or `..` components. The empty path is the root of the tree.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImagePath {
    bytes: Vec<u8>,
}

impl ImagePath {
    /// Parses an entry name. `./a//b/` becomes `a/b`; `./` is the root.
    /// Returns the rule broken and a reason.
    pub fn parse(raw: &[u8], limits: &Limits) -> Result<ImagePath, (Rule, String)> {
        if raw.is_empty() {
            return Err((Rule::EmptyName, "the name is empty".into()));
        }
        if raw.contains(&0) {
            return Err((Rule::NulByte, "the name contains a NUL byte".into()));
        }
        if raw.len() > limits.max_path_bytes {
            return Err((
                Rule::PathTooLong,
                format!(
                    "the name is {} bytes, more than the limit of {}",
                    raw.len(),
                    limits.max_path_bytes
                ),
            ));
        }
        if raw[0] == b'/' {
            return Err((
                Rule::Absolute,
                "an absolute name would be resolved against the host".into(),
            ));
        }
        let mut bytes = Vec::with_capacity(raw.len());
        let mut depth = 0usize;
        for comp in raw.split(|&b| b == b'/') {
            match comp {
                b"" | b"." => continue,
                b".." => {
                    return Err((
                        Rule::Dotdot,
                        "a `..` component would climb out of the tree".into(),
                    ))
                }
                _ => {}
            }
            depth += 1;
            if depth > limits.max_depth {
                return Err((
                    Rule::TooDeep,
                    format!("more than {} components", limits.max_depth),
                ));
            }
            if !bytes.is_empty() {
                bytes.push(b'/');
            }
            bytes.extend_from_slice(comp);
        }
        Ok(ImagePath { bytes })
    }

    /// A path from bytes that are already normalised (a parent part of an
    /// [`ImagePath`]).
    pub(crate) fn from_normalised(bytes: &[u8]) -> ImagePath {
        ImagePath {
            bytes: bytes.to_vec(),
        }
    }

    /// The root of the tree (`./`).
    pub fn root() -> ImagePath {
        ImagePath { bytes: Vec::new() }
    }

    pub fn is_root(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The normalised bytes (`a/b`, empty for the root).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The path as an absolute in-image path (`/a/b`), for the allowlist.
    pub fn to_absolute(&self) -> String {
        format!("/{}", String::from_utf8_lossy(&self.bytes))
    }

    /// The parent path and the last component; `None` for the root.
    pub fn split_last(&self) -> Option<(&[u8], &[u8])> {
        if self.bytes.is_empty() {
            return None;
        }
        Some(match self.bytes.iter().rposition(|&b| b == b'/') {
            Some(i) => (&self.bytes[..i], &self.bytes[i + 1..]),
            None => (&[][..], &self.bytes[..]),
        })
    }

    /// The components, outermost first.
    pub fn components(&self) -> impl Iterator<Item = &[u8]> {
        self.bytes.split(|&b| b == b'/').filter(|c| !c.is_empty())
    }

    /// `self/name` (name is one component).
    pub fn join(&self, name: &[u8]) -> ImagePath {
        let mut bytes = Vec::with_capacity(self.bytes.len() + 1 + name.len());
        bytes.extend_from_slice(&self.bytes);
        if !bytes.is_empty() {
            bytes.push(b'/');
        }
        bytes.extend_from_slice(name);
        ImagePath { bytes }
    }

    /// The proper ancestors, innermost first (`a/b/c` → `a/b`, `a`); the
    /// root is not included.
    pub fn ancestors(&self) -> impl Iterator<Item = &[u8]> {
        let b = &self.bytes;
        b.iter()
            .enumerate()
            .rev()
            .filter(|(_, &c)| c == b'/')
            .map(move |(i, _)| &b[..i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &[u8]) -> Result<Vec<u8>, Rule> {
        ImagePath::parse(s, &Limits::default())
            .map(|p| p.as_bytes().to_vec())
            .map_err(|e| e.0)
    }

    #[test]
    fn normalises() {
        assert_eq!(p(b"./a//b/").unwrap(), b"a/b");
        assert_eq!(p(b"a/./b").unwrap(), b"a/b");
        assert_eq!(p(b"./").unwrap(), b"");
        assert_eq!(p(b".").unwrap(), b"");
        assert_eq!(p(b"..a/b..").unwrap(), b"..a/b..");
    }

    #[test]
    fn refuses() {
        assert_eq!(p(b""), Err(Rule::EmptyName));
        assert_eq!(p(b"/etc/passwd"), Err(Rule::Absolute));
        assert_eq!(p(b"a/../b"), Err(Rule::Dotdot));
        assert_eq!(p(b".."), Err(Rule::Dotdot));
        assert_eq!(p(b"a/.."), Err(Rule::Dotdot));
        assert_eq!(p(b"a\0b"), Err(Rule::NulByte));
        assert_eq!(p(&[b'a'; 5000]), Err(Rule::PathTooLong));
        assert_eq!(p(&b"a/".repeat(200)), Err(Rule::TooDeep));
    }

    #[test]
    fn splits_and_walks() {
        let x = ImagePath::parse(b"a/b/c", &Limits::default()).unwrap();
        assert_eq!(x.split_last(), Some((&b"a/b"[..], &b"c"[..])));
        assert_eq!(x.ancestors().collect::<Vec<_>>(), vec![&b"a/b"[..], b"a"]);
        assert_eq!(x.components().count(), 3);
        assert_eq!(x.to_absolute(), "/a/b/c");
        let top = ImagePath::parse(b"a", &Limits::default()).unwrap();
        assert_eq!(top.split_last(), Some((&b""[..], &b"a"[..])));
        assert_eq!(top.ancestors().count(), 0);
        assert_eq!(ImagePath::root().join(b"x").as_bytes(), b"x");
    }
}
