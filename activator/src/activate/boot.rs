//! Which machines run, and which start at boot: the committed slot is the
//! one enabled (`machines.target.wants`), and a commit switches the links
//! old first, new second.

use crate::slot::Slot;

use super::{ActivateError, Run};

/// The target that pulls the machines enabled at boot in.
pub const MACHINES_TARGET: &str = "machines.target";

/// Reconciling the state with systemd, boot enablement, preflight.
impl Run<'_> {
    /// Whether `slot`'s machine runs: its unit is active, or machined
    /// knows a machine of that name (started some other way).
    pub(super) fn running(&self, slot: Slot) -> Result<bool, ActivateError> {
        Ok(self.systemd.is_active(&slot.unit())?
            || self.systemd.machine_registered(slot.machine())?)
    }

    /// Whether `slot`'s machine starts at boot (its `machines.target.wants`
    /// link, made by `systemctl enable` or `machinectl enable`).
    pub(super) fn enabled(&self, slot: Slot) -> bool {
        std::fs::symlink_metadata(self.root.machine_wants_link(slot.machine())).is_ok()
    }

    pub(super) fn enable(&self, slot: Slot) -> Result<(), ActivateError> {
        if !self.enabled(slot) {
            // machinectl enable does both: the target may be off on a
            // host that never ran a machine at boot
            self.systemd.enable(MACHINES_TARGET)?;
            self.systemd.enable(&slot.unit())?;
        }
        Ok(())
    }

    /// The committed slot (if any) starts at boot and no other does.
    pub(super) fn ensure_enabled(&self, active: Option<Slot>) -> Result<(), ActivateError> {
        for slot in Slot::ALL {
            if Some(slot) != active && self.enabled(slot) {
                self.systemd.disable(&slot.unit())?;
            }
        }
        match active {
            Some(a) => self.enable(a),
            None => Ok(()),
        }
    }

    /// A commit's boot switch: `from` disabled first, then `to` enabled.
    pub(super) fn switch_enabled(&self, from: Option<Slot>, to: Slot) -> Result<(), ActivateError> {
        if let Some(from) = from.filter(|f| self.enabled(*f)) {
            self.systemd.disable(&from.unit())?;
        }
        self.enable(to)
    }
}
