//! A directory's attributes as overlayfs takes them from a layer: owner,
//! mode, `user.*` xattrs and times, read and copied from one directory to
//! another (the source read without following a symlink). Shared by the
//! metadata layer and the overlay slots; touches nothing but the paths it
//! is given.

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// The `user.*` xattrs of directory `p`, sorted by name.
pub fn user_xattrs(p: &Path) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    // XATTR_LIST_MAX and XATTR_SIZE_MAX: 64 KiB each.
    let mut names = vec![0u8; 65536];
    let n = rustix::fs::llistxattr(p, &mut names[..])?;
    let mut out = Vec::new();
    let mut value = vec![0u8; 65536];
    for name in names[..n].split(|b| *b == 0) {
        if !name.starts_with(b"user.") {
            continue;
        }
        let k = rustix::fs::lgetxattr(p, name, &mut value[..])?;
        out.push((name.to_vec(), value[..k].to_vec()));
    }
    out.sort();
    Ok(out)
}

/// Gives directory `to` the access and modification times of `from` (after
/// anything that creates or removes entries in `to`, which changes them).
pub fn copy_times(from: &Path, to: &Path) -> std::io::Result<()> {
    let m = fs::symlink_metadata(from)?;
    let times = fs::FileTimes::new()
        .set_accessed(m.accessed()?)
        .set_modified(m.modified()?);
    fs::File::open(to)?.set_times(times)
}

/// Gives directory `to` the owner, mode and `user.*` xattrs of `from`
/// (owner first: chown clears the setgid bit). The metadata layer's
/// directories ([`crate::slots::overlay::metalayer`]) and a slot's upper root
/// ([`crate::slots::overlay`]).
pub fn copy_attrs(from: &Path, to: &Path) -> std::io::Result<()> {
    let m = fs::symlink_metadata(from)?;
    std::os::unix::fs::lchown(to, Some(m.uid()), Some(m.gid()))?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(to, fs::Permissions::from_mode(m.mode() & 0o7777))?;
    let wanted = user_xattrs(from)?;
    for (name, _) in user_xattrs(to)? {
        if !wanted.iter().any(|(n, _)| *n == name) {
            rustix::fs::lremovexattr(to, name.as_slice())?;
        }
    }
    for (name, value) in wanted {
        rustix::fs::lsetxattr(to, name.as_slice(), &value, rustix::fs::XattrFlags::empty())?;
    }
    Ok(())
}
