//! The unpacker's policy and its vocabulary of refusals: [`Limits`],
//! [`Policy`] (with safe defaults), the [`Rule`] a layer broke and the
//! [`UnpackError`] that names layer, entry and rule.
//!
//! It is given nothing and touches nothing: plain data. It deliberately does
//! not decide *whether* a rule is broken; `path`, `whiteout` and `apply` do.

use std::fmt;

use crate::digest::Digest;

/// Resource caps for one image. Each is checked while streaming, before the
/// bytes or entries that would pass it are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Uncompressed tar bytes of one layer (the zip-bomb cap).
    pub max_layer_bytes: u64,
    /// Uncompressed tar bytes of all layers together.
    pub max_total_bytes: u64,
    /// Tar entries of all layers together (metadata headers not counted).
    pub max_entries: u64,
    /// Bytes of an entry name, a hardlink target or a symlink target.
    pub max_path_bytes: usize,
    /// Components of an entry name.
    pub max_depth: usize,
}

impl Default for Limits {
    /// Sized for node images (a few GiB at most); tighten per deployment.
    fn default() -> Self {
        Limits {
            max_layer_bytes: 8 << 30,
            max_total_bytes: 16 << 30,
            max_entries: 1_000_000,
            max_path_bytes: 4096,
            max_depth: 128,
        }
    }
}

/// What an image may contain beyond plain files, directories and links.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub limits: Limits,
    /// FIFOs (and sockets, which only appear through mode bits) are refused
    /// unless this is set. Device nodes are always refused: an nspawn machine
    /// gets its devices from the host, never from the image.
    pub allow_fifos_and_sockets: bool,
    /// Absolute in-image paths (`/usr/bin/su`) of regular files allowed to be
    /// setuid or setgid, or to carry file capabilities (`security.capability`).
    pub setuid_allowlist: Vec<String>,
}

/// The setuid/setgid/file-capability binaries of Debian and Ubuntu base
/// systems (bookworm, trixie, jammy, noble) and the packages a node image
/// plausibly ships, under `/usr` (merged-usr) and the legacy `/bin`/`/sbin`.
const DEFAULT_SETUID: &[&str] = &[
    "bin/su",
    "bin/mount",
    "bin/umount",
    "bin/passwd",
    "bin/chsh",
    "bin/chfn",
    "bin/gpasswd",
    "bin/newgrp",
    "bin/chage",
    "bin/expiry",
    "bin/sudo",
    "bin/ping",
    "bin/ping6",
    "bin/newuidmap",
    "bin/newgidmap",
    "bin/fusermount",
    "bin/fusermount3",
    "bin/crontab",
    "bin/ssh-agent",
    "bin/wall",
    "bin/write.ul",
    "bin/bsd-write",
    "bin/dotlockfile",
    "bin/pkexec",
    "bin/at",
    "bin/mtr-packet",
    "bin/traceroute6.iputils",
    "bin/arping",
    "bin/clockdiff",
    "sbin/unix_chkpwd",
    "sbin/pam_extrausers_chkpwd",
    "sbin/mount.nfs",
    "sbin/mount.cifs",
    "lib/dbus-1.0/dbus-daemon-launch-helper",
    "lib/openssh/ssh-keysign",
    "lib/polkit-1/polkit-agent-helper-1",
    "libexec/polkit-agent-helper-1",
    "lib/eject/dmcrypt-get-device",
    "lib/x86_64-linux-gnu/utempter/utempter",
    "lib/aarch64-linux-gnu/utempter/utempter",
];

impl Default for Policy {
    fn default() -> Self {
        let mut setuid_allowlist = Vec::new();
        for p in DEFAULT_SETUID {
            setuid_allowlist.push(format!("/usr/{p}"));
            if p.starts_with("bin/") || p.starts_with("sbin/") {
                setuid_allowlist.push(format!("/{p}"));
            }
        }
        Policy {
            limits: Limits::default(),
            allow_fifos_and_sockets: false,
            setuid_allowlist,
        }
    }
}

