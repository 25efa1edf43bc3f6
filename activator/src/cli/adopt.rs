//! `kubeslot-activator adopt`: take over a node another tool set up (see
//! [`kubeslot_activator::host::adopt`]). Given the arguments; asks the real
//! systemd tools only whether machines run.

use std::path::PathBuf;

use kubeslot_activator::activate::report::exit;
use kubeslot_activator::host::adopt::{self, Identity, Options, WriteConfig};
use kubeslot_activator::paths::host::NODE_KUBELET;
use kubeslot_activator::slot::Slot;
use kubeslot_activator::systemd::SystemCtl;
use kubeslot_image::error_chain;

use super::{Failed, HostArgs};

/// Take over a node machine that unbounded-agent set up, so kubeslot can
/// flip away from it and roll back to it.
///
/// For a host with no kubeslot state whose node runs in kube1 (or kube2),
/// provisioned by unbounded-agent (/etc/unbounded/agent/<machine>-applied-config.json).
/// Records that machine as the active slot, marked adopted and unverified
/// (it came from no kubeslot image): its tree, .nspawn file and drop-in are
/// kept as they are, nothing is stopped, started or rendered. The next
/// `activate` stages the configured image into the other slot and flips to
/// it; `rollback` then returns to the adopted machine, which stays the
/// rollback target until an image is staged over it. Without `adopt`,
/// `activate` refuses such a host (exit 3).
///
/// The node keeps its identity: the kubelet's client certificate
/// (/var/lib/kubelet/pki in the adopted tree, and the kubeconfig the
/// kubelet wrote after bootstrapping) is copied into
/// /var/lib/kubeslot/node/kubelet, which the next slot uses. unbounded-
/// agent's host units that act after the adoption are reported:
/// unbounded-agent-daemon.service (later versions re-provision the node
/// into kube2) and nftables-flush.service (flushes the host's nftables
/// ruleset before every node start); --disable-agent stops and disables
/// them first.
///
/// With --write-config it also writes the activator config (--config, mode
/// 0600; an existing one only with --force) from the applied config: API
/// server, cluster CA, bootstrap token or exec credential, cluster DNS,
/// labels, taints, node name; --image and --public-key say what to
/// activate and whom to trust. Every applied-config field not carried over
/// is listed with the reason; when one of them changes how the node behaves
/// (Kubelet.NodeIP, Kubelet.Configuration, an enabled LocalDNS, an unknown
/// field, ...) the config is written only with --force. The adopted
/// tree's /etc/default/kubelet KUBELET_EXTRA_ARGS (the node's file, not a
/// trusted source) is shown in full and carried over to
/// /etc/kubeslot/default-kubelet only with --force; flags that turn off
/// part of the node's security (--anonymous-auth, --authorization-mode,
/// --read-only-port, --pod-manifest-path, TLS files, ...), in either
/// spelling (`_` or `-`), are never carried over. The config is
/// written after the adoption is recorded, so an enabled
/// kubeslot-activator.path starts the flip at once. Nothing secret is
/// printed, --dry-run included.
///
/// Exit codes: 0 adopted; 1 error (nothing changed); 3 the applied config
/// cannot be used, or drops behaviour without --force (nothing changed); 5
/// another run holds the lock.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// The machine to adopt. Default: the one whose applied config exists.
    #[arg(long, value_name = "MACHINE")]
    pub machine: Option<Slot>,
    /// Write the activator config (--config) from the applied config.
    #[arg(long, requires_all = ["image", "public_key"])]
    pub write_config: bool,
    /// The kubeslot image to activate next (with --write-config):
    /// REGISTRY/REPO[:TAG][@DIGEST], oci:DIR[:TAG] or oci-archive:FILE[:TAG].
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// A trusted PEM public key for the config's trust.public_keys (with
    /// --write-config; repeatable).
    #[arg(long, value_name = "FILE")]
    pub public_key: Vec<PathBuf>,
    /// Read this applied config instead of the adopted machine's.
    #[arg(long, value_name = "FILE")]
    pub applied_config: Option<PathBuf>,
    /// Replace an existing activator config, write one although
    /// applied-config fields that change the node's behaviour are not
    /// carried over, and carry over the adopted tree's kubelet flags.
    #[arg(long)]
    pub force: bool,
    /// Stop and disable unbounded-agent's host units
    /// (unbounded-agent-daemon.service, nftables-flush.service) first.
    #[arg(long)]
    pub disable_agent: bool,
    /// Change nothing: print what would be recorded, and the config with
    /// its secrets replaced.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let root = args.host.root();
    let config_path = args.host.config_path();
    let opts = Options {
        machine: args.machine,
        write_config: args.write_config.then(|| WriteConfig {
            path: config_path.clone(),
            image: args.image.clone().unwrap_or_default(),
            public_keys: args.public_key.clone(),
            force: args.force,
            applied: args.applied_config.clone(),
        }),
        dry_run: args.dry_run,
        disable_agent: args.disable_agent,
        config: Some(config_path.clone()),
    };
    let done = adopt::adopt(&root, &SystemCtl, &opts).map_err(|e| {
        let code = match e {
            adopt::AdoptError::Lock(kubeslot_activator::lock::LockError::Busy { .. }) => exit::BUSY,
            adopt::AdoptError::Applied { .. }
            | adopt::AdoptError::Field { .. }
            | adopt::AdoptError::Sidecar { .. }
            | adopt::AdoptError::Invalid(_)
            | adopt::AdoptError::BehaviourDropped { .. }
            | adopt::AdoptError::KubeletFlags { .. } => exit::CONFIG,
            _ => exit::FAILED,
        };
        Failed {
            code,
            message: error_chain(&e),
        }
    })?;
    let m = done.machine;
    let would = if args.dry_run {
        "would adopt"
    } else {
        "adopted"
    };
    println!(
        "{would} {m} ({}): the active slot, unverified; its tree and host files stay as they are and remain the rollback target until an image is staged over them",
        if done.running { "running" } else { "not running: the next activate starts it" }
    );
    println!(
        "the next `kubeslot-activator activate` stages the configured image into {} and flips to it",
        m.other()
    );
    match &done.identity {
        Identity::Carried { pki, kubeconfig } => println!(
            "{} the kubelet's identity into {}: pki/ ({}){}; the new slot keeps the node's client certificate",
            if args.dry_run { "would copy" } else { "copied" },
            NODE_KUBELET,
            pki.join(", "),
            if *kubeconfig { " and kubeconfig" } else { "" }
        ),
        Identity::Kept(p) => println!("kept {} as it is (not replaced by the adopted tree's)", p.display()),
        Identity::Absent => println!(
            "the adopted tree has no /var/lib/kubelet/pki: the new slot bootstraps the kubelet with the configured credential"
        ),
    }
    for u in &done.agent_units {
        if u.disabled {
            println!("stopped and disabled {} ({})", u.unit, u.why);
        } else if args.dry_run && args.disable_agent {
            println!("would stop and disable {} ({})", u.unit, u.why);
        } else {
            println!(
                "warning: {} is installed: {}; `--disable-agent` stops and disables it",
                u.unit, u.why
            );
        }
    }
    if let (Some(applied), Some(config)) = (&done.applied, &done.config) {
        let verb = if args.dry_run { "would write" } else { "wrote" };
        println!(
            "{verb} {} (mode 0600) from {}",
            config_path.display(),
            applied.display()
        );
        if let Some(extra) = &done.extra_args {
            println!(
                "{verb} {} from the adopted node's /etc/default/kubelet: KUBELET_EXTRA_ARGS=\"{}\"",
                kubeslot_activator::paths::Root::host()
                    .kubelet_extra_args()
                    .display(),
                extra.join(" ")
            );
        }
        print!("{}", done.notes.to_text());
        let changing = done.notes.behaviour_changing();
        if args.dry_run && !changing.is_empty() && !args.force {
            println!(
                "needs --force: the node behaves differently without {}",
                changing.join(", ")
            );
        }
        if args.dry_run && done.extra_args.is_some() && !args.force {
            println!(
                "needs --force: the kubelet flags above come from the adopted node's tree, not a trusted source"
            );
        }
        if args.dry_run {
            // the shape of the file; its secrets stay out of the output
            println!(
                "{}",
                serde_json::to_string_pretty(&adopt::redacted(config))?
            );
        }
    }
    Ok(())
}
