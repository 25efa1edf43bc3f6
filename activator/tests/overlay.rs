//! Overlay slots, below the flip: the layer store (each layer unpacked once,
//! by the safe unpacker, whiteouts recorded the overlayfs way) and the
//! slot's mount unit, with real tar layers, a real OCI layout and real
//! overlayfs mounts (the tests run as root, like the activator). systemd is
//! faked at its trait; the fake's `start`/`stop` of a mount unit run the
//! unit's own mount with `mount -t overlay` / `umount`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::sync::Arc;

use kubeslot_activator::fetch::store::Store;
use kubeslot_activator::paths::Root;
use kubeslot_activator::slot::Slot;
use kubeslot_activator::slots::overlay::layers;
use kubeslot_activator::slots::overlay::{self, OverlayError};
use kubeslot_activator::testing::FakeSystemd;
use kubeslot_image::digest::Digest;
use kubeslot_image::oci::{Compression, Platform};
use kubeslot_image::reference::ImageSource;
use kubeslot_image::retry::Pacing;
use kubeslot_image::source::{SelectedImage, Source};
use kubeslot_image::unpack::{Layer, Policy, Rule, Unpacker};
use kubeslot_test_support::image;
use kubeslot_test_support::tar::tar_with_dirs;

/// Base: a few dirs and files. Update: deletes a file (`.wh.`), a directory
/// (`.wh.srv`, `opt/.wh.sub`), empties a directory (opaque) and adds files. Top: brings a
/// deleted file back, deletes a file, and whites out a directory it also
/// writes (only its own entries stay).
fn layers() -> Vec<Vec<u8>> {
    vec![
        tar_with_dirs(
            &[
                "etc/",
                "usr/",
                "usr/share/",
                "usr/share/doc/",
                "opt/",
                "opt/sub/",
                "srv/",
            ],
            &[
                ("etc/old", b"old\n"),
                ("etc/keep", b"keep\n"),
                ("usr/share/doc/a", b"a\n"),
                ("usr/share/doc/b", b"b\n"),
                ("opt/sub/x", b"x\n"),
                ("opt/y", b"y\n"),
                ("srv/s", b"s\n"),
            ],
        ),
        tar_with_dirs(
            &["etc/", "usr/", "usr/share/", "usr/share/doc/", "opt/"],
            &[
                ("etc/.wh.old", b""),
                ("usr/share/doc/.wh..wh..opq", b""),
                ("usr/share/doc/c", b"c\n"),
                ("etc/new", b"new\n"),
                ("opt/.wh.sub", b""),
                (".wh.srv", b""),
            ],
        ),
        tar_with_dirs(
            &["etc/", "opt/", "usr/", "usr/share/", "usr/share/doc/"],
            &[
                ("usr/share/.wh.doc", b""),
                ("usr/share/doc/d", b"d\n"),
                ("etc/old", b"back\n"),
                ("opt/.wh.y", b""),
                ("opt/z", b"z\n"),
            ],
        ),
    ]
}

/// Path → type, mode, owner, size, content digest (or link target).
fn facts(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let what = if m.is_dir() {
                stack.push(p.clone());
                "dir".to_string()
            } else if m.is_file() {
                format!("file {}", Digest::of(&fs::read(&p).unwrap()))
            } else {
                format!("{:?}", m.file_type())
            };
            out.insert(
                p.strip_prefix(root).unwrap().to_path_buf(),
                format!("{what} {:o} {}:{}", m.mode(), m.uid(), m.gid()),
            );
        }
    }
    out
}

fn mount(options: &str, target: &Path) {
    let st = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", options])
        .arg(target)
        .status()
        .unwrap();
    assert!(
        st.success(),
        "mount -t overlay -o {options} {}",
        target.display()
    );
}

/// Unmounts on drop, so a failed assertion leaves no mount behind.
struct Mounted(PathBuf);
impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg(&self.0)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn apply_one(u: &mut Unpacker, index: usize, tar: &[u8]) {
    let d = Digest::of(tar);
    u.apply(Layer {
        index,
        digest: d,
        diff_id: d,
        compression: Compression::None,
        reader: tar,
    })
    .unwrap();
}

