//! Black-box tests of the safe layer unpacker: the hostile corpus in
//! `testdata/layers/` (each scenario refused with its rule, a sentinel
//! directory beside the target unchanged), OCI semantics (whiteouts, opaque
//! directories, hardlinks, symlinks, modes, owners, times), and a
//! differential check against `umoci unpack` on a real Debian rootfs.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use kubeslot_image::digest::Digest;
use kubeslot_image::oci::Compression;
use kubeslot_image::oci::Platform;
use kubeslot_image::unpack::{Layer, Policy, Rule, UnpackError, Unpacker};
use kubeslot_test_support::image::{self, LayerBlob};
use kubeslot_test_support::{require_tool, workspace_root};

// ---------------------------------------------------------------------------
// helpers

/// One line per path under `root` (relative, sorted): type, mode, owner,
/// size, mtime, symlink target, content digest and inode group.
fn manifest(root: &Path, skip: Option<&Path>) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if Some(p.as_path()) == skip {
                continue;
            }
            let m = fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            let extra = if ft.is_symlink() {
                format!("-> {}", fs::read_link(&p).unwrap().display())
            } else if ft.is_file() {
                format!("{} {}", m.len(), Digest::of(&fs::read(&p).unwrap()))
            } else {
                String::new()
            };
            if ft.is_dir() {
                stack.push(p.clone());
            }
            out.insert(
                p.strip_prefix(root).unwrap().to_path_buf(),
                format!(
                    "{:o} {}:{} mtime={}.{} {}",
                    m.mode(),
                    m.uid(),
                    m.gid(),
                    m.mtime(),
                    m.mtime_nsec(),
                    extra
                ),
            );
        }
    }
    out
}

/// A temp dir on the disk that holds `target/` (not a possibly tmpfs /tmp:
/// user xattrs and file capabilities must be storable).
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// A temp dir with an empty `target/` and, beside it, a populated
/// `sentinel/` and a symlink `into-sentinel -> sentinel`.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = scratch();
        let s = dir.path().join("sentinel");
        fs::create_dir_all(s.join("sub")).unwrap();
        fs::write(s.join("keep.txt"), b"keep me\n").unwrap();
        fs::write(s.join("sub/inner.txt"), b"inner\n").unwrap();
        std::os::unix::fs::symlink("keep.txt", s.join("link")).unwrap();
        // beside the target, a symlink pointing into the sentinel
        std::os::unix::fs::symlink("sentinel", dir.path().join("into-sentinel")).unwrap();
        fs::create_dir(dir.path().join("target")).unwrap();
        Sandbox { dir }
    }
    fn target(&self) -> PathBuf {
        self.dir.path().join("target")
    }
    /// Everything in the sandbox except the target's contents.
    fn outside(&self) -> BTreeMap<PathBuf, String> {
        let mut m = manifest(self.dir.path(), Some(&self.target()));
        // The target itself exists; its own metadata may change (a layer
        // may carry `./`), its identity may not.
        m.insert(
            PathBuf::from("target"),
            format!("ino={}", fs::symlink_metadata(self.target()).unwrap().ino()),
        );
        m
    }
}

fn decompress(bytes: &[u8], c: Compression) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let ok = match c {
        Compression::None => {
            out = bytes.to_vec();
            true
        }
        Compression::Gzip => flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .is_ok(),
        Compression::Zstd => zstd::stream::read::Decoder::new(bytes)
            .and_then(|mut d| d.read_to_end(&mut out))
            .is_ok(),
    };
    ok.then_some(out)
}

fn layer_of(index: usize, bytes: &[u8], c: Compression, diff_id: Option<Digest>) -> Layer<&[u8]> {
    let diff_id = diff_id.unwrap_or_else(|| {
        // A corrupt stream has no diff_id; any value will do, it fails first.
        Digest::of(&decompress(bytes, c).unwrap_or_default())
    });
    Layer {
        index,
        digest: Digest::of(bytes),
        diff_id,
        compression: c,
        reader: bytes,
    }
}

/// Unpacks `layers` into `target` and returns the first error.
fn unpack_all(
    target: &Path,
    policy: Policy,
    layers: &[(Vec<u8>, Compression)],
    diff_ids: Option<&[Digest]>,
) -> Result<(), UnpackError> {
    let mut u = Unpacker::new(target, policy)?;
    for (i, (bytes, c)) in layers.iter().enumerate() {
        u.apply(layer_of(i, bytes, *c, diff_ids.map(|d| d[i])))?;
    }
    u.finish().map(|_| ())
}

fn tar_layer(build: impl FnOnce(&mut TarW)) -> (Vec<u8>, Compression) {
    let mut t = TarW(tar::Builder::new(Vec::new()));
    build(&mut t);
    (t.0.into_inner().unwrap(), Compression::None)
}

/// A small tar writer for positive tests.
struct TarW(tar::Builder<Vec<u8>>);

