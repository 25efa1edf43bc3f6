//! The differential test of slot trees: seeded random multi-layer OCI
//! layouts (whiteouts, opaque directories, implicit parents, hardlinks in
//! and across layers, symlinks, setuid, large ids, `user.*` xattrs, `./`
//! entries, file/dir/symlink swaps, docker-style and minimal layers)
//! unpacked by `umoci unpack` (the reference), by copy mode
//! (`stage::unpack_layers`) and by overlay mode (the layer store, the
//! per-image metadata layer and the slot's real mount unit, mounted by the
//! fake systemd with the unit's own options). Each tree is compared path
//! by path: type, mode, owner, size, content hash, symlink target,
//! hardlink group and xattrs, and the mtime of every path the image gives
//! one (a time the generator drew, before [`IMAGE_TIMES_END`]: it must be
//! umoci's); a directory no layer lists (an implicit parent) has the time
//! its unpack made it, on every side, and only that is not compared.
//!
//! A fixed seed set runs with the suite; `KUBESLOT_DIFF_SEED=S` and
//! `KUBESLOT_DIFF_COUNT=N` run N images from seed S instead (longer runs).
//! A failure names the image seed, the path, the attribute and each side's
//! value.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

use kubeslot_activator::fetch::store::Store;
use kubeslot_activator::paths::Root;
use kubeslot_activator::slot::Slot;
use kubeslot_activator::testing::FakeSystemd;
use kubeslot_activator::{
    slots::overlay, slots::overlay::layers, slots::overlay::metalayer, slots::record, slots::stage,
};
use kubeslot_image::digest::Digest;
use kubeslot_image::oci::Platform;
use kubeslot_image::reference::ImageSource;
use kubeslot_image::unpack::{Policy, Rule};
use kubeslot_test_support::{image, require_tool};

use crate::overlay::fetched;

/// The seeds every suite run checks (about 1 s each on 2 cores).
const SEEDS: std::ops::Range<u64> = 1..13;

/// Every mtime the generator writes is in `IMAGE_TIMES_START..IMAGE_TIMES_END`
/// (2020-09-13 to 2023-11-14); a tree's time outside it is the time of its
/// own unpack (or umoci's 0 for a root no layer lists).
const IMAGE_TIMES_START: i64 = 1_600_000_000;
const IMAGE_TIMES_END: i64 = 1_700_000_000;

/// Names entries are drawn from: few, so paths collide across layers.
const NAMES: [&str; 4] = ["a", "b", "c", "d"];

// ------------------------------------------------------------ generator

/// splitmix64: a seeded stream, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Kind {
    File,
    Dir,
    Symlink,
}

/// What the generator believes is at a path (to choose targets; umoci,
/// not this, is the reference).
#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    mode: u32,
    uid: u64,
    gid: u64,
    xattrs: Vec<(String, Vec<u8>)>,
}

impl Node {
    fn implicit_dir() -> Node {
        Node {
            kind: Kind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            xattrs: vec![],
        }
    }
}

/// The tree after the layers so far, path (no leading `./`, root "") → node.
#[derive(Default)]
struct Model(BTreeMap<String, Node>);

impl Model {
    fn remove_tree(&mut self, p: &str) {
        self.0.remove(p);
        let prefix = format!("{p}/");
        self.0.retain(|k, _| !k.starts_with(&prefix));
    }
    fn remove_children(&mut self, p: &str) {
        let prefix = if p.is_empty() {
            String::new()
        } else {
            format!("{p}/")
        };
        self.0
            .retain(|k, _| k == p || !k.starts_with(&prefix) || k.is_empty());
    }
    fn ensure_parents(&mut self, p: &str) {
        let mut at = 0;
        while let Some(i) = p[at..].find('/') {
            let anc = &p[..at + i];
            self.0
                .entry(anc.to_string())
                .or_insert_with(Node::implicit_dir);
            at += i + 1;
        }
    }
    fn dirs(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .0
            .iter()
            .filter(|(_, n)| n.kind == Kind::Dir)
            .map(|(k, _)| k.clone())
            .collect();
        v.push(String::new());
        v
    }
    fn paths_of(&self, kind: Option<Kind>) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, n)| !k.is_empty() && kind.as_ref().is_none_or(|w| n.kind == *w))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// One layer being written: its tar, the paths it already holds, and how