#[test]
fn overlay_layers_mount_to_the_tree_the_copy_mode_unpacks() {
    let tmp = tempfile::tempdir().unwrap();
    let ls = layers();

    let copy = tmp.path().join("copy");
    fs::create_dir(&copy).unwrap();
    let mut u = Unpacker::new(&copy, Policy::default()).unwrap();
    for (i, t) in ls.iter().enumerate() {
        apply_one(&mut u, i, t);
    }
    u.finish().unwrap();

    let mut dirs = Vec::new();
    for (i, t) in ls.iter().enumerate() {
        let d = tmp.path().join(format!("l{i}"));
        fs::create_dir(&d).unwrap();
        let mut u = Unpacker::new_overlay_layer(&d, Policy::default()).unwrap();
        apply_one(&mut u, i, t);
        u.finish().unwrap();
        dirs.push(d);
    }
    // The update layer records, it does not delete: a 0:0 device per
    // whiteout, the opaque xattr on the emptied directory.
    for wh in ["etc/old", "opt/sub", "srv"] {
        let m = fs::symlink_metadata(dirs[1].join(wh)).unwrap();
        assert!(m.file_type().is_char_device(), "{wh}: {:?}", m.file_type());
        assert_eq!(m.rdev(), 0, "{wh}");
    }
    let doc = dirs[1].join("usr/share/doc");
    let mut v = [0u8; 8];
    let n = rustix::fs::getxattr(&doc, "trusted.overlay.opaque", &mut v[..]).unwrap();
    assert_eq!(&v[..n], b"y");
    assert!(!dirs[1].join("usr/share/doc/.wh..wh..opq").exists());
    // the lower layers are untouched by the upper one's whiteouts
    assert!(dirs[0].join("etc/old").is_file() && dirs[0].join("opt/sub/x").is_file());
    assert!(dirs[0].join("srv/s").is_file());

    let merged = tmp.path().join("merged");
    fs::create_dir(&merged).unwrap();
    let lowers: Vec<String> = dirs.iter().rev().map(|d| d.display().to_string()).collect();
    mount(&format!("lowerdir={}", lowers.join(":")), &merged);
    let guard = Mounted(merged.clone());
    let (want, got) = (facts(&copy), facts(&merged));
    drop(guard);
    assert_eq!(got, want);
    for gone in [
        "opt/y",
        "opt/sub",
        "srv",
        "usr/share/doc/a",
        "usr/share/doc/c",
    ] {
        assert!(!want.contains_key(Path::new(gone)), "{gone}");
    }
    assert!(
        want.contains_key(Path::new("etc/old")) && want.contains_key(Path::new("usr/share/doc/d"))
    );
}

/// A layout holding v1 (base, kube-1.0) and v2 (base, kube-1.1).
fn two_images(dir: &Path) -> (ImageSource, ImageSource, Vec<u8>) {
    let layout = image::open_or_create(dir);
    let base = tar_with_dirs(&["etc/", "usr/"], &[("etc/os-release", b"debian\n")]);
    let k1 = tar_with_dirs(&["usr/", "usr/bin/"], &[("usr/bin/kubelet", b"1.0\n")]);
    let k2 = tar_with_dirs(&["usr/", "usr/bin/"], &[("usr/bin/kubelet", b"1.1\n")]);
    let b = image::gzip_layer(&layout, &base);
    let l1 = image::gzip_layer(&layout, &k1);
    let l2 = image::gzip_layer(&layout, &k2);
    image::write_manifest_image(&layout, "v1", &Platform::host(), &[b.clone(), l1]);
    image::write_manifest_image(&layout, "v2", &Platform::host(), &[b, l2]);
    let src = |t: &str| ImageSource::from_str(&format!("oci:{}:{t}", dir.display())).unwrap();
    (src("v1"), src("v2"), k2)
}

/// `src` resolved for this host and fetched into `store` (also the
/// differential test's).
pub(crate) fn fetched(store: &Store, src: &ImageSource, scratch: &Path) -> SelectedImage {
    let source = Source::open_paced(
        src,
        &Default::default(),
        scratch,
        Arc::new(Pacing::default()),
    )
    .unwrap();
    let top = source.resolve().unwrap();
    let image = source.select(&top, &Platform::host()).unwrap();
    store.fetch_image(&source, &image).unwrap();
    image
}