impl TarW {
    fn header(&self, ty: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(ty);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(1_600_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h
    }
    fn dir(&mut self, p: &str, mode: u32) -> &mut Self {
        let mut h = self.header(tar::EntryType::Directory, mode, 0);
        self.0.append_data(&mut h, p, &[][..]).unwrap();
        self
    }
    fn file(&mut self, p: &str, mode: u32, data: &[u8]) -> &mut Self {
        let mut h = self.header(tar::EntryType::Regular, mode, data.len() as u64);
        self.0.append_data(&mut h, p, data).unwrap();
        self
    }
    fn file_owned(&mut self, p: &str, mode: u32, uid: u64, gid: u64, mtime: u64) -> &mut Self {
        let mut h = self.header(tar::EntryType::Regular, mode, 2);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_mtime(mtime);
        self.0.append_data(&mut h, p, &b"hi"[..]).unwrap();
        self
    }
    fn symlink(&mut self, p: &str, target: &str) -> &mut Self {
        let mut h = self.header(tar::EntryType::Symlink, 0o777, 0);
        self.0.append_link(&mut h, p, target).unwrap();
        self
    }
    fn hardlink(&mut self, p: &str, target: &str) -> &mut Self {
        let mut h = self.header(tar::EntryType::Link, 0o644, 0);
        self.0.append_link(&mut h, p, target).unwrap();
        self
    }
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap()
}

// ---------------------------------------------------------------------------
// the hostile corpus

fn compression_of(name: &str) -> Compression {
    if name.ends_with(".tar.gz") {
        Compression::Gzip
    } else if name.ends_with(".tar.zst") {
        Compression::Zstd
    } else {
        assert!(name.ends_with(".tar"), "{name}: unknown layer file");
        Compression::None
    }
}

fn policy_of(dir: &Path) -> Policy {
    let mut p = Policy::default();
    let Ok(text) = fs::read_to_string(dir.join("policy")) else {
        return p;
    };
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (k, v) = line.split_once('=').expect("key = value");
        let (k, v) = (k.trim(), v.trim());
        let n = || v.parse::<u64>().unwrap();
        match k {
            "max_layer_bytes" => p.limits.max_layer_bytes = n(),
            "max_total_bytes" => p.limits.max_total_bytes = n(),
            "max_entries" => p.limits.max_entries = n(),
            "max_path_bytes" => p.limits.max_path_bytes = n() as usize,
            "max_depth" => p.limits.max_depth = n() as usize,
            "allow_fifos_and_sockets" => p.allow_fifos_and_sockets = v == "true",
            _ => panic!("{}: unknown policy key {k}", dir.display()),
        }
    }
    p
}

/// `PATH TYPE MODE UID:GID [TARGET|TEXT]` lines of a tree, as `tree` files
/// write them.
fn tree_lines(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (rel, _) in manifest(root, None) {
        let p = root.join(&rel);
        let m = fs::symlink_metadata(&p).unwrap();
        let ft = m.file_type();
        let (ty, extra) = if ft.is_symlink() {
            (
                "symlink",
                format!(" {}", fs::read_link(&p).unwrap().display()),
            )
        } else if ft.is_dir() {
            ("dir", String::new())
        } else if ft.is_file() {
            ("file", format!(" {}", read(&p).trim_end_matches('\n')))
        } else if ft.is_fifo() {
            ("fifo", String::new())
        } else if ft.is_socket() {
            ("socket", String::new())
        } else {
            ("other", String::new())
        };
        out.push(format!(
            "{} {ty} {:04o} {}:{}{extra}",
            rel.display(),
            m.mode() & 0o7777,
            m.uid(),
            m.gid()
        ));
    }
    out.sort();
    out
}

