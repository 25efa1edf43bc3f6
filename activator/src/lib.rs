//! The trusted core of kubeslot: everything a host relies on to turn an image
//! reference into a verified tree in a `systemd-nspawn` slot.
//!
//! The builder links this library for the formats and runs its verification
//! over its own output; nothing here knows about recipes, signing keys or the
//! builder (see ARCHITECTURE.md, "Invariants").

pub mod activate;
pub mod archive;
pub mod config;
pub mod digest;
pub mod failpoint;
pub mod fingerprint;
pub mod gpu;
pub mod health;
pub mod layout;
pub mod lock;
pub mod oci;
pub mod paths;
pub mod plan;
pub mod progress;
pub mod reference;
pub mod registry;
pub mod render;
pub mod report;
pub mod signature;
pub mod source;
pub mod stage;
pub mod state;
pub mod store;
pub mod systemd;
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
