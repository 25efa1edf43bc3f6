//! Failpoints: named step boundaries where a test can make the process die
//! as abruptly as `kill -9` would, to prove crash safety.
//!
//! `KUBESLOT_FAILPOINT=<name>` makes [`hit`] call `std::process::abort` at
//! that boundary (no destructors, no buffered output flushed, the lock
//! dropped by the kernel). Production never sets the variable; with it unset
//! [`hit`] is one environment lookup. It does not inject errors or delays.
//!
//! The boundaries, in the order an activation passes them:
//!
//! | name                   | just after                                        |
//! |------------------------|---------------------------------------------------|
//! | `after-lock`           | the run lock is taken                             |
//! | `after-recover`        | a dead run's pending or dirty state was handled   |
//! | `after-unpack`         | the image is fetched and unpacked beside the slot |
//! | `after-mark-dirty`     | the target slot is recorded dirty                 |
//! | `after-stage`          | the image tree is renamed into the slot           |
//! | `after-render`         | the host files of the target slot are written     |
//! | `after-staged`         | the slot is recorded staged                       |
//! | `after-pending`        | "pending, prepared" is recorded                   |
//! | `after-trying`         | "pending, trying" (the one try) is recorded       |
//! | `after-stop-old`       | the old machine is stopped                        |
//! | `after-start-new`      | the new machine's unit is started                 |
//! | `after-health`         | the health gate passed                            |
//! | `after-enable`         | the old machine disabled, the new enabled at boot |
//! | `after-commit`         | the new slot is committed                         |
//! | `after-rollback-stop`  | a failed new machine is stopped (rollback path)   |
//! | `after-rollback-start` | the old machine is started again (rollback path)  |
//! | `state-between-writes` | inside a state save: state written, sidecar not   |
//!
//! With a `cluster` section (issue 38) a flip from a running machine also
//! passes, before `after-trying`, the boundaries of [`CLUSTER`]:
//! `after-cordon` (the Node cordoned, recorded in the state) and
//! `after-drain` (its pods evicted and gone).
//!
//! `fetch` passes the same boundaries up to `after-staged` (without
//! `after-render`), and `state-between-writes` in each of its saves.

/// The environment variable naming the failpoint to trigger.
pub const ENV: &str = "KUBESLOT_FAILPOINT";

/// Every failpoint name, for tests that walk them all.
pub const ALL: &[&str] = &[
    "after-lock",
    "after-recover",
    "after-unpack",
    "after-mark-dirty",
    "after-stage",
    "after-render",
    "after-staged",
    "after-pending",
    "after-trying",
    "after-stop-old",
    "after-start-new",
    "after-health",
    "after-enable",
    "after-commit",
    "after-rollback-stop",
    "after-rollback-start",
    "state-between-writes",
];

/// The drain's boundaries (reached only with the cluster configured, so
/// not in [`ALL`], which every activation passes).
pub const CLUSTER: &[&str] = &["after-cordon", "after-drain"];

/// Aborts the process if `KUBESLOT_FAILPOINT` names this boundary.
pub fn hit(name: &'static str) {
    debug_assert!(
        ALL.contains(&name) || CLUSTER.contains(&name),
        "undeclared failpoint {name}"
    );
    if std::env::var_os(ENV).is_some_and(|v| v == name) {
        eprintln!("kubeslot-activator: failpoint {name}: aborting");
        std::process::abort();
    }
}
