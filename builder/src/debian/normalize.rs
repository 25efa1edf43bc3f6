//! Normalising an mmdebstrap rootfs tar into a deterministic one: entries
//! sorted by path, hardlinks pointing at the first path of their group,
//! numeric owners only, mtimes clamped to `SOURCE_DATE_EPOCH`, and the files
//! that differ between otherwise identical installs removed or emptied
//! (logs, apt lists and caches, ldconfig aux cache, `*-old` dpkg/debconf
//! files, machine-id, random seeds, man-db caches, resolv.conf, hostname,
//! device nodes: the activator and systemd-nspawn provide those; and
//! mmdebstrap's own apt/dpkg settings, which belong to the build). Given the
//! raw tar; writes the output atomically and returns its sha256. It keeps
//! `SCHILY.xattr.*` records (file capabilities) and drops other PAX records.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use sha2::{Digest as _, Sha256};

use super::error::{io_err, DebianError};

/// What happens to one path of the raw tree.
#[derive(Debug, PartialEq, Eq)]
enum Rule {
    Keep,
    Drop,
    /// Keep the entry as an empty regular file.
    Empty,
}

fn rule(path: &str, kind: tar::EntryType) -> Rule {
    let dir = kind.is_dir();
    if path.starts_with("dev/") {
        return Rule::Drop;
    }
    // sources.list names the build's temporary local repository.
    if matches!(path, "etc/machine-id" | "etc/apt/sources.list") {
        return Rule::Empty;
    }
    if matches!(
        path,
        "etc/resolv.conf"
            | "etc/hostname"
            | "var/lib/dbus/machine-id"
            | "var/lib/systemd/random-seed"
            | "var/lib/systemd/credential.secret"
            | "var/cache/ldconfig/aux-cache"
            | "var/lib/dpkg/lock"
            | "var/lib/dpkg/lock-frontend"
            | "var/lib/dpkg/triggers/Lock"
            | "var/cache/debconf/passwords.dat"
            // mmdebstrap's --aptopt/--dpkgopt: build settings, not the image's
            // (force-unsafe-io must not stay in a node's dpkg).
            | "etc/apt/apt.conf.d/99mmdebstrap"
            | "etc/dpkg/dpkg.cfg.d/99mmdebstrap"
    ) {
        return Rule::Drop;
    }
    if !dir
        && [
            "var/log/",
            "var/cache/apt/",
            "var/lib/apt/lists/",
            "var/cache/man/",
            "tmp/",
            "run/",
            "var/tmp/",
        ]
        .iter()
        .any(|p| path.starts_with(p))
    {
        return Rule::Drop;
    }
    if !dir
        && (path.starts_with("var/lib/dpkg/") || path.starts_with("var/cache/debconf/"))
        && path.ends_with("-old")
    {
        return Rule::Drop;
    }
    Rule::Keep
}

struct Item {
    path: String,
    header: tar::Header,
    xattrs: Vec<(String, Vec<u8>)>,
    link: Option<String>,
    offset: u64,
    size: u64,
    rule: Rule,
}

fn clean(p: &str) -> String {
    p.trim_start_matches("./").trim_end_matches('/').to_string()
}

/// Every entry of `raw` but the root, with the rule for its path; device
/// nodes and FIFOs outside `/dev` refused.
fn read_items(raw: &Path) -> Result<Vec<Item>, DebianError> {
    let bad = |reason: String| DebianError::Tar {
        path: raw.to_path_buf(),
        reason,
    };
    let file = File::open(raw).map_err(io_err(raw))?;
    let mut archive = tar::Archive::new(BufReader::new(file));
    let mut items: Vec<Item> = Vec::new();
    for entry in archive.entries().map_err(io_err(raw))? {
        let mut entry = entry.map_err(io_err(raw))?;
        let path = clean(&entry.path().map_err(io_err(raw))?.to_string_lossy());
        if path.is_empty() {
            continue; // the root directory itself
        }
        let kind = entry.header().entry_type();
        let mut xattrs = Vec::new();
        if let Some(exts) = entry.pax_extensions().map_err(io_err(raw))? {
            for ext in exts {
                let ext = ext.map_err(io_err(raw))?;
                let key = ext.key().map_err(|e| bad(e.to_string()))?;
                if key.starts_with("SCHILY.xattr.") {
                    xattrs.push((key.to_string(), ext.value_bytes().to_vec()));
                }
            }
        }
        let link = entry
            .link_name()
            .map_err(io_err(raw))?
            .map(|l| l.to_string_lossy().to_string());
        let rule = rule(&path, kind);
        if (kind.is_character_special() || kind.is_block_special() || kind.is_fifo())
            && rule != Rule::Drop
        {
            return Err(bad(format!("{path}: device node or fifo outside /dev")));
        }
        items.push(Item {
            path,
            header: entry.header().clone(),
            xattrs,
            link,
            offset: entry.raw_file_position(),
            size: entry.size(),
            rule,
        });
    }
    Ok(items)
}

/// Hardlink groups of the sorted, kept items.
struct Links {
    /// Item index by path.
    by_path: BTreeMap<String, usize>,
    /// Group member (the target included) -> the group's original target.
    group_of: BTreeMap<String, String>,
    /// Target -> the group's first member in sorted order.
    primary: BTreeMap<String, String>,
}

