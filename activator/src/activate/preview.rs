//! `plan` and `activate --dry-run`: what a run would do, decided by the same
//! [`plan::decide`] as `activate`, on what can be known without the lock,
//! without starting anything and without writing anything.
//!
//! What it cannot know it decides both ways: a committed node that is not
//! running (or, with `--force`, one that runs) is taken as up, and
//! [`Preview::if_down`] says what `activate`, which starts and gates it
//! first, does when it does not come up. A flip a dead run was trying is
//! recovered by `activate` first (the plan notes it). The preflight runs
//! read-only: the host settings the flip writes and applies first count
//! as applied.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::activate::plan::{self, Command, Committed, Decision, Situation};
use crate::cluster::pods::{self, DrainOptions, Plan};
use crate::cluster::{Client, Kubeconfig};
use crate::config::Config;
use crate::gate::health::{Check, Failure};
use crate::gate::preflight;
use crate::paths::Root;
use crate::render;
use crate::render::host_settings;
use crate::state::State;
use crate::systemd::Systemd;

use super::begin::{flip_disk_use, gather, preflight_inputs, situation, Candidate};
use super::recover::as_recovered;
use super::{open_verified, ActivateError, Options, Rendered, Run};

/// What `plan` and `activate --dry-run` show.
pub struct Preview {
    /// The state as read (a dead run's pending flip as it was left).
    pub state: State,
    /// The configured image; `None` when `activate` refuses before it
    /// reads the config (a machine it does not account for runs).
    pub image: Option<String>,
    /// With a `gpu_image`: which variant this host runs, and why.
    pub variant: Option<super::variant::Variant>,
    /// What the decision was made on (`None` in that case too).
    pub situation: Option<Situation>,
    /// What `activate` would do, with its exit code on a refusal.
    pub decision: Decision,
    /// What it does instead when the committed node, which it starts (or,
    /// with `--force`, gates) first, does not come up: only then known.
    pub if_down: Option<Decision>,
    /// Diffs of the target slot's host files (empty unless a flip).
    pub diffs: Vec<render::FileDiff>,
    /// Diffs of the host settings (sysctl, modules-load drop-ins) the next
    /// flip writes and applies (empty when they are current).
    pub host_settings: Vec<render::FileDiff>,
    /// A following host's gates for the image found (`source.follow`, a
    /// flip to another image): the statement, the node's place and wave,
    /// the window; or why the statement stops the update.
    pub rollout: Option<Result<super::follow::Admission, String>>,
}

