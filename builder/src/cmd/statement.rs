//! `kubeslot-builder statement issue|verify`: release statements that
//! expire ([`crate::statement`]).
//!
//! Given the image (a registry tag or `oci:DIR:TAG`) and the key (issue) or
//! the public key (verify); prints what was stored or read. It does not
//! sign or push the image itself.

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use kubeslot_image::layout::Layout;
use kubeslot_image::reference::Identity;
use kubeslot_image::signature::TrustedKeys;
use kubeslot_image::ImageSource;

use super::Global;
use crate::registry::{RegistryOptions, Remote};
use crate::statement::{self, Issue, Issued};

/// Release statements: a signed {repository, tag, digest, issued, expires,
/// schedule} stored beside the image under `sha256-<hex>.release`. A
/// following host takes an update only under an unexpired one.
#[derive(Clone, Debug, clap::Args)]
pub struct StatementArgs {
    #[command(subcommand)]
    pub command: StatementCommand,
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum StatementCommand {
    Issue(IssueArgs),
    Verify(VerifyArgs),
}

/// Issue (or renew) the release statement of the image a tag names, signed
/// with the image's key, replacing the one stored; read back and verified
/// before success. A renewal keeps the schedule of the statement it
/// replaces.
#[derive(Clone, Debug, clap::Args)]
pub struct IssueArgs {
    /// The private key (PKCS#8 PEM, from `keygen`): the image's.
    #[arg(long, value_name = "KEY")]
    pub key: PathBuf,
    /// The image by its tag: `registry/repo:tag` or `oci:DIR:TAG`.
    #[arg(value_name = "IMAGE")]
    pub image: ImageSource,
    /// How long the statement is valid, in hours.
    #[arg(long, value_name = "HOURS", default_value_t = 168)]
    pub valid_hours: u64,
    /// The rollout schedule, `HOURS:PERCENT,…` after now. Default:
    /// 1:1,4:5,24:15,48:40,72:60,96:90,120:100 (a renewal keeps the
    /// previous statement's).
    #[arg(long, value_name = "WAVES")]
    pub schedule: Option<String>,
    /// Start a new schedule from now even when a statement exists.
    #[arg(long)]
    pub new_schedule: bool,
    /// The repository the statement names (default: the image's
    /// registry/repository, or the layout's tag).
    #[arg(long, value_name = "NAME")]
    pub identity: Option<String>,
    #[command(flatten)]
    pub registry: RegistryOptions,
}

/// Read and verify the release statement of the image a tag names; fails
/// when it is missing, not signed by the key, or expired.
#[derive(Clone, Debug, clap::Args)]
pub struct VerifyArgs {
    /// The public key hosts trust (PEM).
    #[arg(long, value_name = "PUB")]
    pub public_key: PathBuf,
    /// The image by its tag: `registry/repo:tag` or `oci:DIR:TAG`.
    #[arg(value_name = "IMAGE")]
    pub image: ImageSource,
    /// The repository the statement must name.
    #[arg(long, value_name = "NAME")]
    pub identity: Option<String>,
    #[command(flatten)]
    pub registry: RegistryOptions,
}

pub async fn run(args: StatementArgs, global: &Global) -> anyhow::Result<()> {
    let shown = match args.command {
        StatementCommand::Issue(a) => issue(a).await?,
        StatementCommand::Verify(a) => verify(a).await?,
    };
    super::print(global, &shown);
    Ok(())
}

async fn issue(args: IssueArgs) -> anyhow::Result<Issued> {
    let key = crate::sign::load_key(&args.key)?;
    let issue = Issue {
        valid_secs: args.valid_hours.saturating_mul(3600),
        new_schedule: args.new_schedule,
        schedule: args
            .schedule
            .as_deref()
            .map(statement::parse_schedule)
            .transpose()
            .map_err(anyhow::Error::msg)?,
    };
    match &args.image {
        ImageSource::Registry(image) => {
            statement::issue_registry(&key, image, args.identity.as_deref(), &issue, &args.registry)
                .await
        }
        ImageSource::Layout { dir, tag: Some(tag) } => {
            let identity = args.identity.clone().unwrap_or_else(|| tag.clone());
            statement::issue_layout(&key, &Layout::open(dir)?, tag, &identity, &issue)
        }
        _ => bail!("{}: name a registry tag or oci:DIR:TAG (issue before archiving: the archive carries the statement)", args.image),
    }
    .with_context(|| format!("statement issue {}", args.image))
}

async fn verify(args: VerifyArgs) -> anyhow::Result<Issued> {
    let keys = TrustedKeys::from_pem_files(&[&args.public_key])?;
    let identity = args
        .identity
        .as_deref()
        .map(Identity::repository)
        .transpose()?;
    let (image, digest, statement) = match &args.image {
        ImageSource::Registry(image) => {
            let Some(tag) = image.tag.clone() else {
                bail!("{image}: name the image by its tag");
            };
            let remote = Remote::connect(image, &args.registry, false).await?;
            let top = remote
                .pull_manifest(&tag)
                .await?
                .with_context(|| format!("{image}: the registry has no tag {tag:?}"))?;
            let s = statement::read_registry(&remote, &keys, identity.as_ref(), top.digest).await?;
            (image.with_digest(top.digest).to_string(), top.digest, s)
        }
        ImageSource::Layout {
            dir,
            tag: Some(tag),
        } => {
            let layout = Layout::open(dir)?;
            let root = crate::transfer::select_root(&layout.index()?, Some(tag))
                .map_err(anyhow::Error::msg)?;
            let s = statement::read_layout(&layout, &keys, identity.as_ref(), root.digest)?;
            (format!("{}@{}", args.image, root.digest), root.digest, s)
        }
        _ => bail!("{}: name a registry tag or oci:DIR:TAG", args.image),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    statement.check_current(now)?;
    Ok(Issued {
        image,
        tag: digest.attachment_tag(kubeslot_image::statement::ATTACHMENT_KIND),
        statement,
        renewed: false,
    })
}