/// it lists parents.
struct LayerOut {
    tar: tar::Builder<Vec<u8>>,
    written: BTreeSet<String>,
    docker: bool,
    dot: bool,
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn parent_of(p: &str) -> &str {
    p.rfind('/').map_or("", |i| &p[..i])
}

const MODES_FILE: [u32; 7] = [0o644, 0o600, 0o755, 0o4755, 0o2755, 0o444, 0o640];
const MODES_DIR: [u32; 6] = [0o755, 0o700, 0o1777, 0o2775, 0o750, 0o711];
const IDS: [u64; 7] = [0, 0, 0, 1000, 65534, 100_000, 4_000_000_000];

struct Gen {
    rng: Rng,
    model: Model,
    /// A hardlink to a lower layer's file was written (overlay refuses it).
    cross_link: bool,
}

impl Gen {
    fn meta(&mut self, kind: Kind, mode: u32) -> Node {
        let xattrs = if kind != Kind::Symlink && self.rng.chance(30) {
            let n = self.rng.below(2) + 1;
            (0..n)
                .map(|i| {
                    let v = format!("v{}", self.rng.below(1000)).into_bytes();
                    (format!("user.k{}", i + self.rng.below(2)), v)
                })
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect()
        } else {
            vec![]
        };
        Node {
            kind,
            mode,
            uid: *self.rng.pick(&IDS),
            gid: *self.rng.pick(&IDS),
            xattrs,
        }
    }

    fn header(&mut self, out: &LayerOut, path: &str, node: &Node) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        let (ty, name) = match node.kind {
            Kind::File => (tar::EntryType::Regular, path.to_string()),
            Kind::Dir => (tar::EntryType::Directory, format!("{path}/")),
            Kind::Symlink => (tar::EntryType::Symlink, path.to_string()),
        };
        let name = if path.is_empty() {
            "./".to_string()
        } else if out.dot {
            format!("./{name}")
        } else {
            name
        };
        h.set_entry_type(ty);
        h.set_path(&name).unwrap();
        h.set_mode(node.mode);
        h.set_uid(node.uid);
        h.set_gid(node.gid);
        h.set_mtime(1_600_000_000 + self.rng.below(1_000_000) as u64);
        h.set_size(0);
        h
    }

    fn append(
        &mut self,
        out: &mut LayerOut,
        h: &mut tar::Header,
        xattrs: &[(String, Vec<u8>)],
        data: &[u8],
    ) {
        if !xattrs.is_empty() {
            let recs: Vec<(String, &[u8])> = xattrs
                .iter()
                .map(|(k, v)| (format!("SCHILY.xattr.{k}"), v.as_slice()))
                .collect();
            out.tar
                .append_pax_extensions(recs.iter().map(|(k, v)| (k.as_str(), *v)))
                .unwrap();
        }
        h.set_size(data.len() as u64);
        h.set_cksum();
        out.tar.append(h, data).unwrap();
    }

    /// Docker style: every parent listed (with its present attributes)
    /// before an entry under it.
    fn parents(&mut self, out: &mut LayerOut, path: &str) {
        if !out.docker {
            self.model.ensure_parents(path);
            return;
        }
        let mut ancestors = vec![];
        let mut p = parent_of(path);
        while !p.is_empty() {
            ancestors.push(p.to_string());
            p = parent_of(p);
        }
        for anc in ancestors.into_iter().rev() {
            if out.written.contains(&anc) {
                continue;
            }
            let node = match self.model.0.get(&anc) {
                Some(n) if n.kind == Kind::Dir => n.clone(),
                _ => Node::implicit_dir(),
            };
            let mut h = self.header(out, &anc, &node);
            self.append(out, &mut h, &node.xattrs.clone(), b"");
            out.written.insert(anc.clone());
            self.model.remove_tree_unless_dir(&anc);
            self.model.0.insert(anc, node);
        }
    }