/// Decides what `activate` with `opts` would do (asking `systemd` which
/// machines run, starting none).
pub fn preview(
    root: &Root,
    config_path: &Path,
    systemd: &dyn Systemd,
    opts: &Options,
) -> Result<Preview, ActivateError> {
    // read-only: a save that died between its writes is taken as the
    // next locked run will repair it
    let (state, _repair) = State::load_torn(root)?;
    let run = Run::new(root, systemd);
    let recovered = as_recovered(&state);
    let machines = run.machines()?;
    let host_settings = host_settings::diff(root);
    if let Err(reason) = plan::refuse_foreign(&recovered, &machines) {
        // refused as activate refuses it: before the config is read
        return Ok(Preview {
            state,
            image: None,
            variant: None,
            situation: None,
            decision: Decision::Refused(reason),
            if_down: None,
            diffs: Vec::new(),
            host_settings,
            rollout: None,
        });
    }
    let (config, variant) = super::variant::choose(root, Config::load(config_path)?);
    let config = super::follow::desired(
        root,
        config,
        recovered.active.unwrap_or(crate::slot::Slot::Kube1),
    )?;
    let (facts, gpus) = gather(root, config_path, &config)?;
    let resolved = open_verified(root, &config)?;
    let files = Rendered::new(&config, &facts);
    let committed = match recovered.active {
        Some(a) if !machines.runs(a) || opts.force => Committed::Unchecked,
        _ => Committed::Up,
    };
    let mut situation = situation(
        root,
        Command::Activate,
        opts,
        recovered,
        machines,
        committed,
        Candidate {
            config: &config,
            resolved: &resolved,
            files: &files,
        },
    );
    let decision = plan::decide(&situation);
    // Up to date as far as plan can see: what if the node activate starts
    // (or, forced, gates) first does not come up?
    let mut down = match (&decision, situation.state.active) {
        (Decision::UpToDate { .. }, Some(active))
            if situation.committed == Committed::Unchecked =>
        {
            let mut down = situation.clone();
            down.committed = Committed::Down(Failure {
                machine: active.machine().to_string(),
                check: Check::KubeletHealthz,
                detail: "it does not come up".into(),
            });
            Some(down)
        }
        _ => None,
    };
    // The flip that may follow: its preflight (read-only: the host settings
    // it writes first count as written) and the host files it writes.
    let flip = match (&decision, &down) {
        (Decision::Flip(f), _) => Some(f.clone()),
        (_, Some(down)) => match plan::decide(down) {
            Decision::Flip(f) => Some(f),
            _ => None,
        },
        _ => None,
    };
    let mut diffs = Vec::new();
    if let Some(flip) = &flip {
        let disk = flip_disk_use(root, flip, &resolved.verified);
        let inputs = preflight_inputs(&config, &gpus, disk, !host_settings.is_empty());
        let result = preflight::run(root, &inputs);
        if let Some(down) = &mut down {
            down.preflight = Some(result.clone());
        }
        situation.preflight = Some(result);
        diffs = render::diff(root, files.slot(flip.to))
            .into_iter()
            .filter(|d| !d.diff.is_empty())
            .collect();
    }
    let rollout = (config.source.follow.is_some()
        && flip.is_some()
        && situation.state.active_digest() != Some(resolved.digest()))
    .then(|| {
        super::follow::preview(
            root,
            &config,
            &resolved,
            &super::follow::node_name(&config, &facts.hostname),
        )
        .map_err(|e| kubeslot_image::error_chain(&e))
        .map(|a| with_limit(a, &config, &facts.hostname, resolved.digest()))
    });
    Ok(Preview {
        rollout,
        state,
        image: Some(config.image.to_string()),
        variant,
        decision: plan::decide(&situation),
        if_down: down.as_ref().map(plan::decide),
        situation: Some(situation),
        diffs,
        host_settings,
    })
}

/// `a` with the cluster-wide limit and the halt (`rollout.limit`), read
/// only: why the update would wait for them, if its wave and window are
/// open.
fn with_limit(
    mut a: super::follow::Admission,
    config: &Config,
    hostname: &str,
    digest: kubeslot_image::digest::Digest,
) -> super::follow::Admission {
    if let (None, Some(l)) = (&a.waiting, &config.rollout.limit) {
        let node = super::follow::node_name(config, hostname);
        let timeout = Duration::from_secs(
            config
                .cluster
                .as_ref()
                .map_or(10, |c| c.request_timeout_secs),
        );
        a.waiting = super::fleet::preview(l, timeout, &node, &digest.to_string());
    }
    a
}

/// The drain a flip (or a rollback) does before it stops the running
/// machine, as the cluster stands now: which pods it would evict, which it
/// skips and why, and which budgets allow zero disruptions.
pub struct DrainPreview {
    /// The Node drained.
    pub node: String,
    /// The kubeconfig the cluster was read with.
    pub kubeconfig: PathBuf,
    /// The plan, or why the cluster could not be read (only when the
    /// kubeconfig came from the config: a `--kubeconfig` that fails fails
    /// the plan).
    pub plan: Result<Plan, String>,
    /// `cluster.drain.required`: an unreadable cluster refuses the flip.
    pub required: bool,
}

