//! Tar header decoding: what one entry's header, with the GNU long-name and
//! PAX extension headers before it, says the entry is.
//!
//! Given a raw `tar::Header`, the extension headers seen since the last real
//! entry ([`Ext`]) and the [`Policy`], [`decode`] returns the entry's kind,
//! its parsed [`ImagePath`], its owner, mode and mtime ([`Meta`]) and its
//! `SCHILY.xattr.*` records, or the rule the header breaks. Numeric fields
//! are read with the `tar` crate's parsers (octal or GNU base-256); PAX
//! records override them. Extension headers are read here with caps
//! ([`Ext::read`]), so no header can make the unpacker allocate without
//! bound. Whatever parsers resolve differently (two headers of a kind, a
//! key twice, a PAX size that disagrees with the header, a GNU long name and
//! a PAX path for one entry) is refused, never resolved one way.
//!
//! It changes nothing on disk and knows nothing of layers or whiteouts: it
//! refuses entry types that are never applied (devices, PAX global headers,
//! sparse files, unknown types; FIFOs and sockets unless the policy allows
//! them) and leaves the rest to `entry.rs`.

use std::collections::BTreeSet;
use std::io::Read;

use rustix::fs::{FileType, Timespec};

use super::apply::{Fail, Meta};
use super::path::ImagePath;
use super::rules::{escape, Limits, Policy, Rule};
use super::Step;

/// Largest PAX extended header accepted (paths, times, xattrs all fit).
const MAX_PAX_BYTES: u64 = 1 << 20;

/// GNU long name/link and PAX headers seen since the last real entry; they
/// describe the next one.
#[derive(Default)]
pub(super) struct Ext {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

/// How much data an extension header of type `ty` may carry, or `None`
/// when `ty` is not an extension header (a real entry).
pub(super) fn extension_cap(ty: tar::EntryType, limits: &Limits) -> Option<u64> {
    match ty {
        tar::EntryType::GNULongName | tar::EntryType::GNULongLink => {
            // the name, its NUL, and nothing more
            Some(limits.max_path_bytes as u64 + 1)
        }
        tar::EntryType::XHeader => Some(MAX_PAX_BYTES),
        _ => None,
    }
}

impl Ext {
    pub(super) fn is_empty(&self) -> bool {
        self.long_name.is_none() && self.long_link.is_none() && self.pax.is_none()
    }

    /// Reads extension header `entry` (type `ty`, at most `cap` bytes of
    /// data) and records it for the next real entry.
    pub(super) fn read<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        cap: u64,
        ty: tar::EntryType,
    ) -> Result<(), Step> {
        let data = read_capped(entry, cap, ty)?;
        self.set(ty, data).map_err(Step::from)
    }

    /// Records an extension header; two of a kind for one entry is an
    /// ambiguity parsers resolve differently, so it is refused.
    fn set(&mut self, ty: tar::EntryType, data: Vec<u8>) -> Result<(), Fail> {
        let (slot, what) = match ty {
            tar::EntryType::GNULongName => (&mut self.long_name, "GNU long name"),
            tar::EntryType::GNULongLink => (&mut self.long_link, "GNU long link"),
            _ => (&mut self.pax, "PAX"),
        };
        if slot.is_some() {
            return Err((
                Rule::MalformedArchive,
                format!("two {what} headers describe the same entry"),
            ));
        }
        *slot = Some(data);
        Ok(())
    }

    fn pax_value(&self, key: &[u8]) -> Option<&[u8]> {
        tar::PaxExtensions::new(self.pax.as_deref()?)
            .filter_map(Result::ok)
            .find(|r| r.key_bytes() == key)
            .map(|r| r.value_bytes())
    }

    /// The entry's name: PAX `path`, else the GNU long name (without its
    /// terminating NUL), else the header's (prefix and) name.
    pub(super) fn path(&self, header: &tar::Header) -> Vec<u8> {
        if let Some(p) = self.pax_value(b"path") {
            return p.to_vec();
        }
        if let Some(n) = &self.long_name {
            return n.strip_suffix(b"\0").unwrap_or(n).to_vec();
        }
        header.path_bytes().into_owned()
    }

    /// The link target: PAX `linkpath`, else the GNU long link, else the header's.
    pub(super) fn link(&self, header: &tar::Header) -> Vec<u8> {
        if let Some(p) = self.pax_value(b"linkpath") {
            return p.to_vec();
        }
        if let Some(n) = &self.long_link {
            return n.strip_suffix(b"\0").unwrap_or(n).to_vec();
        }
        header
            .link_name_bytes()
            .map(|c| c.into_owned())
            .unwrap_or_default()
    }