#[test]
fn the_layer_store_unpacks_each_layer_once() {
    let tmp = tempfile::tempdir().unwrap();
    let root = Root::new(tmp.path().join("root"));
    let (v1, v2, k2) = two_images(&tmp.path().join("layout"));
    let store = Store::open(&root.store()).unwrap();

    let img1 = fetched(&store, &v1, tmp.path());
    let e1 = layers::ensure(&root, &store, &img1, &Policy::default()).unwrap();
    assert_eq!((e1.unpacked, e1.reused), (2, 0));
    let base_ino = fs::metadata(e1.dirs[0].join("etc/os-release"))
        .unwrap()
        .ino();

    let img2 = fetched(&store, &v2, tmp.path());
    let e2 = layers::ensure(&root, &store, &img2, &Policy::default()).unwrap();
    assert_eq!((e2.unpacked, e2.reused), (1, 1));
    assert_eq!(e2.bytes_unpacked, k2.len() as u64, "only the changed layer");
    assert_eq!(e2.dirs[0], e1.dirs[0]);
    assert_eq!(
        fs::metadata(e2.dirs[0].join("etc/os-release"))
            .unwrap()
            .ino(),
        base_ino,
        "the shared layer was not unpacked again"
    );
    assert_eq!(
        fs::read(e2.dirs[1].join("usr/bin/kubelet")).unwrap(),
        b"1.1\n"
    );
    for (_, _, diff_id) in &img2.layers {
        assert_eq!(
            layers::layer_dir(&root, diff_id),
            root.layers_dir().join(diff_id.hex())
        );
    }
    let names: Vec<_> = fs::read_dir(root.layers_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        // each layer's record (`<diff_id>.files`, verify-layers) sits beside it
        .filter(|n| !n.ends_with(".files"))
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
}

#[test]
fn a_refused_layer_leaves_no_layer_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let root = Root::new(tmp.path().join("root"));
    let dir = tmp.path().join("layout");
    let layout = image::open_or_create(&dir);
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o4755);
    h.set_size(2);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1);
    b.append_data(&mut h, "usr/bin/evil", &b"#!"[..]).unwrap();
    let bad = b.into_inner().unwrap();
    let good = tar_with_dirs(&["etc/"], &[("etc/ok", b"ok\n")]);
    let g = image::gzip_layer(&layout, &good);
    let e = image::gzip_layer(&layout, &bad);
    image::write_manifest_image(&layout, "bad", &Platform::host(), &[g, e.clone()]);
    let store = Store::open(&root.store()).unwrap();
    let src = ImageSource::from_str(&format!("oci:{}:bad", dir.display())).unwrap();
    let img = fetched(&store, &src, tmp.path());

    let err = layers::ensure(&root, &store, &img, &Policy::default()).unwrap_err();
    let text = kubeslot_image::error_chain(&err);
    assert!(text.contains(&e.desc.digest.to_string()), "{text}");
    assert!(text.contains("usr/bin/evil"), "{text}");
    match &err {
        layers::LayerError::Unpack { error, .. } => assert_eq!(error.rule, Rule::Setuid),
        other => panic!("{other:?}"),
    }
    let names: Vec<_> = fs::read_dir(root.layers_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        // each layer's record (`<diff_id>.files`, verify-layers) sits beside it
        .filter(|n| !n.ends_with(".files"))
        .collect();
    // the good layer stays (complete, named by its diff_id); nothing of the bad one
    assert_eq!(names, vec![img.layers[0].2.hex()]);
}