/// Reads the drain of this host's Node (`node`, else the config's
/// `kubelet.node_name`, else the host name) through `kubeconfig`, else the
/// config's `cluster.kubeconfig` (a host path under `root`, as the files it
/// names), with the config's `cluster.drain` knobs (`kubectl drain
/// --ignore-daemonsets --delete-emptydir-data`'s choices without one).
/// `None`: no kubeconfig given and none configured (no `cluster` section,
/// `cluster.drain.enabled: false`, or the node's own kubeconfig, which
/// only `activate` reads), or a config that does not load (the plan says
/// why). Reads only (the Node, pods, budgets, DaemonSets); errors name the
/// kubeconfig and the request that failed.
pub fn preview_drain(
    root: &Root,
    config_path: &Path,
    kubeconfig: Option<&Path>,
    node: Option<&str>,
) -> anyhow::Result<Option<DrainPreview>> {
    use anyhow::Context as _;
    let config = match (Config::load(config_path), kubeconfig) {
        (Ok(c), _) => Some(c),
        (Err(e), Some(_)) if node.is_none() => return Err(e.into()),
        (Err(_), Some(_)) => None,
        (Err(_), None) => return Ok(None),
    };
    let cluster = config.as_ref().and_then(|c| c.cluster.clone());
    let drain = cluster
        .as_ref()
        .map(|c| c.drain.clone())
        .unwrap_or_default();
    let (kubeconfig, from_config) = match (
        kubeconfig,
        cluster.as_ref().and_then(|c| c.kubeconfig.as_ref()),
    ) {
        (Some(k), _) => (k.to_path_buf(), false),
        (None, Some(k)) if drain.enabled => (root.join(&k.to_string_lossy()), true),
        (None, _) => return Ok(None),
    };
    // a configured kubeconfig is a host file, as the files it names
    let translate = |p: &Path| {
        if from_config {
            root.join(&p.to_string_lossy())
        } else {
            p.to_path_buf()
        }
    };
    let node = match (node, &config) {
        (Some(n), _) => n.to_string(),
        (None, Some(config)) => render::node_name_of(root, config)?,
        (None, None) => unreachable!("a config that does not load returned above"),
    };
    let opts = DrainOptions {
        force: drain.force,
        delete_emptydir_data: drain.delete_emptydir_data,
        ..DrainOptions::default()
    };
    let timeout = Duration::from_secs(cluster.as_ref().map_or(30, |c| c.request_timeout_secs));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let read = Kubeconfig::load(&kubeconfig, &translate)
        .and_then(|kc| Client::new(&kc, timeout))
        .and_then(|client| pods::read_plan(&client, &node, &opts, now))
        .with_context(|| {
            format!(
                "the drain of node {node} (kubeconfig {})",
                kubeconfig.display()
            )
        });
    let plan = match read {
        Ok(plan) => Ok(plan),
        Err(e) if from_config => Err(format!("{e:#}")),
        Err(e) => return Err(e),
    };
    Ok(Some(DrainPreview {
        node,
        kubeconfig,
        plan,
        required: drain.required,
    }))
}

#[cfg(test)]
mod tests {
    //! `plan` and `activate` agree: each refusal by name, then generated
    //! situations (committed node up, down or stopped; the desired image
    //! the same, newer or older, marked bad, staged; foreign machines; a
    //! failed preflight; the flags), each set up for real (activations
    //! against the fake systemd), previewed, then activated.

    use proptest::prelude::*;

    use super::*;
    use crate::activate::fixture::*;
    use crate::activate::plan::Reason;
    use crate::activate::report::{exit, Outcome, Report};
    use crate::activate::{activate, fetch};
    use crate::slot::Slot;

    /// The verdict class of a decision as `activate` reports it: exit code
    /// and outcome (a flip commits or rolls back, decided by the gate).
    fn assert_agrees(decision: &Decision, r: &Report, new_healthy: bool) {
        match decision {
            Decision::UpToDate { slot, digest } => {
                assert_eq!(r.exit_code, exit::OK, "{decision}: {r:?}");
                assert!(
                    matches!(r.outcome, Some(Outcome::UpToDate | Outcome::Started)),
                    "{decision}: {r:?}"
                );
                assert_eq!((r.slot, r.digest), (Some(*slot), Some(*digest)), "{r:?}");
            }
            Decision::Flip(flip) => {
                let want = if new_healthy {
                    Outcome::Committed
                } else {
                    Outcome::RolledBack
                };
                assert_eq!(r.outcome, Some(want), "{decision}: {r:?}");
                assert_eq!(
                    (r.slot, r.digest),
                    (Some(flip.to), Some(flip.digest)),
                    "{r:?}"
                );
            }
            Decision::Refused(reason) => {
                assert_eq!(r.exit_code, reason.exit_code(), "{decision}: {r:?}");
                let e = r.error.as_deref().unwrap_or_default();
                let said = match reason {
                    // the gate's own words are activate's to know
                    Reason::NotHealthy { slot, .. } => {
                        format!("the committed node {slot} was not running: started it, but machine {slot}: health check kubelet-healthz failed")
                    }
                    _ => reason.to_string(),
                };
                assert!(e.contains(&said), "{decision}\nactivate: {e}");
            }
        }
    }