    /// A path for a new entry: under an existing directory, sometimes one
    /// level deeper in a directory the layer does not list; never under a
    /// non-directory, never one this layer wrote.
    fn fresh_path(&mut self, out: &LayerOut) -> Option<String> {
        let dirs: Vec<String> = self
            .model
            .dirs()
            .into_iter()
            .filter(|d| d.matches('/').count() < 2)
            .collect();
        let dir = self.rng.pick(&dirs).clone();
        let name = NAMES[self.rng.below(NAMES.len())];
        let mut p = join(&dir, name);
        if self.rng.chance(30) {
            let name = NAMES[self.rng.below(NAMES.len())];
            p = join(&p, name);
        }
        let mut anc = parent_of(&p);
        while !anc.is_empty() {
            if self.model.0.get(anc).is_some_and(|n| n.kind != Kind::Dir) {
                return None;
            }
            anc = parent_of(anc);
        }
        if out
            .written
            .iter()
            .any(|w| w == &p || w.starts_with(&format!("{p}/")))
        {
            return None;
        }
        Some(p)
    }

    fn layer(&mut self, index: usize) -> Vec<u8> {
        let mut out = LayerOut {
            tar: tar::Builder::new(Vec::new()),
            written: BTreeSet::new(),
            docker: self.rng.chance(40),
            dot: self.rng.chance(30),
        };
        // `./`: the root's own attributes.
        if (index > 0 && self.rng.chance(25)) || (index == 0 && self.rng.chance(15)) {
            let mode = *self.rng.pick(&[0o755, 0o700, 0o750, 0o1777]);
            let node = self.meta(Kind::Dir, mode);
            let mut h = self.header(&out, "", &node);
            self.append(&mut out, &mut h, &node.xattrs.clone(), b"");
            self.model.0.insert(String::new(), node);
            out.written.insert(String::new());
        }
        // Whiteouts and opaque markers first (they hide lower layers only).
        if index > 0 {
            for _ in 0..self.rng.below(4) {
                self.whiteout(&mut out);
            }
        }
        let n = 3 + self.rng.below(10);
        for _ in 0..n {
            match self.rng.below(100) {
                0..=34 => self.file(&mut out),
                35..=54 => self.dir(&mut out),
                55..=66 => self.symlink(&mut out),
                67..=81 => self.hardlink(&mut out),
                _ => self.swap(&mut out),
            }
        }
        out.tar.into_inner().unwrap()
    }

    fn whiteout(&mut self, out: &mut LayerOut) {
        let all = self.model.paths_of(None);
        if all.is_empty() {
            return;
        }
        let target = self.rng.pick(&all).clone();
        let overlaps = |w: &String| {
            w == &target
                || w.starts_with(&format!("{target}/"))
                || target.starts_with(&format!("{w}/"))
        };
        if out.written.iter().any(overlaps) {
            return;
        }
        let is_dir = self.model.0[&target].kind == Kind::Dir;
        let opaque = is_dir && self.rng.chance(40);
        let marker = if opaque {
            join(&target, ".wh..wh..opq")
        } else {
            join(
                parent_of(&target),
                &format!(".wh.{}", target.rsplit('/').next().unwrap()),
            )
        };
        if out.written.contains(&marker) {
            return;
        }
        self.parents(out, &marker);
        if opaque && out.docker && !out.written.contains(&target) {
            // docker lists the opaque directory itself
            let node = self.model.0[&target].clone();
            let mut h = self.header(out, &target, &node);
            self.append(out, &mut h, &node.xattrs.clone(), b"");
            out.written.insert(target.clone());
        }
        let node = Node {
            kind: Kind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            xattrs: vec![],
        };
        let mut h = self.header(out, &marker, &node);
        self.append(out, &mut h, &[], b"");
        out.written.insert(marker);
        if opaque {
            self.model.remove_children(&target);
        } else {
            self.model.remove_tree(&target);
            // sometimes the same layer brings the path back as a fresh
            // directory holding one file, listing no `D/` (minimal style)
            if is_dir && !out.docker && self.rng.chance(50) {
                let p = join(&target, "new");
                self.put_file(out, &p);
            }
        }
    }