#[test]
fn hostile_corpus_is_refused_with_its_rule_and_nothing_outside_changes() {
    let corpus = workspace_root().join("testdata/layers");
    let mut dirs: Vec<PathBuf> = fs::read_dir(&corpus)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 30, "the corpus has {} scenarios", dirs.len());
    let mut failures = Vec::new();
    let mut rules_seen = std::collections::BTreeSet::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let expect = read(&dir.join("expect"));
        let field = |k: &str| {
            expect
                .lines()
                .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
        };
        let rule = field("rule:").expect("expect has a rule");
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("layer-")
            })
            .collect();
        files.sort();
        let layers: Vec<(Vec<u8>, Compression)> = files
            .iter()
            .map(|p| {
                (
                    fs::read(p).unwrap(),
                    compression_of(&p.file_name().unwrap().to_string_lossy()),
                )
            })
            .collect();
        let diff_ids: Option<Vec<Digest>> = fs::read_to_string(dir.join("diff_ids"))
            .ok()
            .map(|t| t.lines().map(|l| l.parse().unwrap()).collect());

        let sb = Sandbox::new();
        let before = sb.outside();
        let result = unpack_all(&sb.target(), policy_of(dir), &layers, diff_ids.as_deref());
        let after = sb.outside();
        if before != after {
            failures.push(format!(
                "{name}: outside the target changed:\nbefore {before:#?}\nafter {after:#?}"
            ));
        }
        match (rule.as_str(), result) {
            ("ok", Ok(())) => {
                if let Ok(want) = fs::read_to_string(dir.join("tree")) {
                    let got = tree_lines(&sb.target());
                    let want: Vec<String> = want.lines().map(str::to_string).collect();
                    if got != want {
                        failures.push(format!("{name}: tree {got:#?}, expected {want:#?}"));
                    }
                }
            }
            ("ok", Err(e)) => failures.push(format!("{name}: expected success, got {e}")),
            (want, Ok(())) => failures.push(format!("{name}: expected rule {want}, unpacked")),
            (want, Err(e)) => {
                rules_seen.insert(e.rule);
                let layer = field("layer:").map(|l| l.parse::<usize>().unwrap());
                let msg = e.to_string();
                if e.rule.to_string() != want {
                    failures.push(format!("{name}: expected rule {want}, got {msg}"));
                } else if e.layer.as_ref().map(|l| l.0) != layer {
                    failures.push(format!("{name}: expected layer {layer:?}, got {msg}"));
                } else if !msg.contains(&format!("rule {want}: "))
                    || !msg.starts_with(&format!("layer {} (sha256:", layer.unwrap()))
                {
                    failures.push(format!(
                        "{name}: message does not name layer and rule: {msg}"
                    ));
                }
                // Entry-level rules name the entry too.
                let stream_level = matches!(
                    e.rule,
                    Rule::DiffIdMismatch
                        | Rule::MalformedArchive
                        | Rule::LayerTooLarge
                        | Rule::TotalTooLarge
                );
                if !stream_level && e.entry.is_none() {
                    failures.push(format!("{name}: no entry named: {msg}"));
                }
                if !stream_level && !msg.contains(": entry ") {
                    failures.push(format!("{name}: entry missing from message: {msg}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        rules_seen.len() >= 20,
        "only {} rules exercised",
        rules_seen.len()
    );
}

#[test]
fn the_sentinel_check_sees_every_kind_of_change() {
    // The corpus relies on this comparison: show it notices a write through
    // the outside symlink, a new file, a removal, a chmod and a retarget.
    let changes: [fn(&Path); 5] = [
        |d| fs::write(d.join("into-sentinel/keep.txt"), b"keep me!").unwrap(),
        |d| fs::write(d.join("sentinel/sub/new"), b"").unwrap(),
        |d| fs::remove_file(d.join("sentinel/sub/inner.txt")).unwrap(),
        |d| {
            fs::set_permissions(
                d.join("sentinel/keep.txt"),
                fs::Permissions::from_mode(0o600),
            )
            .unwrap()
        },
        |d| {
            fs::remove_file(d.join("sentinel/link")).unwrap();
            std::os::unix::fs::symlink("sub", d.join("sentinel/link")).unwrap();
        },
    ];
    for (i, change) in changes.iter().enumerate() {
        let sb = Sandbox::new();
        let before = sb.outside();
        fs::write(sb.target().join("inside"), b"changes inside do not count").unwrap();
        assert_eq!(before, sb.outside());
        change(sb.dir.path());
        assert_ne!(before, sb.outside(), "change {i} went unnoticed");
    }
}

#[test]
fn corpus_generator_is_deterministic_and_committed() {
    // Regenerating into a copy must give the committed bytes: the corpus is
    // what the script says, not hand-edited.
    require_tool("python3", "python3");
    require_tool("zstd", "zstd");
    let src = workspace_root().join("testdata/layers");
    let tmp = scratch();
    let copy = tmp.path().join("layers");
    fs::create_dir(&copy).unwrap();
    fs::copy(src.join("gen.py"), copy.join("gen.py")).unwrap();
    let st = Command::new("python3")
        .arg(copy.join("gen.py"))
        .status()
        .unwrap();
    assert!(st.success());
    // Compressed bytes depend on the zlib and zstd versions; what they
    // decompress to must not.
    let content = |root: &Path| -> BTreeMap<PathBuf, Digest> {
        manifest(root, None)
            .into_keys()
            .filter(|p| !p.to_string_lossy().contains("__pycache__"))
            .filter(|p| root.join(p).is_file())
            .map(|p| {
                let bytes = fs::read(root.join(&p)).unwrap();
                let name = p.to_string_lossy();
                let plain = if name.ends_with(".tar.gz") {
                    decompress(&bytes, Compression::Gzip)
                } else if name.ends_with(".tar.zst") {
                    let mut d = zstd::stream::read::Decoder::new(&bytes[..]).unwrap();
                    d.window_log_max(31).unwrap();
                    let mut out = Vec::new();
                    d.read_to_end(&mut out).ok().map(|_| out)
                } else {
                    None
                };
                (p, Digest::of(&plain.unwrap_or(bytes)))
            })
            .collect()
    };
    assert_eq!(
        content(&src),
        content(&copy),
        "testdata/layers differs from what gen.py writes"
    );
}

// ---------------------------------------------------------------------------
// OCI semantics

#[test]
fn whiteouts_and_opaque_directories_follow_the_oci_spec() {
    let sb = Sandbox::new();
    let t = sb.target();
    let l0 = tar_layer(|w| {
        w.dir("a", 0o755)
            .file("a/gone", 0o644, b"1")
            .file("a/stays", 0o644, b"1")
            .dir("a/sub", 0o755)
            .file("a/sub/deep", 0o644, b"1")
            .dir("opq", 0o755)
            .file("opq/lower", 0o644, b"1")
            .dir("opq/lowerdir", 0o755)
            .file("opq/lowerdir/x", 0o644, b"1")
            .dir("opq/merged", 0o755)
            .file("opq/merged/lower", 0o644, b"1")
            .file("whole", 0o644, b"1")
            .dir("samelayer", 0o755)
            .file("samelayer/lower", 0o644, b"1");
    });
    let l1 = tar_layer(|w| {
        w.file("a/.wh.gone", 0o644, b"")
            .file("a/.wh.sub", 0o644, b"")
            .file(".wh.whole", 0o644, b"")
            .file(".wh.never-existed", 0o644, b"")
            // entries before the opaque marker in the same layer survive
            .file("opq/early", 0o644, b"2")
            .dir("opq/merged", 0o755)
            .file("opq/merged/new", 0o644, b"2")
            .file("opq/.wh..wh..opq", 0o644, b"")
            .file("opq/late", 0o644, b"2")
            // a whiteout of a path this layer wrote hides only lower content
            .file("samelayer/new", 0o644, b"2")
            .file(".wh.samelayer", 0o644, b"");
    });
    let l2 = tar_layer(|w| {
        w.file("a/gone", 0o644, b"3");
    });
    unpack_all(&t, Policy::default(), &[l0, l1, l2], None).unwrap();
    let lines = tree_lines(&t);
    let names: Vec<&str> = lines.iter().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(
        names,
        [
            "a",
            "a/gone",
            "a/stays",
            "opq",
            "opq/early",
            "opq/late",
            "opq/merged",
            "opq/merged/new",
            "samelayer",
            "samelayer/new",
        ],
        "{lines:#?}"
    );
    assert_eq!(read(&t.join("a/gone")), "3");
}

#[test]
fn hardlinks_symlinks_modes_owners_and_times() {
    let sb = Sandbox::new();
    let t = sb.target();
    let l0 = tar_layer(|w| {
        w.dir("./", 0o755)
            .dir("d", 0o750)
            .file_owned("d/f", 0o640, 1234, 5678, 1_500_000_000)
            .hardlink("d/h", "d/f")
            .symlink("abs", "/etc/passwd")
            .symlink("rel", "../sentinel/keep.txt")
            .symlink("d/up", "..")
            .file("sticky-dir-file", 0o1755, b"s")
            .dir("e", 0o755)
            .file("e/child", 0o644, b"c");
    });
    // a hardlink to a lower layer's file; a file replacing a hardlinked name
    // leaves the other name alone
    let l1 = tar_layer(|w| {
        w.hardlink("h2", "d/f").file("d/h", 0o600, b"new");
    });
    unpack_all(&t, Policy::default(), &[l0, l1], None).unwrap();
    let f = fs::symlink_metadata(t.join("d/f")).unwrap();
    assert_eq!((f.uid(), f.gid(), f.mode() & 0o7777), (1234, 5678, 0o640));
    assert_eq!(f.mtime(), 1_500_000_000);
    let h2 = fs::symlink_metadata(t.join("h2")).unwrap();
    assert_eq!(h2.ino(), f.ino());
    assert_eq!(f.nlink(), 2);
    assert_eq!(read(&t.join("d/h")), "new");
    assert_eq!(read(&t.join("d/f")), "hi");
    assert_eq!(
        fs::read_link(t.join("abs")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        fs::read_link(t.join("rel")).unwrap(),
        Path::new("../sentinel/keep.txt")
    );
    assert!(fs::symlink_metadata(t.join("rel"))
        .unwrap()
        .file_type()
        .is_symlink());
    let d = fs::symlink_metadata(t.join("d")).unwrap();
    assert_eq!(d.mode() & 0o7777, 0o750);
    // directory times are set after their children were written, and a
    // later layer that changes a directory without listing it (layer 1 and
    // `d`, the root) leaves the directory's time as the image said
    for dir in ["e", "d", ""] {
        let m = fs::symlink_metadata(t.join(dir)).unwrap();
        assert_eq!(m.mtime(), 1_600_000_000, "mtime of {dir:?}");
    }
    assert_eq!(
        fs::symlink_metadata(t.join("sticky-dir-file"))
            .unwrap()
            .mode()
            & 0o7777,
        0o1755
    );
}

/// `hash_files`: each regular file's size and sha256 as written, keyed by
/// its inode: one entry for hard links, the replacement's for a replaced
/// name, nothing for a skeleton's empty files.
#[test]
fn the_unpacker_hashes_each_file_it_writes_by_inode() {
    let sb = Sandbox::new();
    let t = sb.target();
    let l0 = tar_layer(|w| {
        w.dir("./", 0o755)
            .file("a", 0o644, b"first")
            .hardlink("a2", "a")
            .file("b", 0o600, b"")
            .file("gone", 0o644, b"whited out");
    });
    let l1 = tar_layer(|w| {
        w.file("a2", 0o644, b"replaced")
            .file(".wh.gone", 0o644, b"");
    });
    let mut u = Unpacker::new(&t, Policy::default()).unwrap();
    u.hash_files();
    for (i, (bytes, c)) in [l0, l1].iter().enumerate() {
        u.apply(layer_of(i, bytes, *c, None)).unwrap();
    }
    let hashes = u.take_file_hashes();
    u.finish().unwrap();
    let ino = |p: &str| {
        let m = fs::symlink_metadata(t.join(p)).unwrap();
        (m.dev(), m.ino())
    };
    for (p, data) in [("a", &b"first"[..]), ("a2", b"replaced"), ("b", b"")] {
        assert_eq!(
            hashes.get(&ino(p)),
            Some(&(data.len() as u64, Digest::of(data))),
            "{p}"
        );
    }
    assert_ne!(ino("a"), ino("a2"));
    // "gone"'s inode was written once and may be reused; what is in the
    // tree now is what counts: every file there has its own, right entry
    assert!(!t.join("gone").exists());
    // without hash_files, and for a skeleton, no hashes
    let other = scratch();
    let mut u = Unpacker::new_skeleton(other.path(), Policy::default()).unwrap();
    u.hash_files();
    let (bytes, c) = tar_layer(|w| {
        w.file("x", 0o644, b"data");
    });
    u.apply(layer_of(0, &bytes, c, None)).unwrap();
    assert!(u.take_file_hashes().is_empty());
    let plain = scratch();
    let mut u = Unpacker::new(plain.path(), Policy::default()).unwrap();
    u.apply(layer_of(0, &bytes, c, None)).unwrap();
    assert!(u.take_file_hashes().is_empty());
}

#[test]
fn a_file_replaces_a_directory_and_its_subtree() {
    let sb = Sandbox::new();
    let t = sb.target();
    let l0 = tar_layer(|w| {
        w.dir("x", 0o755)
            .dir("x/y", 0o755)
            .file("x/y/z", 0o644, b"1");
    });
    let l1 = tar_layer(|w| {
        w.file("x", 0o644, b"file now");
    });
    let l2 = tar_layer(|w| {
        w.dir("x", 0o700).file("x/again", 0o644, b"2");
    });
    unpack_all(&t, Policy::default(), &[l0, l1], None).unwrap();
    assert_eq!(read(&t.join("x")), "file now");
    let sb2 = Sandbox::new();
    let (a, b, c) = (
        tar_layer(|w| {
            w.dir("x", 0o755).file("x/old", 0o644, b"1");
        }),
        tar_layer(|w| {
            w.file("x", 0o644, b"f");
        }),
        l2,
    );
    unpack_all(&sb2.target(), Policy::default(), &[a, b, c], None).unwrap();
    assert!(!sb2.target().join("x/old").exists());
    assert_eq!(read(&sb2.target().join("x/again")), "2");
    assert_eq!(
        fs::symlink_metadata(sb2.target().join("x")).unwrap().mode() & 0o7777,
        0o700
    );
}

#[test]
fn target_must_be_an_empty_directory() {
    let sb = Sandbox::new();
    fs::write(sb.target().join("x"), b"").unwrap();
    let e = Unpacker::new(&sb.target(), Policy::default())
        .err()
        .unwrap();
    assert_eq!(e.rule, Rule::Target);
    assert!(e.to_string().contains("not empty"), "{e}");
    let e = Unpacker::new(&sb.dir.path().join("missing"), Policy::default())
        .err()
        .unwrap();
    assert_eq!(e.rule, Rule::Target);
    let link = sb.dir.path().join("link-to-sentinel");
    std::os::unix::fs::symlink("sentinel", &link).unwrap();
    let e = Unpacker::new(&link, Policy::default()).err().unwrap();
    assert_eq!(e.rule, Rule::Target, "a symlinked target is refused");
}

fn xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    rustix::fs::lgetxattr(p, name, &mut buf[..])
        .ok()
        .map(|n| buf[..n].to_vec())
}

#[test]
fn file_capabilities_and_user_xattrs_are_applied_others_ignored() {
    let dir = workspace_root().join("testdata/layers/ok-capability-and-xattrs");
    let bytes = fs::read(dir.join("layer-0.tar")).unwrap();
    let sb = Sandbox::new();
    let mut u = Unpacker::new(&sb.target(), Policy::default()).unwrap();
    let st = u
        .apply(layer_of(0, &bytes, Compression::None, None))
        .unwrap();
    u.finish().unwrap();
    let ping = sb.target().join("usr/bin/ping");
    let cap = xattr(&ping, "security.capability").expect("capability applied");
    assert_eq!(&cap[..8], &[1, 0, 0, 2, 0, 0x20, 0, 0]);
    assert_eq!(xattr(&ping, "user.kubeslot").as_deref(), Some(&b"yes"[..]));
    assert_eq!(xattr(&ping, "trusted.overlay.opaque"), None);
    let d = sb.target().join("dir");
    assert_eq!(xattr(&d, "user.dir").as_deref(), Some(&b"1"[..]));
    assert_eq!(xattr(&d, "system.posix_acl_access"), None);
    // trusted.overlay.opaque, security.selinux, system.posix_acl_access
    assert_eq!(st.ignored_xattrs, 3, "{st:?}");
}

#[test]
fn a_malformed_allowlist_entry_is_refused() {
    for bad in [
        "usr/bin/su",
        "/usr/../bin/su",
        "/usr//bin/su",
        "/",
        "/usr/bin/su/",
    ] {
        let sb = Sandbox::new();
        let mut p = Policy::default();
        p.setuid_allowlist.push(bad.to_string());
        let e = Unpacker::new(&sb.target(), p).err().unwrap();
        assert_eq!(e.rule, Rule::Policy, "{bad}");
        assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
    }
}

#[test]
fn errors_name_layer_entry_and_rule_with_escapes() {
    let corpus = workspace_root().join("testdata/layers");
    for (scenario, want) in [
        (
            "name-dotdot-middle",
            "entry 1 \"a/../../sentinel/pwned\": rule dotdot: ",
        ),
        ("name-nul-pax", "entry 0 \"a\\x00b\": rule nul-byte: "),
    ] {
        let bytes = fs::read(corpus.join(scenario).join("layer-0.tar")).unwrap();
        let sb = Sandbox::new();
        let e = unpack_all(
            &sb.target(),
            Policy::default(),
            &[(bytes.clone(), Compression::None)],
            None,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("layer 0 ({}): ", Digest::of(&bytes))),
            "{msg}"
        );
        assert!(msg.contains(want), "{msg}");
    }
}

#[test]
fn an_unpacker_that_failed_refuses_further_layers() {
    let sb = Sandbox::new();
    let mut u = Unpacker::new(&sb.target(), Policy::default()).unwrap();
    let bad = tar_layer(|w| {
        w.file("a", 0o644, b"1");
    });
    let mut l = layer_of(0, &bad.0, bad.1, Some(Digest::of(b"wrong")));
    l.index = 0;
    assert_eq!(u.apply(l).unwrap_err().rule, Rule::DiffIdMismatch);
    let good = tar_layer(|w| {
        w.file("b", 0o644, b"1");
    });
    assert_eq!(
        u.apply(layer_of(1, &good.0, good.1, None))
            .unwrap_err()
            .rule,
        Rule::Target
    );
    assert_eq!(u.finish().unwrap_err().rule, Rule::Target);
}

#[test]
fn gzip_and_zstd_layers_hash_the_uncompressed_stream() {
    let (tar, _) = tar_layer(|w| {
        w.dir("d", 0o755).file("d/f", 0o644, &vec![7u8; 3 << 20]);
    });
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    let zst = zstd::stream::encode_all(&tar[..], 3).unwrap();
    for (bytes, c) in [(gz, Compression::Gzip), (zst, Compression::Zstd)] {
        let sb = Sandbox::new();
        let mut u = Unpacker::new(&sb.target(), Policy::default()).unwrap();
        let st = u
            .apply(Layer {
                index: 0,
                digest: Digest::of(&bytes),
                diff_id: Digest::of(&tar),
                compression: c,
                reader: &bytes[..],
            })
            .unwrap();
        assert_eq!(st.bytes, tar.len() as u64);
        assert_eq!(st.files, 1);
        let total = u.finish().unwrap();
        assert_eq!(total.bytes, tar.len() as u64);
        assert_eq!(
            fs::metadata(sb.target().join("d/f")).unwrap().len(),
            3 << 20
        );
        assert_eq!(
            fs::metadata(sb.target().join("d/f"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o644
        );
    }
}

// ---------------------------------------------------------------------------
// differential check against umoci

/// Copies the entries of `src` for which `pick(index)` holds into a new tar,
/// leaving out device nodes (the unpacker refuses them by design; an nspawn
/// machine gets `/dev` from the host).
fn split_rootfs(src: &Path, parts: usize) -> Vec<Vec<u8>> {
    let total = tar::Archive::new(fs::File::open(src).unwrap())
        .entries()
        .unwrap()
        .count();
    let mut builders: Vec<tar::Builder<Vec<u8>>> =
        (0..parts).map(|_| tar::Builder::new(Vec::new())).collect();
    let mut archive = tar::Archive::new(std::io::BufReader::new(fs::File::open(src).unwrap()));
    for (i, e) in archive.entries().unwrap().enumerate() {
        let mut e = e.unwrap();
        let ty = e.header().entry_type();
        if matches!(
            ty,
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo
        ) {
            continue;
        }
        let b = &mut builders[i * parts / total];
        let path = e.path().unwrap().into_owned();
        let mut h = e.header().clone();
        if ty.is_symlink() || ty.is_hard_link() {
            let link = e.link_name().unwrap().unwrap().into_owned();
            b.append_link(&mut h, &path, &link).unwrap();
        } else {
            b.append_data(&mut h, &path, &mut e).unwrap();
        }
    }
    builders
        .into_iter()
        .map(|b| b.into_inner().unwrap())
        .collect()
}

/// A top layer exercising OCI semantics on a real tree: whiteouts of a
/// file and a directory, an opaque directory with new content, a file
/// replacing a directory, a directory replacing a file, a new hardlink.
fn semantics_layer() -> Vec<u8> {
    let mut w = TarW(tar::Builder::new(Vec::new()));
    w.file("etc/.wh.motd", 0o644, b"")
        .file("usr/share/.wh.man", 0o644, b"")
        .dir("usr/share/doc", 0o755)
        .file("usr/share/doc/.wh..wh..opq", 0o644, b"")
        .file("usr/share/doc/README.kubeslot", 0o644, b"replaced\n")
        .file("usr/share/zoneinfo", 0o644, b"a file over a directory\n")
        .dir("etc/hostname", 0o750)
        .file("etc/hostname/inside", 0o600, b"a directory over a file\n")
        .hardlink("usr/bin/env-again", "usr/bin/env")
        .symlink("etc/kubeslot-link", "/nonexistent/target");
    w.0.into_inner().unwrap()
}

/// Writes `layers` (uncompressed tars) as a gzip OCI layout for amd64
/// tagged `tag` (umoci reads it too). Returns each layer's (blob, diff_id).
fn write_layout(dir: &Path, tag: &str, layers: &[Vec<u8>]) -> Vec<(Vec<u8>, Digest)> {
    let layout = image::open_or_create(dir);
    let blobs: Vec<LayerBlob> = layers
        .iter()
        .map(|tar| image::gzip_layer(&layout, tar))
        .collect();
    image::write_manifest_image(&layout, tag, &Platform::linux("amd64"), &blobs);
    blobs
        .iter()
        .map(|b| {
            (
                fs::read(layout.blobs().path(&b.desc.digest)).unwrap(),
                b.diff_id,
            )
        })
        .collect()
}

/// Path → (type, mode, owner, symlink target or content digest, mtime,
/// hardlink group).
fn tree_facts(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut groups: BTreeMap<(u64, u64), Vec<PathBuf>> = BTreeMap::new();
    let mut facts = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let m = fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            let (ty, what) = if ft.is_symlink() {
                ("symlink", fs::read_link(&p).unwrap().display().to_string())
            } else if ft.is_dir() {
                stack.push(p.clone());
                ("dir", String::new())
            } else if ft.is_file() {
                let mut h = kubeslot_image::digest::HashingReader::new(fs::File::open(&p).unwrap());
                std::io::copy(&mut h, &mut std::io::sink()).unwrap();
                ("file", h.finish().0.to_string())
            } else {
                ("other", format!("{:?}", ft))
            };
            if ft.is_file() && m.nlink() > 1 {
                groups
                    .entry((m.dev(), m.ino()))
                    .or_default()
                    .push(rel.clone());
            }
            let mtime = format!(" mtime={}", m.mtime());
            facts.insert(
                rel,
                format!(
                    "{ty} {:o} {}:{} {what}{mtime}",
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid()
                ),
            );
        }
    }
    for mut g in groups.into_values() {
        g.sort();
        let names = g
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(",");
        for p in &g {
            facts
                .get_mut(p)
                .unwrap()
                .push_str(&format!(" links=[{names}]"));
        }
    }
    facts
}

#[test]
fn same_tree_as_umoci_on_a_debian_rootfs_with_whiteouts() {
    let umoci = require_tool("umoci", "umoci");
    let rootfs = kubeslot_test_support::debian_rootfs(&["systemd", "dbus", "iproute2"]);
    let tmp = scratch();
    let mut tars = split_rootfs(&rootfs, 3);
    tars.push(semantics_layer());
    let layout = tmp.path().join("layout");
    let blobs = write_layout(&layout, "t", &tars);

    let ours = tmp.path().join("ours");
    fs::create_dir(&ours).unwrap();
    let mut u = Unpacker::new(&ours, Policy::default()).unwrap();
    for (i, (blob, diff_id)) in blobs.iter().enumerate() {
        u.apply(Layer {
            index: i,
            digest: Digest::of(blob),
            diff_id: *diff_id,
            compression: Compression::Gzip,
            reader: &blob[..],
        })
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let stats = u.finish().unwrap();
    assert_eq!(stats.layers, 4);
    assert!(stats.entries > 5000, "{stats:?}");

    let bundle = tmp.path().join("bundle");
    let out = Command::new(umoci)
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:t", layout.display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "umoci unpack: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let a = tree_facts(&ours);
    let b = tree_facts(&bundle.join("rootfs"));
    // The semantics layer did what it says, in both trees.
    for t in [&ours, &bundle.join("rootfs")] {
        assert!(!t.join("etc/motd").exists());
        assert!(!t.join("usr/share/man").exists());
        assert!(t.join("usr/share/zoneinfo").is_file());
        assert!(t.join("etc/hostname/inside").is_file());
        let docs: Vec<_> = fs::read_dir(t.join("usr/share/doc")).unwrap().collect();
        assert_eq!(docs.len(), 1, "opaque usr/share/doc in {}", t.display());
    }
    let only_a: Vec<_> = a.keys().filter(|k| !b.contains_key(*k)).take(20).collect();
    let only_b: Vec<_> = b.keys().filter(|k| !a.contains_key(*k)).take(20).collect();
    let differ: Vec<_> = a
        .iter()
        .filter_map(|(k, v)| match b.get(k) {
            Some(w) if w != v => Some(format!("{}:\n  ours  {v}\n  umoci {w}", k.display())),
            _ => None,
        })
        .take(20)
        .collect();
    assert!(
        only_a.is_empty() && only_b.is_empty() && differ.is_empty(),
        "trees differ ({} vs {} paths)\nonly ours: {only_a:#?}\nonly umoci: {only_b:#?}\n{}",
        a.len(),
        b.len(),
        differ.join("\n")
    );
    assert!(a.len() > 5000);
}

/// A PAX extended header ('x') holding `records` (key, value), then a
/// regular file `name`, then the end marker.
fn pax_layer(records: &[(&str, &str)], name: &str) -> Vec<u8> {
    let mut data = Vec::new();
    for (k, v) in records {
        // "<len> <key>=<value>\n", len counting itself
        let body = format!(" {k}={v}\n");
        let mut len = body.len() + 1;
        while format!("{len}{body}").len() != len {
            len += 1;
        }
        data.extend_from_slice(format!("{len}{body}").as_bytes());
    }
    let mut b = tar::Builder::new(Vec::new());
    let mut x = tar::Header::new_ustar();
    x.set_entry_type(tar::EntryType::XHeader);
    x.set_size(data.len() as u64);
    x.set_mode(0o644);
    x.set_path("PaxHeaders/f").unwrap();
    x.set_uid(0);
    x.set_gid(0);
    x.set_mtime(1_600_000_000);
    x.set_cksum();
    b.append(&x, &data[..]).unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(2);
    h.set_mode(0o644);
    h.set_mtime(1_600_000_000);
    h.set_path(name).unwrap();
    h.set_uid(0);
    h.set_gid(0);
    h.set_cksum();
    b.append(&h, &b"x\n"[..]).unwrap();
    b.into_inner().unwrap()
}

fn refused_rule(sb: &Sandbox, bytes: Vec<u8>, want: &str) {
    let before = sb.outside();
    let e = unpack_all(
        &sb.target(),
        Policy::default(),
        &[(bytes, Compression::None)],
        None,
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(text.contains(want), "{text}");
    assert_eq!(before, sb.outside(), "outside the target changed");
}

#[test]
fn data_after_the_tar_end_marker_is_refused_zero_padding_is_not() {
    let (good, _) = tar_layer(|t| {
        t.file("etc/a", 0o644, b"a\n");
    });
    let sb = Sandbox::new();
    let mut padded = good.clone();
    padded.extend_from_slice(&[0u8; 10240]);
    unpack_all(
        &sb.target(),
        Policy::default(),
        &[(padded, Compression::None)],
        None,
    )
    .unwrap();
    let sb = Sandbox::new();
    let mut smuggled = good.clone();
    smuggled.extend_from_slice(&pax_layer(&[], "etc/hidden"));
    refused_rule(&sb, smuggled, "data after the tar end marker");
    assert!(!sb.target().join("etc/hidden").exists());
}

#[test]
fn a_pax_key_repeated_in_one_header_is_refused() {
    let sb = Sandbox::new();
    refused_rule(
        &sb,
        pax_layer(&[("path", "etc/one"), ("path", "etc/two")], "etc/x"),
        "appears twice in one header",
    );
    // one of each is fine
    let sb = Sandbox::new();
    unpack_all(
        &sb.target(),
        Policy::default(),
        &[(
            pax_layer(&[("path", "etc/one"), ("mtime", "1.5")], "etc/x"),
            Compression::None,
        )],
        None,
    )
    .unwrap();
    assert!(sb.target().join("etc/one").is_file());
}

#[test]
fn extreme_pax_numbers_are_refused_not_panics() {
    for (key, value) in [
        ("mtime", "-9223372036854775808.5"),
        ("mtime", "99999999999999999999999"),
        ("uid", "99999999999999999999999"),
        ("size", "18446744073709551615"),
    ] {
        let sb = Sandbox::new();
        refused_rule(&sb, pax_layer(&[(key, value)], "etc/x"), "PAX");
    }
}