#[test]
fn an_overlay_slot_writes_only_its_upper_and_clean_drops_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = Root::new(tmp.path().join("root"));
    let (v1, _, _) = two_images(&tmp.path().join("layout"));
    let store = Store::open(&root.store()).unwrap();
    let img = fetched(&store, &v1, tmp.path());
    let e = layers::ensure(&root, &store, &img, &Policy::default()).unwrap();
    let lowers_before: Vec<_> = e.dirs.iter().map(|d| facts(d)).collect();

    // mounts the unit's overlay for real, records the calls
    let sd = FakeSystemd::new(&root);
    let slot = Slot::Kube1;
    overlay::install(&root, &sd, slot, Some(img.image_digest()), &e.dirs).unwrap();
    let unit = root.mount_unit("kube1");
    assert_eq!(
        sd.calls().as_slice(),
        ["daemon-reload".to_string(), format!("start {unit}")]
    );
    let text = fs::read_to_string(root.mount_unit_file("kube1")).unwrap();
    let lowers = format!("lowerdir={}:{}", e.dirs[1].display(), e.dirs[0].display());
    assert!(text.contains(&lowers), "top layer first:\n{text}");
    assert!(
        text.contains(&format!("Where={}", root.machine_tree("kube1").display())),
        "{text}"
    );

    // The machine writes into its tree: the upper holds it, no lower does.
    let tree = root.machine_tree("kube1");
    assert_eq!(fs::read(tree.join("usr/bin/kubelet")).unwrap(), b"1.0\n");
    fs::write(tree.join("etc/written-by-node"), b"node\n").unwrap();
    fs::write(tree.join("usr/bin/kubelet"), b"patched\n").unwrap();
    assert!(overlay::upper_dir(&root, slot)
        .join("etc/written-by-node")
        .is_file());
    let lowers_after: Vec<_> = e.dirs.iter().map(|d| facts(d)).collect();
    assert_eq!(lowers_after, lowers_before, "a lower layer was written");

    overlay::clean(&root, &sd, slot).unwrap();
    assert!(!tree.join("etc/written-by-node").exists());
    assert_eq!(fs::read(tree.join("usr/bin/kubelet")).unwrap(), b"1.0\n");

    // GC keeps what a slot's unit mounts: nothing of v1 goes, a stray dir does.
    fs::create_dir_all(root.layers_dir().join("0123")).unwrap();
    let removed = layers::sweep(&root).unwrap();
    assert_eq!(removed, vec![root.layers_dir().join("0123")]);
    for d in &e.dirs {
        assert!(d.is_dir(), "{}", d.display());
    }

    // Back to a copied tree: the mount and its unit go, the tree is a plain dir.
    overlay::remove(&root, &sd, slot).unwrap();
    assert!(!root.mount_unit_file("kube1").exists());
    assert!(!root.slot_overlay_dir("kube1").exists());
    assert_eq!(fs::read_dir(&tree).unwrap().count(), 0);
    // No slot mounts them any more: GC takes them.
    let mut all = e.dirs.clone();
    all.sort();
    assert_eq!(layers::sweep(&root).unwrap(), all);
}

#[test]
fn too_many_layers_for_one_mount_are_refused_naming_the_limit() {
    let root = Root::new("/var/tmp/r");
    let dirs: Vec<PathBuf> = (0..60)
        .map(|i| layers::layer_dir(&root, &Digest::of(format!("{i}").as_bytes())))
        .collect();
    let err = overlay::mount_options(&root, Slot::Kube2, &dirs).unwrap_err();
    assert!(
        matches!(err, OverlayError::OptionsTooLong { layers: 60, .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("kube2") && text.contains("4095") && text.contains("slots.mode"),
        "{text}"
    );
    // 35 layers fit (about 44 under the host's /var/lib/kubeslot).
    overlay::mount_options(&root, Slot::Kube2, &dirs[..35]).unwrap();
}

#[test]
fn the_overlay_probe_passes_on_this_host_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let root = Root::new(tmp.path());
    overlay::probe(&root).unwrap();
    assert_eq!(fs::read_dir(root.layers_dir()).unwrap().count(), 0);
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(&tmp.path().display().to_string()),
        "{mounts}"
    );
}

#[test]
fn the_overlay_slots_check_warns_on_fallback_and_fails_an_explicit_overlay() {
    use kubeslot_activator::config::SlotMode;
    use kubeslot_activator::gate::preflight::{overlay_slots, Status};
    let broken: Result<(), String> = Err("mount -t overlay: No such device".into());
    let f = overlay_slots(None, Some(&broken));
    assert_eq!(f.status, Status::Warn);
    assert!(f.seen.contains("No such device") && f.hint.unwrap().contains("copy"));
    let f = overlay_slots(Some(SlotMode::Overlay), Some(&broken));
    assert_eq!(f.status, Status::Fail);
    assert_eq!(overlay_slots(None, Some(&Ok(()))).status, Status::Pass);
    assert_eq!(
        overlay_slots(Some(SlotMode::Copy), None).status,
        Status::Pass
    );
}