    /// A GNU long name and a PAX path for one entry may disagree; refuse both.
    fn check(&self) -> Result<(), Step> {
        if (self.long_name.is_some() && self.pax_value(b"path").is_some())
            || (self.long_link.is_some() && self.pax_value(b"linkpath").is_some())
        {
            return Err(Step::Rule(
                Rule::MalformedArchive,
                "both a GNU long name and a PAX path name this entry".into(),
            ));
        }
        Ok(())
    }
}

/// Reads an extension header's data, refusing it unread past `cap`.
fn read_capped<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    cap: u64,
    ty: tar::EntryType,
) -> Result<Vec<u8>, Step> {
    let size = entry.size();
    if size > cap {
        return Err(Step::Rule(
            if ty == tar::EntryType::XHeader {
                Rule::MalformedArchive
            } else {
                Rule::PathTooLong
            },
            format!("a {size}-byte extension header ({ty:?}), more than the {cap} allowed"),
        ));
    }
    let mut data = Vec::with_capacity(size as usize);
    entry.read_to_end(&mut data).map_err(Step::Stream)?;
    if data.len() as u64 != size {
        return Err(Step::Rule(
            Rule::MalformedArchive,
            format!(
                "extension header data ends after {} of {size} bytes",
                data.len()
            ),
        ));
    }
    Ok(data)
}

/// What an entry creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EntryKind {
    File,
    Dir,
    Symlink,
    Hardlink,
    /// A FIFO or socket (only when the policy allows them).
    Node(FileType),
}

/// One entry as its headers describe it.
pub(super) struct Decoded {
    pub kind: EntryKind,
    pub path: ImagePath,
    pub meta: Meta,
    /// `SCHILY.xattr.*` records, in header order (`set_meta` picks the
    /// namespaces it applies).
    pub xattrs: Vec<(String, Vec<u8>)>,
}

/// Decodes one real entry's header: numeric fields, then the entry type
/// (some are refused whatever their name), then PAX overrides and xattrs,
/// then the name. `raw_path` is the name [`Ext::path`] chose; PAX
/// `LIBARCHIVE.xattr.*` records are counted in `ignored_xattrs`.
pub(super) fn decode(
    header: &tar::Header,
    ext: &Ext,
    raw_path: &[u8],
    policy: &Policy,
    ignored_xattrs: &mut u64,
) -> Result<Decoded, Step> {
    let mut fields = Fields::read(header)?;
    let kind = kind_of(header.entry_type(), fields.mode, policy)?;
    let mut xattrs = Vec::new();
    if let Some(pax) = &ext.pax {
        fields.apply_pax(pax, &mut xattrs, ignored_xattrs)?;
    }
    ext.check()?;
    let path = ImagePath::parse(raw_path, &policy.limits).map_err(Step::from)?;
    // (u32)-1 means "leave unchanged" to chown: the file would stay
    // root-owned while the image said otherwise.
    if fields.uid >= u32::MAX as u64 || fields.gid >= u32::MAX as u64 {
        return Err(Step::Rule(
            Rule::MalformedArchive,
            format!(
                "owner {}:{} is not a valid 32-bit uid:gid",
                fields.uid, fields.gid
            ),
        ));
    }
    Ok(Decoded {
        kind,
        path,
        meta: Meta {
            uid: fields.uid as u32,
            gid: fields.gid as u32,
            mode: fields.mode & 0o7777,
            mtime: fields.mtime,
        },
        xattrs,
    })
}

/// The ustar/GNU numeric fields of a header, before PAX overrides.
struct Fields {
    /// The whole mode field, file-type bits included.
    mode: u32,
    uid: u64,
    gid: u64,
    size: u64,
    mtime: Timespec,
}

impl Fields {
    fn read(header: &tar::Header) -> Result<Fields, Step> {
        let bad = |what: &str, e: std::io::Error| {
            Step::Rule(Rule::MalformedArchive, format!("{what} field: {e}"))
        };
        let mode = header.mode().map_err(|e| bad("mode", e))?;
        let uid = header.uid().map_err(|e| bad("uid", e))?;
        let gid = header.gid().map_err(|e| bad("gid", e))?;
        let size = header.entry_size().map_err(|e| bad("size", e))?;
        let mtime = header.mtime().map_err(|e| bad("mtime", e))?;
        Ok(Fields {
            mode,
            uid,
            gid,
            size,
            mtime: Timespec {
                tv_sec: mtime.min(i64::MAX as u64) as i64,
                tv_nsec: 0,
            },
        })
    }