/// The rule a layer broke. `Display` gives a stable kebab-case name that
/// tests, logs and the hostile corpus's `expect` files use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// A `..` component in an entry name.
    Dotdot,
    /// An entry name starting with `/`.
    Absolute,
    /// An empty entry name (or symlink target).
    EmptyName,
    /// A NUL byte in a name or link target.
    NulByte,
    /// The same path twice in one layer.
    Duplicate,
    /// An entry naming the root (`./`) that is not a directory.
    RootEntry,
    /// A parent component of the entry (or of a hardlink target) is a
    /// symlink; it is never followed.
    SymlinkParent,
    /// A parent component of the entry is not a directory.
    ParentNotDirectory,
    /// A hardlink target that is absolute or climbs with `..`.
    HardlinkOutside,
    /// A hardlink to a directory.
    HardlinkToDirectory,
    /// A hardlink to something that is not a regular file (symlink, FIFO).
    HardlinkNotRegular,
    /// A hardlink to a path not present in the tree yet.
    HardlinkMissing,
    /// A character or block device.
    Device,
    /// A FIFO or socket while the policy refuses them.
    FifoOrSocket,
    /// A GNU or PAX sparse entry.
    Sparse,
    /// A PAX global extended header (it would change how later entries parse).
    PaxGlobalHeader,
    /// An entry type the unpacker does not apply (GNU volume label,
    /// multi-volume continuation, unknown types).
    EntryType,
    /// `.wh.` alone, `.wh..`, `.wh...`, an unknown `.wh..wh.` marker or a
    /// whiteout-named directory component.
    MalformedWhiteout,
    /// A setuid/setgid regular file, a file capability, or a hardlink to
    /// either, outside the allowlist.
    Setuid,
    /// An extended attribute that cannot be applied as given.
    Xattr,
    /// The layer's uncompressed bytes pass `max_layer_bytes`.
    LayerTooLarge,
    /// All layers' uncompressed bytes pass `max_total_bytes`.
    TotalTooLarge,
    /// The image has more than `max_entries` entries.
    TooManyEntries,
    /// A name, link target or GNU long-name header longer than
    /// `max_path_bytes`.
    PathTooLong,
    /// A name deeper than `max_depth` components.
    TooDeep,
    /// The uncompressed stream does not hash to the config's `diff_id`.
    DiffIdMismatch,
    /// The compressed stream or the tar structure is corrupt or ambiguous:
    /// bad checksums, truncation, a zstd frame asking for a window above
    /// 32 MiB, a PAX header above 1 MiB, two extension headers of a kind (or
    /// a GNU long name and a PAX path) for one entry, a PAX size that
    /// disagrees with the header, an owner that does not fit 32 bits.
    MalformedArchive,
    /// The target directory is unusable (missing, not a directory, not empty).
    Target,
    /// The policy itself is unusable (an allowlist entry that is not a
    /// normalised absolute path).
    Policy,
    /// A filesystem operation inside the target failed.
    Io,
}

