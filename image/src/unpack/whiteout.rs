//! OCI whiteout names: tells a plain entry from a whiteout (`.wh.NAME`), an
//! opaque-directory marker (`.wh..wh..opq`) and a malformed whiteout.
//!
//! It is given a parsed [`ImagePath`] and only classifies it; removing what a
//! whiteout hides is `apply`'s job (through directory handles, never
//! following a symlink). aufs metadata other than the opaque marker
//! (`.wh..wh.plnk`, `.wh..wh.aufs`) is refused, not interpreted.

use super::path::ImagePath;
use super::rules::Rule;

const PREFIX: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";
const META: &[u8] = b".wh..wh.";

/// What an entry name means in the layer.
#[derive(Debug, PartialEq, Eq)]
pub enum Kind<'a> {
    /// An ordinary entry to create.
    Plain,
    /// Removes `dir/name` of lower layers: (dir, name).
    Whiteout(&'a [u8], &'a [u8]),
    /// Empties `dir` of lower layers' entries.
    Opaque(&'a [u8]),
}

/// Classifies `path`; `Err` names the malformed part.
pub fn classify(path: &ImagePath) -> Result<Kind<'_>, (Rule, String)> {
    let Some((dir, last)) = path.split_last() else {
        return Ok(Kind::Plain);
    };
    if dir.split(|&b| b == b'/').any(|c| c.starts_with(PREFIX)) {
        return Err((
            Rule::MalformedWhiteout,
            "a directory component is whiteout-named (`.wh.` prefix)".into(),
        ));
    }
    if !last.starts_with(PREFIX) {
        return Ok(Kind::Plain);
    }
    if last == OPAQUE {
        return Ok(Kind::Opaque(dir));
    }
    if last.starts_with(META) {
        return Err((
            Rule::MalformedWhiteout,
            "an aufs metadata name other than the opaque marker `.wh..wh..opq`".into(),
        ));
    }
    let name = &last[PREFIX.len()..];
    match name {
        b"" => Err((
            Rule::MalformedWhiteout,
            "`.wh.` names no file to remove".into(),
        )),
        b"." | b".." => Err((
            Rule::MalformedWhiteout,
            "a whiteout of `.` or `..` would remove the directory or its parent".into(),
        )),
        _ => Ok(Kind::Whiteout(dir, name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unpack::rules::Limits;

    fn c(s: &[u8]) -> Result<String, Rule> {
        let p = ImagePath::parse(s, &Limits::default()).unwrap();
        let k = classify(&p).map_err(|e| e.0)?;
        Ok(match k {
            Kind::Plain => "plain".into(),
            Kind::Whiteout(d, n) => format!(
                "wh {}|{}",
                String::from_utf8_lossy(d),
                String::from_utf8_lossy(n)
            ),
            Kind::Opaque(d) => format!("opq {}", String::from_utf8_lossy(d)),
        })
    }

    #[test]
    fn classifies() {
        assert_eq!(c(b"a/b").unwrap(), "plain");
        assert_eq!(c(b"./").unwrap(), "plain");
        assert_eq!(c(b"a/.wh.b").unwrap(), "wh a|b");
        assert_eq!(c(b".wh.b").unwrap(), "wh |b");
        assert_eq!(c(b"a/.wh..wh..opq").unwrap(), "opq a");
        assert_eq!(c(b".wh..wh..opq").unwrap(), "opq ");
        assert_eq!(c(b"a/.wh..b").unwrap(), "wh a|.b");
        assert_eq!(c(b"a/.whx").unwrap(), "plain");
    }

    #[test]
    fn refuses_malformed() {
        for bad in [
            &b"a/.wh."[..],
            b"a/.wh..",
            b"a/.wh...",
            b".wh..wh.plnk",
            b".wh.a/b",
        ] {
            assert_eq!(
                c(bad),
                Err(Rule::MalformedWhiteout),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