    fn put_file(&mut self, out: &mut LayerOut, p: &str) {
        self.parents(out, p);
        let mode = *self.rng.pick(&MODES_FILE);
        let node = self.meta(Kind::File, mode);
        let len = *self.rng.pick(&[0usize, 1, 100, 3000]);
        let data: Vec<u8> = (0..len).map(|_| self.rng.next() as u8).collect();
        let mut h = self.header(out, p, &node);
        self.append(out, &mut h, &node.xattrs.clone(), &data);
        out.written.insert(p.to_string());
        self.model.remove_tree(p);
        self.model.0.insert(p.to_string(), node);
    }

    fn file(&mut self, out: &mut LayerOut) {
        if let Some(p) = self.fresh_path(out) {
            if self.model.0.get(&p).is_some_and(|n| n.kind == Kind::Dir) && !self.rng.chance(30) {
                return;
            }
            self.put_file(out, &p);
        }
    }

    fn put_dir(&mut self, out: &mut LayerOut, p: &str) {
        self.parents(out, p);
        let mode = *self.rng.pick(&MODES_DIR);
        let node = self.meta(Kind::Dir, mode);
        let mut h = self.header(out, p, &node);
        self.append(out, &mut h, &node.xattrs.clone(), b"");
        out.written.insert(p.to_string());
        self.model.remove_tree_unless_dir(p);
        self.model.0.insert(p.to_string(), node);
    }

    fn dir(&mut self, out: &mut LayerOut) {
        if let Some(p) = self.fresh_path(out) {
            self.put_dir(out, &p);
        }
    }

    fn symlink(&mut self, out: &mut LayerOut) {
        let Some(p) = self.fresh_path(out) else {
            return;
        };
        if self.model.0.get(&p).is_some_and(|n| n.kind == Kind::Dir) && !self.rng.chance(30) {
            return;
        }
        self.parents(out, &p);
        let mut node = self.meta(Kind::Symlink, 0o777);
        node.xattrs.clear();
        let target = self
            .rng
            .pick(&["a", "../b", "/etc/c", "d/e/f", "."])
            .to_string();
        let mut h = self.header(out, &p, &node);
        h.set_link_name(&target).unwrap();
        self.append(out, &mut h, &[], b"");
        out.written.insert(p.clone());
        self.model.remove_tree(&p);
        self.model.0.insert(p, node);
    }

    fn hardlink(&mut self, out: &mut LayerOut) {
        let files = self.model.paths_of(Some(Kind::File));
        let in_layer: Vec<String> = files
            .iter()
            .filter(|f| out.written.contains(*f))
            .cloned()
            .collect();
        let across = in_layer.is_empty() || self.rng.chance(15);
        let target = if across {
            if !self.rng.chance(20) || files.is_empty() {
                return;
            }
            self.rng.pick(&files).clone()
        } else {
            self.rng.pick(&in_layer).clone()
        };
        let Some(p) = self.fresh_path(out) else {
            return;
        };
        if p == target || self.model.0.get(&p).is_some_and(|n| n.kind == Kind::Dir) {
            return;
        }
        if !out.written.contains(&target) {
            self.cross_link = true;
        }
        self.parents(out, &p);
        let node = self.model.0[&target].clone();
        let mut h = self.header(out, &p, &node);
        h.set_entry_type(tar::EntryType::Link);
        let name = if out.dot {
            format!("./{target}")
        } else {
            target.clone()
        };
        h.set_link_name(&name).unwrap();
        self.append(out, &mut h, &[], b"");
        out.written.insert(p.clone());
        self.model.remove_tree(&p);
        self.model.0.insert(p, node);
    }