impl Rule {
    /// Every rule, for documentation and exhaustive tests.
    pub const ALL: &'static [Rule] = &[
        Rule::Dotdot,
        Rule::Absolute,
        Rule::EmptyName,
        Rule::NulByte,
        Rule::Duplicate,
        Rule::RootEntry,
        Rule::SymlinkParent,
        Rule::ParentNotDirectory,
        Rule::HardlinkOutside,
        Rule::HardlinkToDirectory,
        Rule::HardlinkNotRegular,
        Rule::HardlinkMissing,
        Rule::Device,
        Rule::FifoOrSocket,
        Rule::Sparse,
        Rule::PaxGlobalHeader,
        Rule::EntryType,
        Rule::MalformedWhiteout,
        Rule::Setuid,
        Rule::Xattr,
        Rule::LayerTooLarge,
        Rule::TotalTooLarge,
        Rule::TooManyEntries,
        Rule::PathTooLong,
        Rule::TooDeep,
        Rule::DiffIdMismatch,
        Rule::MalformedArchive,
        Rule::Target,
        Rule::Policy,
        Rule::Io,
    ];

    /// The stable kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Dotdot => "dotdot",
            Rule::Absolute => "absolute",
            Rule::EmptyName => "empty-name",
            Rule::NulByte => "nul-byte",
            Rule::Duplicate => "duplicate",
            Rule::RootEntry => "root-entry",
            Rule::SymlinkParent => "symlink-parent",
            Rule::ParentNotDirectory => "parent-not-directory",
            Rule::HardlinkOutside => "hardlink-outside",
            Rule::HardlinkToDirectory => "hardlink-to-directory",
            Rule::HardlinkNotRegular => "hardlink-not-regular",
            Rule::HardlinkMissing => "hardlink-missing",
            Rule::Device => "device",
            Rule::FifoOrSocket => "fifo-or-socket",
            Rule::Sparse => "sparse",
            Rule::PaxGlobalHeader => "pax-global-header",
            Rule::EntryType => "entry-type",
            Rule::MalformedWhiteout => "malformed-whiteout",
            Rule::Setuid => "setuid",
            Rule::Xattr => "xattr",
            Rule::LayerTooLarge => "layer-too-large",
            Rule::TotalTooLarge => "total-too-large",
            Rule::TooManyEntries => "too-many-entries",
            Rule::PathTooLong => "path-too-long",
            Rule::TooDeep => "too-deep",
            Rule::DiffIdMismatch => "diff-id-mismatch",
            Rule::MalformedArchive => "malformed-archive",
            Rule::Target => "target",
            Rule::Policy => "policy",
            Rule::Io => "io",
        }
    }

    /// The rule with this kebab-case name.
    pub fn from_name(name: &str) -> Option<Rule> {
        Rule::ALL.iter().copied().find(|r| r.name() == name)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an image could not be unpacked. The staging directory is then
/// garbage: the caller removes it; nothing outside it was touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpackError {
    /// Index (in manifest order, from 0) and compressed digest of the layer.
    pub layer: Option<(usize, Digest)>,
    /// Index of the entry in its layer (from 0, in the order the tar
    /// reader yields entries, metadata headers not counted) and its escaped name.
    pub entry: Option<(u64, String)>,
    pub rule: Rule,
    pub detail: String,
}

impl fmt::Display for UnpackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((index, digest)) = &self.layer {
            write!(f, "layer {index} ({digest}): ")?;
        }
        if let Some((index, name)) = &self.entry {
            write!(f, "entry {index} \"{name}\": ")?;
        }
        write!(f, "rule {}: {}", self.rule, self.detail)
    }
}

impl std::error::Error for UnpackError {}

/// Escapes raw name bytes for messages: printable ASCII as is, everything
/// else (and `"`, `\`) as escapes; long names are cut after 200 bytes.
pub fn escape(bytes: &[u8]) -> String {
    const MAX: usize = 200;
    let mut out = String::new();
    for &b in bytes.iter().take(MAX) {
        out.extend(std::ascii::escape_default(b).map(char::from));
    }
    if bytes.len() > MAX {
        out.push_str(&format!("...({} bytes)", bytes.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for r in Rule::ALL {
            assert!(seen.insert(r.name()), "{r} twice");
            assert_eq!(Rule::from_name(r.name()), Some(*r));
            assert!(r
                .name()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'-'));
        }
    }

    #[test]
    fn display_names_layer_entry_and_rule() {
        let d = Digest::of(b"x");
        let e = UnpackError {
            layer: Some((2, d)),
            entry: Some((17, escape(b"a/../b"))),
            rule: Rule::Dotdot,
            detail: "a `..` component would leave the tree".into(),
        };
        assert_eq!(
            e.to_string(),
            format!("layer 2 ({d}): entry 17 \"a/../b\": rule dotdot: a `..` component would leave the tree")
        );
    }

    #[test]
    fn escape_is_printable() {
        assert_eq!(escape(b"a\0b\"\xff"), "a\\x00b\\\"\\xff");
        assert!(escape(&[b'a'; 500]).ends_with("...(500 bytes)"));
    }

    #[test]
    fn default_allowlist_is_absolute() {
        let p = Policy::default();
        assert!(p.setuid_allowlist.iter().all(|s| s.starts_with('/')));
        assert!(p.setuid_allowlist.contains(&"/usr/bin/su".to_string()));
        assert!(p.setuid_allowlist.contains(&"/bin/su".to_string()));
    }
}
