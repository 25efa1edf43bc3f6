//! `kubeslot-activator unpack [--config FILE] [--root DIR] IMAGE TARGET`:
//! verify an image and unpack it into an empty directory, for operators and
//! tests. Given the arguments, it reads the `registries` and `trust`
//! sections of the config (the rest of an activator config is ignored here),
//! and calls [`kubeslot_activator::slots::stage::unpack_to`]. It never touches
//! slots, state or host files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use kubeslot_activator::config::{
    ProxyConfig, RegistryConfig, Trust, UnpackSettings, MAX_CONFIG_BYTES,
};
use kubeslot_activator::paths::Root;
use kubeslot_activator::slots::stage::{self, Staged};
use kubeslot_image::verify::Verdict;
use kubeslot_image::ImageSource;
use serde::Deserialize;

/// Verify a signed image and unpack it into an empty directory.
///
/// The trust policy comes from the config's "trust" section. Without
/// --config the policy is the default one: unsigned images are refused and no
/// key is trusted, so every image is refused; pass a config with
/// "trust.public_keys" or "trust.keyless" (or "trust.allow_unsigned": true).
/// There is no flag that bypasses the policy.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Activator config (JSON); its "registries" (mirrors, credentials,
    /// insecure), "trust" and "unpack" sections apply, other fields are
    /// ignored.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Make host paths (public keys, password files, the content store)
    /// relative to DIR, and use DIR's content store
    /// (DIR/var/lib/kubeslot/blobs). Without it, blobs go to a temporary
    /// store beside TARGET that is removed afterwards.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// The image: REGISTRY/REPO[:TAG][@DIGEST], oci:DIR[:TAG] or
    /// oci-archive:FILE[:TAG].
    pub image: ImageSource,
    /// Where to unpack: a missing or empty directory. The tree appears there
    /// only when every layer was verified and applied.
    pub target: PathBuf,
    /// Print the result as one JSON object (digests, signature verdict,
    /// download report, unpack totals) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The parts of an activator config that `unpack` uses.
#[derive(Deserialize)]
struct FetchSettings {
    #[serde(default)]
    registries: BTreeMap<String, RegistryConfig>,
    #[serde(default)]
    trust: Trust,
    #[serde(default)]
    unpack: UnpackSettings,
    #[serde(default)]
    proxy: Option<ProxyConfig>,
}

fn load_settings(path: &Path) -> anyhow::Result<FetchSettings> {
    let meta = std::fs::metadata(path).with_context(|| format!("config {}", path.display()))?;
    if meta.len() > MAX_CONFIG_BYTES {
        anyhow::bail!(
            "config {}: larger than {MAX_CONFIG_BYTES} bytes",
            path.display()
        );
    }
    let bytes = std::fs::read(path).with_context(|| format!("config {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("config {}", path.display()))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let settings = match &args.config {
        Some(p) => load_settings(p)?,
        None => FetchSettings {
            registries: BTreeMap::new(),
            trust: Trust::default(),
            unpack: UnpackSettings::default(),
            proxy: None,
        },
    };
    // The library refuses this too, but only the command line knows where
    // the policy came from: name it, so the operator knows what to edit.
    if settings.trust.public_keys.is_empty()
        && settings.trust.keyless.is_none()
        && !settings.trust.allow_unsigned
    {
        match &args.config {
            Some(p) => anyhow::bail!(
                "config {}: trust.public_keys is empty, there is no trust.keyless and \
                 trust.allow_unsigned is false: every image would be refused; list a public key",
                p.display()
            ),
            None => anyhow::bail!(
                "no --config: the default trust policy has no keys and trust.allow_unsigned \
                 is false, so it refuses every image; pass --config with trust.public_keys or trust.keyless"
            ),
        }
    }
    let staged = match &args.root {
        Some(dir) => {
            let root = Root::new(dir);
            stage::unpack_to(
                &root,
                &args.image,
                stage::Reach {
                    registries: &settings.registries,
                    proxy: settings.proxy.as_ref(),
                },
                &settings.trust,
                &settings.unpack,
                &root.store(),
                &args.target,
            )?
        }
        None => {
            let parent = match args.target.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            std::fs::create_dir_all(&parent)
                .with_context(|| format!("creating {}", parent.display()))?;
            let store = tempfile::Builder::new()
                .prefix(".kubeslot-store-")
                .tempdir_in(&parent)
                .with_context(|| format!("temporary content store in {}", parent.display()))?;
            stage::unpack_to(
                &Root::host(),
                &args.image,
                stage::Reach {
                    registries: &settings.registries,
                    proxy: settings.proxy.as_ref(),
                },
                &settings.trust,
                &settings.unpack,
                store.path(),
                &args.target,
            )?
        }
    };
    if args.json {
        println!("{}", summary_json(&args.image, &staged));
    } else {
        print_summary(&args.image, &staged);
    }
    Ok(())
}

fn summary_json(image: &ImageSource, s: &Staged) -> serde_json::Value {
    serde_json::json!({
        "image": image.to_string(),
        "image_digest": s.image_digest,
        "manifest_digest": s.manifest_digest,
        "verdict": s.verdict,
        "fetch": s.report,
        "unpack": {
            "layers": s.unpack.layers,
            "entries": s.unpack.entries,
            "bytes": s.unpack.bytes,
            "files": s.unpack.files,
        },
        "tree": s.tree,
    })
}

fn print_summary(image: &ImageSource, s: &Staged) {
    println!("image {image}");
    println!("  digest {}", s.image_digest);
    println!("  manifest {}", s.manifest_digest);
    match &s.verdict {
        Verdict::Signed { digest } => println!("  signature valid (signed digest {digest})"),
        Verdict::Keyless {
            digest,
            san,
            issuer,
            integrated_time,
        } => println!(
            "  keyless signature valid (signed digest {digest}, identity {san}, issuer {issuer}, logged {})",
            kubeslot_image::time::rfc3339_seconds((*integrated_time).max(0) as u64)
        ),
        Verdict::AllowedUnsigned { reasons } => println!(
            "  signature NOT verified, accepted by trust.allow_unsigned: {}",
            reasons.join("; ")
        ),
    }
    let r = &s.report;
    println!(
        "  blobs downloaded {} ({} bytes, {} layers), reused {} ({} bytes, {} layers), resumed {} bytes",
        r.downloaded_blobs,
        r.downloaded_bytes,
        r.downloaded_layers,
        r.reused_blobs,
        r.reused_bytes,
        r.reused_layers,
        r.resumed_bytes
    );
    println!(
        "  unpacked {} layers, {} entries, {} bytes into {}",
        s.unpack.layers,
        s.unpack.entries,
        s.unpack.bytes,
        s.tree.display()
    );
}