/// Hardlink groups: the target and every link to it; the first path in
/// sorted order carries the data, the others link to it. A link to a path
/// that is not kept is refused.
fn links(raw: &Path, items: &[Item]) -> Result<Links, DebianError> {
    let bad = |reason: String| DebianError::Tar {
        path: raw.to_path_buf(),
        reason,
    };
    let by_path: BTreeMap<String, usize> = items
        .iter()
        .enumerate()
        .map(|(i, it)| (it.path.clone(), i))
        .collect();
    let mut group_of: BTreeMap<String, String> = BTreeMap::new(); // member -> target
    for it in items {
        if it.header.entry_type().is_hard_link() {
            let target = clean(it.link.as_deref().unwrap_or_default());
            if !by_path.contains_key(&target) {
                return Err(bad(format!("{}: hardlink to missing {target}", it.path)));
            }
            group_of.insert(it.path.clone(), target.clone());
            group_of.insert(target.clone(), target);
        }
    }
    let mut primary: BTreeMap<String, String> = BTreeMap::new(); // target -> first member
    for (member, target) in &group_of {
        let p = primary
            .entry(target.clone())
            .or_insert_with(|| member.clone());
        if member < p {
            *p = member.clone();
        }
    }

    Ok(Links {
        by_path,
        group_of,
        primary,
    })
}

/// Reads `raw`, writes the normalised tar to `out` (temp, fsync, rename,
/// fsync dir) and returns its sha256 (hex).
pub fn normalize_tar(raw: &Path, out: &Path, epoch: i64) -> Result<String, DebianError> {
    let bad = |reason: String| DebianError::Tar {
        path: raw.to_path_buf(),
        reason,
    };
    let mut items = read_items(raw)?;
    items.retain(|i| i.rule != Rule::Drop);
    items.sort_by(|a, b| a.path.cmp(&b.path));

    let Links {
        by_path,
        group_of,
        primary,
    } = links(raw, &items)?;

    let dir = out.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".rootfs-")
        // what other users may read (umask applies), not tempfile's 0600
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(dir)
        .map_err(io_err(dir))?;
    let mut src = File::open(raw).map_err(io_err(raw))?;
    {
        let mut builder = tar::Builder::new(BufWriter::new(tmp.as_file()));
        builder.mode(tar::HeaderMode::Deterministic);
        for it in &items {
            let mut h = tar::Header::new_ustar();
            h.set_mode(it.header.mode().map_err(io_err(raw))?);
            h.set_uid(it.header.uid().map_err(io_err(raw))?);
            h.set_gid(it.header.gid().map_err(io_err(raw))?);
            let mtime = it.header.mtime().map_err(io_err(raw))?;
            h.set_mtime(mtime.min(epoch.max(0) as u64));
            if !it.xattrs.is_empty() {
                builder
                    .append_pax_extensions(
                        it.xattrs.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
                    )
                    .map_err(io_err(out))?;
            }
            let kind = it.header.entry_type();
            let group = group_of.get(&it.path).map(|t| (t, &primary[t]));
            let w = if let Some((target, first)) = group.filter(|(_, f)| **f != it.path) {
                let _ = target;
                h.set_entry_type(tar::EntryType::Link);
                h.set_size(0);
                builder.append_link(&mut h, &it.path, first)
            } else if kind.is_dir() {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                builder.append_data(&mut h, format!("{}/", it.path), std::io::empty())
            } else if kind.is_symlink() {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                builder.append_link(&mut h, &it.path, it.link.as_deref().unwrap_or_default())
            } else if it.rule == Rule::Empty {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(0);
                builder.append_data(&mut h, &it.path, std::io::empty())
            } else {
                // A regular file, or the first member of a hardlink group
                // (data from the group's original target).
                let data_from = match group {
                    Some((target, _)) => &items[by_path[target]],
                    None => it,
                };
                if !(kind.is_file() || group.is_some()) {
                    return Err(bad(format!("{}: unsupported entry type {kind:?}", it.path)));
                }
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data_from.size);
                src.seek(SeekFrom::Start(data_from.offset))
                    .map_err(io_err(raw))?;
                builder.append_data(&mut h, &it.path, (&mut src).take(data_from.size))
            };
            w.map_err(io_err(out))?;
        }
        builder
            .into_inner()
            .and_then(|mut w| w.flush())
            .map_err(io_err(out))?;
    }
    tmp.as_file().sync_all().map_err(io_err(tmp.path()))?;
    let mut hasher = Sha256::new();
    let mut f = File::open(tmp.path()).map_err(io_err(tmp.path()))?;
    std::io::copy(&mut f, &mut hasher).map_err(io_err(tmp.path()))?;
    tmp.persist(out).map_err(|e| io_err(out)(e.error))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_drop_what_differs_between_builds() {
        use tar::EntryType::{Directory, Regular};
        assert_eq!(rule("var/log/dpkg.log", Regular), Rule::Drop);
        assert_eq!(rule("var/log/apt", Directory), Rule::Keep);
        assert_eq!(rule("etc/machine-id", Regular), Rule::Empty);
        assert_eq!(rule("var/lib/dpkg/status-old", Regular), Rule::Drop);
        assert_eq!(rule("var/lib/dpkg/status", Regular), Rule::Keep);
        assert_eq!(rule("dev/null", tar::EntryType::Char), Rule::Drop);
        assert_eq!(rule("usr/bin/systemctl", Regular), Rule::Keep);
        assert_eq!(
            rule("etc/dpkg/dpkg.cfg.d/99mmdebstrap", Regular),
            Rule::Drop
        );
        assert_eq!(rule("etc/apt/sources.list", Regular), Rule::Empty);
    }
}
