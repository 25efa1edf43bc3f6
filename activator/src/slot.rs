//! The two node machines, `kube1` and `kube2`: their names, units and the
//! other one. A value type that state, report, plan and render share; it
//! reads and writes nothing.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The two node machines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Slot {
    Kube1,
    Kube2,
}

impl Slot {
    pub const ALL: [Slot; 2] = [Slot::Kube1, Slot::Kube2];

    /// The machine name (`kube1`), also the directory under
    /// `/var/lib/machines`.
    pub fn machine(self) -> &'static str {
        match self {
            Slot::Kube1 => "kube1",
            Slot::Kube2 => "kube2",
        }
    }

    /// The systemd unit that runs the machine.
    pub fn unit(self) -> String {
        format!("systemd-nspawn@{}.service", self.machine())
    }

    pub fn other(self) -> Slot {
        match self {
            Slot::Kube1 => Slot::Kube2,
            Slot::Kube2 => Slot::Kube1,
        }
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.machine())
    }
}

impl FromStr for Slot {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kube1" => Ok(Slot::Kube1),
            "kube2" => Ok(Slot::Kube2),
            other => Err(format!(
                "unknown machine {other:?}: expected kube1 or kube2"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names() {
        assert_eq!("kube2".parse::<Slot>().unwrap(), Slot::Kube2);
        assert!("kube3".parse::<Slot>().is_err());
        assert_eq!(Slot::Kube1.unit(), "systemd-nspawn@kube1.service");
        assert_eq!(Slot::Kube1.other(), Slot::Kube2);
    }
}