    /// Another kind over an existing path: file ⇄ dir ⇄ symlink, or a
    /// directory over a directory (its attributes replaced).
    fn swap(&mut self, out: &mut LayerOut) {
        let all = self.model.paths_of(None);
        if all.is_empty() {
            return;
        }
        let p = self.rng.pick(&all).clone();
        if out
            .written
            .iter()
            .any(|w| w == &p || w.starts_with(&format!("{p}/")))
        {
            return;
        }
        match (self.model.0[&p].kind.clone(), self.rng.below(2)) {
            (Kind::Dir, 0) => self.put_dir(out, &p),
            (Kind::Dir, _) => self.put_file(out, &p),
            (_, 0) => self.put_dir(out, &p),
            (Kind::File, _) => {
                self.parents(out, &p);
                let node = Node {
                    kind: Kind::Symlink,
                    mode: 0o777,
                    uid: 0,
                    gid: 0,
                    xattrs: vec![],
                };
                let mut h = self.header(out, &p, &node);
                h.set_link_name("swapped").unwrap();
                self.append(out, &mut h, &[], b"");
                out.written.insert(p.clone());
                self.model.remove_tree(&p);
                self.model.0.insert(p, node);
            }
            (_, _) => self.put_file(out, &p),
        }
    }
}

impl Model {
    fn remove_tree_unless_dir(&mut self, p: &str) {
        if self.0.get(p).is_some_and(|n| n.kind != Kind::Dir) {
            self.remove_tree(p);
        }
    }
}

/// The layers of image `seed` (2 to 5) and whether one links across layers.
fn generate(seed: u64) -> (Vec<Vec<u8>>, bool) {
    let mut g = Gen {
        rng: Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d)),
        model: Model::default(),
        cross_link: false,
    };
    let n = 2 + g.rng.below(4);
    let layers = (0..n).map(|i| g.layer(i)).collect();
    (layers, g.cross_link)
}

/// Every path the generator can make is on the setuid allowlist: setuid
/// files are ordinary image content here.
fn policy() -> Policy {
    let mut p = Policy::default();
    let mut paths = vec![];
    let mut level: Vec<String> = vec![String::new()];
    for _ in 0..5 {
        let mut next = vec![];
        for d in &level {
            for n in NAMES.iter().chain(&["new"]) {
                next.push(join(d, n));
            }
        }
        paths.extend(next.iter().map(|p| format!("/{p}")));
        level = next;
    }
    p.setuid_allowlist = paths;
    p
}

// ------------------------------------------------------------ the trees

/// What the test compares of one path.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Facts {
    attrs: BTreeMap<&'static str, String>,
    mtime: i64,
}

fn xattrs_of(p: &Path) -> String {
    let mut names = vec![0u8; 4096];
    let n = rustix::fs::llistxattr(p, &mut names[..]).unwrap_or(0);
    let mut out = vec![];
    for name in names[..n].split(|b| *b == 0).filter(|s| !s.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        if !(name.starts_with("user.") || name == "security.capability") {
            continue;
        }
        let mut v = vec![0u8; 4096];
        let k = rustix::fs::lgetxattr(p, name.as_str(), &mut v[..]).unwrap();
        out.push(format!("{name}={}", String::from_utf8_lossy(&v[..k])));
    }
    out.sort();
    out.join(",")
}

/// Path ("/" for the root) → facts, for the whole tree under `root`.
fn facts(root: &Path) -> BTreeMap<String, Facts> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<(u64, u64), Vec<String>> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let rel = format!("/{}", p.strip_prefix(root).unwrap().display());
        let mut a = BTreeMap::new();
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            let mut names: Vec<PathBuf> = fs::read_dir(&p)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            names.sort();
            stack.extend(names);
            "dir"
        } else if ft.is_file() {
            a.insert("size", m.len().to_string());
            a.insert("content", Digest::of(&fs::read(&p).unwrap()).to_string());
            inodes
                .entry((m.dev(), m.ino()))
                .or_default()
                .push(rel.clone());
            "file"
        } else if ft.is_symlink() {
            a.insert("size", m.len().to_string());
            a.insert("target", fs::read_link(&p).unwrap().display().to_string());
            "symlink"
        } else {
            "other"
        };
        a.insert("type", kind.to_string());
        a.insert("mode", format!("{:o}", m.mode()));
        a.insert("owner", format!("{}:{}", m.uid(), m.gid()));
        if !ft.is_symlink() {
            a.insert("xattrs", xattrs_of(&p));
        }
        out.insert(
            rel,
            Facts {
                attrs: a,
                mtime: m.mtime(),
            },
        );
    }
    for group in inodes.values().filter(|g| g.len() > 1) {
        let mut g = group.clone();
        g.sort();
        for p in &g {
            out.get_mut(p)
                .unwrap()
                .attrs
                .insert("hardlinks", g.join(" "));
        }
    }
    out
}

