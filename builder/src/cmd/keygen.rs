//! `kubeslot-builder keygen`: write a new ECDSA P-256 signing key pair.
//!
//! Given a path prefix; writes `PREFIX.key` (PKCS#8 PEM, mode 0600) and
//! `PREFIX.pub` (SPKI PEM) through [`crate::sign::keygen`]. It never
//! overwrites an existing key.

use std::path::PathBuf;

use anyhow::Context as _;

use super::Global;

/// Generate an ECDSA P-256 key pair for signing images: PREFIX.key (PKCS#8
/// PEM, mode 0600, never overwritten) and PREFIX.pub (the public key hosts
/// trust, SPKI PEM).
#[derive(Clone, Debug, clap::Args)]
pub struct KeygenArgs {
    /// Path prefix of the two files, e.g. `keys/release`.
    #[arg(long, value_name = "PREFIX")]
    pub out: PathBuf,
}

struct Shown(crate::sign::KeyPair);

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "private key {}\npublic key {}",
            self.0.private_key.display(),
            self.0.public_key.display()
        )
    }
}

impl serde::Serialize for Shown {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

pub async fn run(args: KeygenArgs, global: &Global) -> anyhow::Result<()> {
    let pair = crate::sign::keygen(&args.out)
        .with_context(|| format!("keygen --out {}", args.out.display()))?;
    super::print(global, &Shown(pair));
    Ok(())
}