    /// `plan` (read-only: the state file's bytes unchanged), then
    /// `activate`; both returned.
    fn plan_then_activate(s: &Setup, fake: &FakeSystemd, opts: &Options) -> (Preview, Report) {
        let state_before = std::fs::read(s.root.state_file()).ok();
        let p = preview(&s.root, &s.config, fake, opts).unwrap();
        assert_eq!(std::fs::read(s.root.state_file()).ok(), state_before);
        let r = activate(&s.root, &s.config, fake, opts).report;
        (p, r)
    }

    fn refused(p: &Preview) -> &Reason {
        match &p.decision {
            Decision::Refused(reason) => reason,
            other => panic!("plan: {other}"),
        }
    }

    /// A swap area: the `swap` preflight check fails.
    fn with_swap(s: &Setup) {
        std::fs::write(
            s.root.join("proc/swaps"),
            "Filename\tType\tSize\tUsed\tPriority\n/swapfile file 1048572 0 -2\n",
        )
        .unwrap();
    }

    #[test]
    fn a_bad_image_is_refused_by_plan_and_activate_alike() {
        let (s, fake, _) = setup("healthy", None, "off");
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let bad = image_with(&img_dir(&s), "unhealthy", "2");
        assert_eq!(run(&s, &fake).exit_code, exit::ROLLED_BACK);
        let (p, r) = plan_then_activate(&s, &fake, &Options::default());
        assert!(matches!(refused(&p), Reason::Bad(b) if b.digest == bad));
        assert_eq!(r.exit_code, exit::BAD_IMAGE);
        assert_agrees(&p.decision, &r, false);
    }

    #[test]
    fn a_downgrade_is_refused_by_plan_and_activate_alike() {
        let (s, fake, _) = setup("healthy", None, "off");
        with_identity(&s);
        image_created(&img_dir(&s), "healthy", "2", Some("2026-11-02T00:00:00Z"));
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        image_created(&img_dir(&s), "healthy", "1", Some("2026-11-01T00:00:00Z"));
        let (p, r) = plan_then_activate(&s, &fake, &Options::default());
        assert!(
            matches!(refused(&p), Reason::Downgrade { .. }),
            "{}",
            p.decision
        );
        assert_eq!(r.exit_code, exit::BAD_IMAGE);
        assert_agrees(&p.decision, &r, true);
        // allowed: both flip
        let opts = Options {
            allow_downgrade: true,
            ..Options::default()
        };
        let (p, r) = plan_then_activate(&s, &fake, &opts);
        assert!(matches!(p.decision, Decision::Flip(_)), "{}", p.decision);
        assert_agrees(&p.decision, &r, true);
    }

    #[test]
    fn a_running_flip_target_is_refused_by_plan_and_activate_alike() {
        let (s, fake, _) = setup("healthy", None, "off");
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        image_with(&img_dir(&s), "healthy", "2");
        // kube2, where the flip would stage, runs (started by hand)
        fake.foreign.borrow_mut().insert("kube2".into());
        let calls = fake.calls().len();
        let (p, r) = plan_then_activate(&s, &fake, &Options::default());
        assert!(
            matches!(
                refused(&p),
                Reason::MachineRunning {
                    machine: Slot::Kube2,
                    ..
                }
            ),
            "{}",
            p.decision
        );
        assert_eq!(r.exit_code, exit::CONFIG);
        assert_agrees(&p.decision, &r, true);
        assert_eq!(fake.calls().len(), calls, "a machine was touched");
    }