/// Differences of `got` (named `side`) from the reference `want`.
fn differences(
    seed: u64,
    side: &str,
    reference: &str,
    want: &BTreeMap<String, Facts>,
    got: &BTreeMap<String, Facts>,
) -> Vec<String> {
    let mut out = vec![];
    let paths: BTreeSet<&String> = want.keys().chain(got.keys()).collect();
    for p in paths {
        match (want.get(p), got.get(p)) {
            (Some(_), None) => out.push(format!(
                "image {seed}: {p}: missing in {side} ({reference} has it)"
            )),
            (None, Some(f)) => out.push(format!(
                "image {seed}: {p}: only in {side} ({} {})",
                f.attrs["type"], f.attrs["mode"]
            )),
            (Some(w), Some(g)) => {
                // an image's time is kept; an unpack's own time is any
                // such time, on either side
                let image_time = |t: i64| (IMAGE_TIMES_START..IMAGE_TIMES_END).contains(&t);
                if image_time(w.mtime) && w.mtime != g.mtime {
                    out.push(format!(
                        "image {seed}: {p}: mtime: {reference} {}, {side} {} ({})",
                        w.mtime, g.mtime, w.attrs["type"]
                    ));
                }
                let keys: BTreeSet<&&str> = w.attrs.keys().chain(g.attrs.keys()).collect();
                for k in keys {
                    let (wv, gv) = (w.attrs.get(*k), g.attrs.get(*k));
                    if wv != gv {
                        out.push(format!(
                            "image {seed}: {p}: {k}: {reference} {:?}, {side} {:?} (mtimes: {reference} {}, {side} {})",
                            wv.map(String::as_str).unwrap_or("-"),
                            gv.map(String::as_str).unwrap_or("-"),
                            w.mtime,
                            g.mtime
                        ));
                    }
                }
            }
            (None, None) => unreachable!(),
        }
    }
    out
}

