//! The image format and the trust that kubeslot's two programs share: the
//! builder writes and re-reads images with it, every host verifies and
//! unpacks them with it.
//!
//! It knows OCI images and nothing about a host: digests and references,
//! the OCI types, layout directories and `oci-archive` files, the registry
//! client (given plain settings: mirrors, credentials, a CA), image sources,
//! signature verification (keys, and keyless Sigstore material checked
//! against a trusted root) and the trust check, the safe layer unpacker,
//! atomic file writes and timestamps. It has no notion of a root handle,
//! a config file, slots, state or systemd (the activator owns those), and
//! none of recipes, signing keys or publishing (the builder owns those).
//! See ARCHITECTURE.md, "Invariants".

pub mod archive;
pub mod atomic;
pub mod digest;
pub mod keyless;
pub mod layout;
pub mod oci;
pub mod reference;
pub mod registry;
pub mod retry;
pub mod signature;
pub mod source;
pub mod statement;
pub mod time;
pub mod unpack;
pub mod verify;

pub use digest::Digest;
pub use reference::{ImageRef, ImageSource};

/// One line for an error and its causes, `outer: cause: root cause`.
///
/// Some errors already print their cause in their own message (so that
/// `to_string()` alone is complete); a cause whose text the line already
/// contains is not repeated.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}
#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("outer {path}: {source}")]
    struct Repeats {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer {path}")]
    struct Defers {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    fn io() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")
    }

    #[test]
    fn a_cause_is_printed_once() {
        let e = Repeats {
            path: "/x",
            source: io(),
        };
        assert_eq!(super::error_chain(&e), "outer /x: no such file");
        let e = Defers {
            path: "/x",
            source: io(),
        };
        assert_eq!(super::error_chain(&e), "outer /x: no such file");
        let e = anyhow::Error::new(Repeats {
            path: "/x",
            source: io(),
        })
        .context("reading config");
        assert_eq!(
            super::error_chain(e.as_ref()),
            "reading config: outer /x: no such file"
        );
    }
}