    #[test]
    fn an_unmanaged_machine_is_refused_by_plan_and_activate_alike() {
        let (s, fake, _) = setup("healthy", None, "off");
        fake.foreign.borrow_mut().insert("kube1".into());
        let (p, r) = plan_then_activate(&s, &fake, &Options::default());
        assert!(
            matches!(
                refused(&p),
                Reason::Unmanaged {
                    machine: Slot::Kube1,
                    ..
                }
            ),
            "{}",
            p.decision
        );
        assert_eq!(r.exit_code, exit::CONFIG);
        assert_agrees(&p.decision, &r, true);
        // refused before the config is read, by both
        std::fs::write(&s.config, b"{").unwrap();
        let (p, r) = plan_then_activate(&s, &fake, &Options::default());
        assert!(p.image.is_none() && p.situation.is_none());
        assert_agrees(&p.decision, &r, true);
    }

    #[test]
    fn an_unbounded_agent_host_is_refused_by_plan_and_activate_alike() {
        let (s, fake, _) = setup("healthy", None, "off");
        let applied = s.root.unbounded_applied_config("kube1");
        std::fs::create_dir_all(applied.parent().unwrap()).unwrap();
        std::fs::write(&applied, b"{}").unwrap();
        let (p, r) = plan_then_activate(&s, &fake, &Options::default());
        assert!(
            matches!(
                refused(&p),
                Reason::Unbounded {
                    machine: Slot::Kube1,
                    ..
                }
            ),
            "{}",
            p.decision
        );
        assert_eq!(r.exit_code, exit::CONFIG);
        assert_agrees(&p.decision, &r, true);
    }

    #[test]
    fn a_failed_preflight_is_refused_by_plan_and_activate_alike() {
        let (s, fake, _) = setup("healthy", None, "off");
        with_swap(&s);
        let (p, r) = plan_then_activate(&s, &fake, &Options::default());
        assert!(
            matches!(refused(&p), Reason::Preflight { summary, .. } if summary.starts_with("swap")),
            "{}",
            p.decision
        );
        assert_eq!(r.exit_code, exit::CONFIG);
        assert_agrees(&p.decision, &r, true);
        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    }

    #[test]
    fn a_committed_node_that_does_not_come_up_is_told_by_plan_and_refused_or_restaged() {
        let (s, fake, _) = setup("healthy", None, "off");
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        // its tree broke, and the host rebooted: kube1 does not run
        let tree = s.root.machine_tree("kube1");
        std::fs::write(tree.join("etc/fixture-health"), b"unhealthy").unwrap();
        fake.stop(&Slot::Kube1.unit()).unwrap();
        // plan starts nothing: up to date, with what activate does first
        let (p, r) = plan_then_activate(&s, &fake, &Options::default());
        assert!(
            matches!(p.decision, Decision::UpToDate { .. }),
            "{}",
            p.decision
        );
        assert_eq!(
            p.situation.as_ref().unwrap().committed,
            Committed::Unchecked
        );
        // ... and what follows if it does not come up: refused, exit 1
        let if_down = p.if_down.as_ref().unwrap();
        assert!(
            matches!(
                if_down,
                Decision::Refused(Reason::NotHealthy {
                    slot: Slot::Kube1,
                    ..
                })
            ),
            "{if_down}"
        );
        // activate started it: it did not come up
        assert_eq!(r.exit_code, exit::FAILED, "{r:?}");
        assert_agrees(if_down, &r, true);
        // --force: the same image staged afresh into kube2
        let force = Options {
            force: true,
            ..Options::default()
        };
        fake.stop(&Slot::Kube1.unit()).unwrap();
        let (p, r) = plan_then_activate(&s, &fake, &force);
        assert!(
            matches!(p.decision, Decision::UpToDate { .. }),
            "{}",
            p.decision
        );
        let if_down = p.if_down.as_ref().unwrap();
        assert!(
            matches!(if_down, Decision::Flip(f) if f.to == Slot::Kube2),
            "{if_down}"
        );
        assert_agrees(if_down, &r, true);
        // and once it runs healthy, no note: both say up to date
        let (p, r) = plan_then_activate(&s, &fake, &Options::default());
        assert!(p.if_down.is_none(), "{:?}", p.if_down);
        assert_agrees(&p.decision, &r, true);
    }

    /// One generated situation.
    #[derive(Clone, Debug)]
    struct Case {
        /// `None`: a fresh host; else kube1 committed, (running, healthy).
        committed: Option<(bool, bool)>,
        /// 0: the committed image again, 1: a newer one, 2: an older one.
        desired: u8,
        desired_healthy: bool,
        /// Marked bad with the current inputs.
        desired_bad: bool,
        /// Fetched (staged into the other slot) first.
        staged: bool,
        /// 0: none, 1: the other slot's machine runs, 2: unbounded-agent's
        /// applied config.
        foreign: u8,
        preflight_fails: bool,
        force: bool,
        allow_downgrade: bool,
    }