    /// PAX records: sparse markers, size/uid/gid/mtime overrides, xattrs.
    fn apply_pax(
        &mut self,
        pax: &[u8],
        xattrs: &mut Vec<(String, Vec<u8>)>,
        ignored_xattrs: &mut u64,
    ) -> Result<(), Step> {
        let bad = |what: &str, v: &[u8]| {
            Step::Rule(
                Rule::MalformedArchive,
                format!("PAX {what} {:?}", escape(v)),
            )
        };
        let mut keys = BTreeSet::new();
        for rec in tar::PaxExtensions::new(pax) {
            let rec =
                rec.map_err(|e| Step::Rule(Rule::MalformedArchive, format!("PAX record: {e}")))?;
            let (key, value) = (rec.key_bytes(), rec.value_bytes());
            // Parsers disagree on which of two values wins.
            if !keys.insert(key) {
                return Err(Step::Rule(
                    Rule::MalformedArchive,
                    format!("PAX key {:?} appears twice in one header", escape(key)),
                ));
            }
            match key {
                b"mtime" => {
                    self.mtime = parse_pax_time(value).ok_or_else(|| bad("mtime", value))?
                }
                b"uid" => self.uid = parse_u64(value).ok_or_else(|| bad("uid", value))?,
                b"gid" => self.gid = parse_u64(value).ok_or_else(|| bad("gid", value))?,
                // The raw reader skips by the header's size; a PAX size
                // that disagrees would make parsers see different files.
                b"size" if parse_u64(value) != Some(self.size) => {
                    return Err(Step::Rule(
                        Rule::MalformedArchive,
                        format!(
                            "PAX size {:?} disagrees with the header's {}",
                            escape(value),
                            self.size
                        ),
                    ));
                }
                b"size" => {}
                _ if key.starts_with(b"GNU.sparse.") => {
                    return Err(Step::Rule(
                        Rule::Sparse,
                        "PAX GNU.sparse records mark a sparse entry".into(),
                    ));
                }
                _ => {
                    if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                        xattrs.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
                    } else if key.starts_with(b"LIBARCHIVE.xattr.") {
                        *ignored_xattrs += 1;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The entry's kind from its type flag and mode, or the refusal of a type
/// that is never applied: device nodes (an nspawn machine gets its devices
/// from the host), PAX global headers, sparse files, unknown types, and
/// FIFOs and sockets unless the policy allows them.
fn kind_of(ty: tar::EntryType, raw_mode: u32, policy: &Policy) -> Result<EntryKind, Step> {
    let kind = match ty {
        tar::EntryType::Regular | tar::EntryType::Continuous => EntryKind::File,
        tar::EntryType::Directory => EntryKind::Dir,
        tar::EntryType::Symlink => EntryKind::Symlink,
        tar::EntryType::Link => EntryKind::Hardlink,
        tar::EntryType::Char | tar::EntryType::Block => {
            return Err(Step::Rule(
                Rule::Device,
                "device nodes are never created from an image".into(),
            ))
        }
        tar::EntryType::Fifo => EntryKind::Node(FileType::Fifo),
        tar::EntryType::XGlobalHeader => {
            return Err(Step::Rule(
                Rule::PaxGlobalHeader,
                "a PAX global header would change how every later entry is read".into(),
            ))
        }
        tar::EntryType::GNUSparse => {
            return Err(Step::Rule(
                Rule::Sparse,
                "GNU sparse entries are not supported".into(),
            ))
        }
        other => {
            return Err(Step::Rule(
                Rule::EntryType,
                format!(
                    "entry type {:?} ({}) is not applied",
                    other,
                    other.as_byte() as char
                ),
            ))
        }
    };
    // Sockets have no tar type; a writer can only express one in the
    // mode's file-type bits.
    let kind = if raw_mode & 0o170000 == 0o140000 {
        EntryKind::Node(FileType::Socket)
    } else {
        kind
    };
    if let EntryKind::Node(ft) = kind {
        if !policy.allow_fifos_and_sockets {
            return Err(Step::Rule(
                Rule::FifoOrSocket,
                format!("a {ft:?} entry, and the policy refuses FIFOs and sockets"),
            ));
        }
    }
    Ok(kind)
}

fn parse_u64(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// A PAX time: `SECONDS[.FRACTION]`, possibly negative.
fn parse_pax_time(v: &[u8]) -> Option<Timespec> {
    let s = std::str::from_utf8(v).ok()?;
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let tv_sec: i64 = secs.parse().ok()?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let tv_nsec: i64 = digits.parse().ok()?;
    // -1.5 means 1.5 s before the epoch.
    if secs.starts_with('-') && tv_nsec > 0 {
        return Some(Timespec {
            tv_sec: tv_sec.checked_sub(1)?,
            tv_nsec: 1_000_000_000 - tv_nsec,
        });
    }
    Some(Timespec { tv_sec, tv_nsec })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_times() {
        let t = parse_pax_time(b"1700000000.5").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (1_700_000_000, 500_000_000));
        let t = parse_pax_time(b"12").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (12, 0));
        let t = parse_pax_time(b"-1.5").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (-2, 500_000_000));
        assert!(parse_pax_time(b"x").is_none());
    }
}