/// Unpacks image `seed` three ways; returns the differences from umoci.
fn check_image(seed: u64, umoci: &Path) -> Vec<String> {
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let (tars, cross_link) = generate(seed);
    let dir = tmp.path().join("layout");
    let layout = image::open_or_create(&dir);
    let blobs: Vec<_> = tars.iter().map(|t| image::gzip_layer(&layout, t)).collect();
    image::write_manifest_image(&layout, "img", &Platform::host(), &blobs);

    // umoci, the reference
    let bundle = tmp.path().join("bundle");
    let o = Command::new(umoci)
        .args(["unpack", "--image"])
        .arg(format!("{}:img", dir.display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "image {seed}: umoci unpack: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let want = facts(&bundle.join("rootfs"));

    let root = Root::new(tmp.path().join("root"));
    let store = Store::open(&root.store()).unwrap();
    let src = ImageSource::from_str(&format!("oci:{}:img", dir.display())).unwrap();
    let img = fetched(&store, &src, tmp.path());

    // copy mode: the staging directory the activator makes (0755)
    let copy = tmp.path().join("copy");
    fs::create_dir(&copy).unwrap();
    let mut copy_facts = BTreeMap::new();
    let mut diffs = match stage::unpack_layers(&store, &img, &copy, policy(), true) {
        Ok((_, hashes)) => {
            copy_facts = facts(&copy);
            let mut d = differences(seed, "copy", "umoci", &want, &copy_facts);
            d.extend(record_differences(seed, "copy", &copy, None, &hashes));
            d
        }
        Err(e) => vec![format!(
            "image {seed}: copy mode refused the image: {}",
            kubeslot_image::error_chain(&e)
        )],
    };

    // overlay mode: layer store, metadata layer, the slot's mount unit
    let ensured = metalayer::ensure_slot_lowers(&root, &store, &img, &policy());
    if cross_link {
        match ensured {
            Err(layers::LayerError::Unpack { error, .. }) if error.rule == Rule::HardlinkMissing => {}
            other => diffs.push(format!(
                "image {seed}: overlay: a hardlink into a lower layer must be refused (hardlink-missing), got {:?}",
                other.map(|e| e.dirs)
            )),
        }
        return diffs;
    }
    let ensured = match ensured {
        Ok(e) => e,
        Err(e) => {
            diffs.push(format!(
                "image {seed}: overlay refused the image: {}",
                kubeslot_image::error_chain(&e)
            ));
            return diffs;
        }
    };
    // each layer's record, made with the unpacker's hashes, is the one a
    // walk that reads every file makes (the metadata layer's included)
    for dir in &ensured.dirs {
        diffs.extend(record_differences(
            seed,
            "overlay",
            dir,
            Some(&record::record_path(dir)),
            &Default::default(),
        ));
    }
    let sd = FakeSystemd::new(&root);
    overlay::install(
        &root,
        &sd,
        Slot::Kube1,
        Some(img.image_digest()),
        &ensured.dirs,
    )
    .unwrap_or_else(|e| panic!("image {seed}: overlay install: {e}"));
    let merged = facts(&root.machine_tree("kube1"));
    diffs.extend(differences(seed, "overlay", "umoci", &want, &merged));
    // a directory's own time, which copy mode restores after a later
    // layer's entries in it (umoci does not), is the overlay's too
    if !copy_facts.is_empty() {
        diffs.extend(differences(seed, "overlay", "copy", &copy_facts, &merged));
    }
    // `rollback --clean` makes a fresh upper: the root keeps the image's.
    overlay::clean(&root, &sd, Slot::Kube1).unwrap();
    let cleaned = facts(&root.machine_tree("kube1"));
    overlay::remove(&root, &sd, Slot::Kube1).unwrap();
    diffs.extend(differences(
        seed,
        "overlay after clean",
        "umoci",
        &want,
        &cleaned,
    ));
    diffs
}

/// How the record of `dir` made with the unpacker's file hashes (`saved`,
/// or made here from `hashes`) differs from one that reads every file, and
/// whether files were read again where the hashes were there.
fn record_differences(
    seed: u64,
    mode: &str,
    dir: &Path,
    saved: Option<&Path>,
    hashes: &kubeslot_image::unpack::FileHashes,
) -> Vec<String> {
    let read_every_file = record::record(dir, None).unwrap();
    let (known, read) = match saved {
        Some(p) => (record::load(p).unwrap(), 0),
        None => record::record_known(dir, None, hashes).unwrap(),
    };
    let mut out: Vec<String> = record::compare(&read_every_file.entries, &known.entries)
        .into_iter()
        .map(|m| {
            format!(
                "image {seed}: {mode}: the record from the unpacker's hashes: {}: {}",
                m.path, m.what
            )
        })
        .collect();
    if read != 0 {
        out.push(format!(
            "image {seed}: {mode}: recording read {read} files again"
        ));
    }
    out
}

fn run_seeds(seeds: impl Iterator<Item = u64>) {
    let umoci = require_tool("umoci", "umoci");
    let mut all = vec![];
    let mut images = 0;
    for seed in seeds {
        images += 1;
        all.extend(check_image(seed, &umoci));
    }
    let shown = all.len().min(60);
    assert!(
        all.is_empty(),
        "{} differences from umoci in {images} images (first {shown}; rerun one with KUBESLOT_DIFF_SEED=S KUBESLOT_DIFF_COUNT=1):\n{}",
        all.len(),
        all[..shown].join("\n")
    );
}

#[test]
fn copy_and_overlay_slots_build_the_tree_umoci_builds() {
    match std::env::var("KUBESLOT_DIFF_SEED") {
        Ok(s) => {
            let start: u64 = s.parse().expect("KUBESLOT_DIFF_SEED: a number");
            let count: u64 = std::env::var("KUBESLOT_DIFF_COUNT")
                .map(|c| c.parse().expect("KUBESLOT_DIFF_COUNT: a number"))
                .unwrap_or(100);
            run_seeds(start..start + count);
        }
        Err(_) => run_seeds(SEEDS),
    }
}