    fn cases() -> impl Strategy<Value = Case> {
        (
            proptest::option::of((any::<bool>(), any::<bool>())),
            0u8..3,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            0u8..3,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                |(committed, desired, desired_healthy, desired_bad, staged, foreign, pf, f, ad)| {
                    Case {
                        committed,
                        desired,
                        desired_healthy,
                        desired_bad,
                        staged,
                        foreign,
                        preflight_fails: pf,
                        force: f,
                        allow_downgrade: ad,
                    }
                },
            )
    }

    /// Sets `case` up for real; returns whether the desired image's machine
    /// passes its gate, and whether the committed one does.
    fn set_up(case: &Case, s: &Setup, fake: &FakeSystemd) -> (bool, bool) {
        with_identity(s);
        image_created(&img_dir(s), "healthy", "1", Some("2026-11-02T00:00:00Z"));
        let mut committed_healthy = true;
        if let Some((running, healthy)) = case.committed {
            assert_eq!(run(s, fake).outcome, Some(Outcome::Committed));
            if !healthy {
                let tree = s.root.machine_tree("kube1");
                std::fs::write(tree.join("etc/fixture-health"), b"unhealthy").unwrap();
                fake.healthy
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                committed_healthy = false;
            }
            if !running {
                fake.stop(&Slot::Kube1.unit()).unwrap();
            }
        }
        let health = if case.desired_healthy {
            "healthy"
        } else {
            "unhealthy"
        };
        let desired_healthy = match case.desired {
            1 => {
                image_created(&img_dir(s), health, "3", Some("2026-11-03T00:00:00Z"));
                case.desired_healthy
            }
            2 => {
                image_created(&img_dir(s), health, "0", Some("2026-11-01T00:00:00Z"));
                case.desired_healthy
            }
            _ => true,
        };
        if case.desired_bad {
            let config = Config::load(&s.config).unwrap();
            let facts = render::gather(&s.root, &config).unwrap();
            let digest = open_verified(&s.root, &config).unwrap().digest();
            let (mut state, _) = State::load_torn(&s.root).unwrap();
            let inputs = Rendered::new(&config, &facts).inputs_hash();
            state.mark_bad(digest, inputs, "kubelet-healthz: generated".into());
            state.save(&s.root).unwrap();
        }
        if case.staged {
            let _ = fetch(&s.root, &s.config, fake, &Options::default());
        }
        match case.foreign {
            1 => {
                let other = if case.committed.is_some() {
                    "kube2"
                } else {
                    "kube1"
                };
                fake.foreign.borrow_mut().insert(other.into());
            }
            2 => {
                let applied = s.root.unbounded_applied_config("kube1");
                std::fs::create_dir_all(applied.parent().unwrap()).unwrap();
                std::fs::write(&applied, b"{}").unwrap();
            }
            _ => {}
        }
        if case.preflight_fails {
            with_swap(s);
        }
        (desired_healthy, committed_healthy)
    }

    fn plan_and_activate_agree(case: Case) {
        let (s, fake, _) = setup("healthy", None, "off");
        let (desired_healthy, committed_healthy) = set_up(&case, &s, &fake);
        let opts = Options {
            force: case.force,
            allow_downgrade: case.allow_downgrade,
        };
        let (p, r) = plan_then_activate(&s, &fake, &opts);
        // What plan cannot know (does the committed node that activate
        // starts or gates first come up?) it says both ways: the fixture
        // tells which holds.
        let decision = match &p.if_down {
            Some(if_down) if !committed_healthy => if_down.clone(),
            _ => p.decision.clone(),
        };
        assert_agrees(&decision, &r, desired_healthy);
    }

    proptest! {
        // Each case is a few real activations (about a second with a
        // failing gate): enough cases to cover every refusal and flip.
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn plan_and_activate_agree_on_every_situation(case in cases()) {
            plan_and_activate_agree(case);
        }
    }
}