/// One tar entry: path, kind ('d' dir, 'f' empty file), mode, xattrs.
type Entry<'a> = (&'a str, char, u32, &'a [(&'a str, &'a [u8])]);

/// A tar of `entries`.
fn tar_entries(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, mode, xattrs) in entries {
        if !xattrs.is_empty() {
            let recs: Vec<(String, &[u8])> = xattrs
                .iter()
                .map(|(k, v)| (format!("SCHILY.xattr.{k}"), *v))
                .collect();
            b.append_pax_extensions(recs.iter().map(|(k, v)| (k.as_str(), *v)))
                .unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(if *kind == 'd' {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        h.set_path(path).unwrap();
        h.set_mode(*mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_size(0);
        h.set_mtime(1);
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }
    b.into_inner().unwrap()
}

#[test]
fn a_whiteout_and_entries_under_its_path_in_one_layer_make_a_fresh_directory() {
    // image-spec layer.md: `.wh.D` hides the lower D only; `D/new` of the
    // same layer (no `D/` entry) lives on in a fresh D.
    let tmp = tempfile::tempdir().unwrap();
    let base = tar_entries(&[("d/", 'd', 0o700, &[]), ("d/old", 'f', 0o644, &[])]);
    let top = tar_entries(&[(".wh.d", 'f', 0o644, &[]), ("d/new", 'f', 0o644, &[])]);
    let mut dirs = Vec::new();
    for (i, t) in [&base, &top].into_iter().enumerate() {
        let d = tmp.path().join(format!("l{i}"));
        fs::create_dir(&d).unwrap();
        let mut u = Unpacker::new_overlay_layer(&d, Policy::default()).unwrap();
        apply_one(&mut u, i, t);
        u.finish().unwrap();
        dirs.push(d);
    }
    let d = dirs[1].join("d");
    assert!(d.is_dir(), "the whiteout device became a directory");
    let mut v = [0u8; 8];
    let n = rustix::fs::getxattr(&d, "trusted.overlay.opaque", &mut v[..]).unwrap();
    assert_eq!(&v[..n], b"y", "the fresh d hides the lower one");
    let merged = tmp.path().join("merged");
    fs::create_dir(&merged).unwrap();
    mount(
        &format!("lowerdir={}:{}", dirs[1].display(), dirs[0].display()),
        &merged,
    );
    let guard = Mounted(merged.clone());
    let got = facts(&merged);
    drop(guard);
    let names: Vec<_> = got.keys().map(|p| p.display().to_string()).collect();
    assert_eq!(names, ["d", "d/new"]);
    assert!(got[Path::new("d")].starts_with("dir 40755 0:0"), "{got:?}");
}

#[test]
fn a_directory_entry_over_a_directory_replaces_its_user_xattrs() {
    // "the existing path's attributes MUST be replaced by those of the entry"
    let tmp = tempfile::tempdir().unwrap();
    let base = tar_entries(&[("d/", 'd', 0o755, &[("user.old", b"1"), ("user.kept", b"1")])]);
    let top = tar_entries(&[("d/", 'd', 0o750, &[("user.kept", b"2")])]);
    let copy = tmp.path().join("copy");
    fs::create_dir(&copy).unwrap();
    let mut u = Unpacker::new(&copy, Policy::default()).unwrap();
    apply_one(&mut u, 0, &base);
    apply_one(&mut u, 1, &top);
    u.finish().unwrap();
    let d = copy.join("d");
    let mut names = [0u8; 256];
    let n = rustix::fs::listxattr(&d, &mut names[..]).unwrap();
    let names: Vec<_> = names[..n]
        .split(|b| *b == 0)
        .filter(|s| s.starts_with(b"user."))
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    assert_eq!(names, ["user.kept"]);
    let mut v = [0u8; 8];
    let k = rustix::fs::getxattr(&d, "user.kept", &mut v[..]).unwrap();
    assert_eq!(&v[..k], b"2");
    assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o750);
}

#[test]
fn the_metadata_layer_keeps_what_a_layer_does_not_list_and_is_reused() {
    // A layer adding tmp/.keep without `tmp/` holds tmp as 0755 root:root;
    // overlayfs alone would show that over the base's 1777. The image's
    // metadata layer holds tmp (and the root of the `./` entry) as the
    // spec has them, and nothing else.
    use kubeslot_activator::slots::overlay::metalayer;
    let tmp = tempfile::tempdir().unwrap();
    let root = Root::new(tmp.path().join("root"));
    let dir = tmp.path().join("layout");
    let layout = image::open_or_create(&dir);
    let base = tar_entries(&[
        ("tmp/", 'd', 0o1777, &[]),
        ("etc/", 'd', 0o755, &[]),
        ("etc/os-release", 'f', 0o644, &[]),
    ]);
    let top = tar_entries(&[("./", 'd', 0o750, &[]), ("tmp/.keep", 'f', 0o644, &[])]);
    let blobs = [
        image::gzip_layer(&layout, &base),
        image::gzip_layer(&layout, &top),
    ];
    image::write_manifest_image(&layout, "img", &Platform::host(), &blobs);
    let store = Store::open(&root.store()).unwrap();
    let src = ImageSource::from_str(&format!("oci:{}:img", dir.display())).unwrap();
    let img = fetched(&store, &src, tmp.path());

    let e = metalayer::ensure_slot_lowers(&root, &store, &img, &Policy::default()).unwrap();
    assert_eq!(e.dirs.len(), 3);
    let meta = e.dirs[2].clone();
    assert_eq!(meta, metalayer::meta_dir(&root, &img));
    assert!(meta
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("meta-"));
    let held: Vec<_> = facts(&meta).into_keys().collect();
    assert_eq!(
        held,
        [PathBuf::from("tmp")],
        "only what the layers get wrong"
    );
    assert!(kubeslot_activator::slots::record::record_path(&meta).is_file());

    let sd = FakeSystemd::new(&root);
    overlay::install(&root, &sd, Slot::Kube1, Some(img.image_digest()), &e.dirs).unwrap();
    let tree = root.machine_tree("kube1");
    assert_eq!(
        fs::metadata(tree.join("tmp")).unwrap().mode() & 0o7777,
        0o1777
    );
    assert!(tree.join("tmp/.keep").is_file() && tree.join("etc/os-release").is_file());
    assert_eq!(
        fs::metadata(&tree).unwrap().mode() & 0o7777,
        0o750,
        "the ./ entry"
    );
    overlay::clean(&root, &sd, Slot::Kube1).unwrap();
    assert_eq!(
        fs::metadata(&tree).unwrap().mode() & 0o7777,
        0o750,
        "after clean"
    );
    overlay::remove(&root, &sd, Slot::Kube1).unwrap();

    let ino = fs::metadata(&meta).unwrap().ino();
    let again = metalayer::ensure_slot_lowers(&root, &store, &img, &Policy::default()).unwrap();
    assert_eq!(again.dirs, e.dirs);
    assert_eq!(
        fs::metadata(&meta).unwrap().ino(),
        ino,
        "reused, not made again"
    );

    // Changed in the store (no slot mounts it): built again, as recorded.
    fs::set_permissions(meta.join("tmp"), fs::Permissions::from_mode(0o777)).unwrap();
    let third = metalayer::ensure_slot_lowers(&root, &store, &img, &Policy::default()).unwrap();
    assert_eq!(third.dirs, e.dirs);
    assert_eq!(
        fs::metadata(meta.join("tmp")).unwrap().mode() & 0o7777,
        0o1777,
        "the changed metadata layer was reused"
    );
    // Made under another unpack policy: built again under this one.
    let other = Policy {
        allow_fifos_and_sockets: true,
        ..Policy::default()
    };
    metalayer::ensure_slot_lowers(&root, &store, &img, &other).unwrap();
    let record = kubeslot_activator::slots::record::load(
        &kubeslot_activator::slots::record::record_path(&meta),
    )
    .unwrap();
    assert_eq!(
        record.policy,
        Some(metalayer::policy_hash(&other)),
        "reused under another policy"
    );
}
