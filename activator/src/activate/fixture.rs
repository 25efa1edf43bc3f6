//! Test fixtures of the flip engine: one-layer test images in an OCI layout,
//! a host root with a config, and the shared fake systemd
//! ([`crate::testing`]).

use super::*;
use kubeslot_image::oci::Platform;
use std::collections::BTreeMap;
use std::io::Write as _;

pub(super) use crate::testing::FakeSystemd;

use kubeslot_image::layout::Layout;
use kubeslot_image::oci::{
    Compression, Descriptor, Index, ANNOTATION_REF_NAME, MEDIA_TYPE_CONFIG, MEDIA_TYPE_INDEX,
    MEDIA_TYPE_MANIFEST,
};

pub(super) fn tar_gz(files: &[(&str, &[u8])]) -> (Vec<u8>, Digest) {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, *data).unwrap();
    }
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    (gz.finish().unwrap(), Digest::of(&tar))
}

/// A one-layer image tagged `t` in the layout at `dir` (created, or
/// retagged when it exists); its machine is `health`.
pub(super) fn image(dir: &Path, health: &str) -> Digest {
    image_with(dir, health, "")
}

/// [`image`] with `etc/version` holding `version` (a distinct image
/// with the same health).
pub(super) fn image_with(dir: &Path, health: &str, version: &str) -> Digest {
    image_created(dir, health, version, None)
}

/// [`image_with`] whose config says it was `created` then.
pub(super) fn image_created(
    dir: &Path,
    health: &str,
    version: &str,
    created: Option<&str>,
) -> Digest {
    image_annotated(dir, health, version, created, serde_json::json!({}))
}

/// [`image`] whose manifest says it carries kubelet `kubelet`
/// (`dev.kubeslot.version.kubelet`, as `kubeslot-builder` writes it).
pub(super) fn image_kubelet(dir: &Path, health: &str, kubelet: &str) -> Digest {
    image_annotated(
        dir,
        health,
        kubelet,
        None,
        serde_json::json!({crate::gate::cluster::KUBELET_VERSION_ANNOTATION: kubelet}),
    )
}

fn image_annotated(
    dir: &Path,
    health: &str,
    version: &str,
    created: Option<&str>,
    annotations: serde_json::Value,
) -> Digest {
    let layout = if dir.join("index.json").exists() {
        Layout::open(dir).unwrap()
    } else {
        Layout::create(dir).unwrap()
    };
    let (blob, diff_id) = tar_gz(&[
        ("etc/fixture-health", health.as_bytes()),
        ("etc/version", version.as_bytes()),
    ]);
    let layer = layout.blobs().put_bytes(&blob).unwrap();
    let mut config = serde_json::json!({
        "architecture": Platform::host().architecture, "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    });
    if let Some(c) = created {
        config["created"] = c.into();
    }
    let config = serde_json::to_vec(&config).unwrap();
    let cd = layout.blobs().put_bytes(&config).unwrap();
    let mut manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": MEDIA_TYPE_MANIFEST,
        "config": Descriptor::new(MEDIA_TYPE_CONFIG, cd, config.len() as u64),
        "layers": [Descriptor::new(Compression::Gzip.layer_media_type(), layer, blob.len() as u64)],
    });
    if annotations.as_object().is_some_and(|a| !a.is_empty()) {
        manifest["annotations"] = annotations;
    }
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let md = layout.blobs().put_bytes(&manifest).unwrap();
    let mut desc = Descriptor::new(MEDIA_TYPE_MANIFEST, md, manifest.len() as u64);
    desc.annotations
        .insert(ANNOTATION_REF_NAME.into(), "t".into());
    layout
        .write_index(&Index {
            schema_version: 2,
            media_type: Some(MEDIA_TYPE_INDEX.into()),
            manifests: vec![desc],
            annotations: Default::default(),
        })
        .unwrap();
    md
}

pub(super) struct Setup {
    pub(super) _dir: tempfile::TempDir,
    pub(super) root: Root,
    pub(super) config: PathBuf,
}

pub(super) fn setup(health: &str, url: Option<&str>, gpu: &str) -> (Setup, FakeSystemd, Digest) {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::new(dir.path().join("root"));
    // a host preflight passes once the sysctl drop-in is applied
    kubeslot_test_support::fake_host(root.dir());
    let digest = image(&dir.path().join("img"), health);
    let fake = FakeSystemd::new(&root);
    let served = fake.healthz_url.clone();
    let config = dir.path().join("activator.json");
    std::fs::write(
        &config,
        serde_json::to_vec(&serde_json::json!({
            "image": format!("oci:{}", dir.path().join("img").display()),
            "trust": {"allow_unsigned": true},
            "kubelet": {
                "api_server": "https://10.0.0.1:6443",
                "ca_data": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                "bootstrap_token": "abcdef.0123456789abcdef",
                "node_name": "node-a",
            },
            "gpu": gpu,
            "nameservers": ["192.0.2.53"],
            "health": {"timeout_secs": 1, "successes": 2, "interval_ms": 20,
                       "kubelet_healthz_url": url.unwrap_or(&served)},
        }))
        .unwrap(),
    )
    .unwrap();
    (
        Setup {
            _dir: dir,
            root,
            config,
        },
        fake,
        digest,
    )
}

pub(super) fn run(s: &Setup, fake: &FakeSystemd) -> Report {
    run_opts(s, fake, Options::default())
}

pub(super) fn run_opts(s: &Setup, fake: &FakeSystemd, opts: Options) -> Report {
    let ran = activate(&s.root, &s.config, fake, &opts);
    ran.saved.unwrap();
    ran.report
}

/// Watches `path` for opens (inotify); [`opens`] counts them.
pub(super) fn watch_opens(path: &Path) -> rustix::fd::OwnedFd {
    use rustix::fs::inotify;
    let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC).unwrap();
    // Close events too: the kernel merges identical consecutive unread
    // events, so two opens in a row would count as one.
    inotify::add_watch(
        &fd,
        path,
        inotify::WatchFlags::OPEN | inotify::WatchFlags::CLOSE_NOWRITE,
    )
    .unwrap();
    fd
}

pub(super) fn opens(fd: &rustix::fd::OwnedFd) -> usize {
    use rustix::fs::inotify;
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut reader = inotify::Reader::new(fd, &mut buf);
    let mut n = 0;
    while let Ok(e) = reader.next() {
        if e.events().contains(inotify::ReadFlags::OPEN) {
            n += 1;
        }
    }
    n
}

pub(super) fn archive_of(layout: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", layout).unwrap();
    b.into_inner().unwrap()
}

/// The tree of `machine` as path -> contents (files only).
pub(super) fn files_of(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// Sets `trust.identity` in the setup's config: its images have an
/// identity, so commits record releases.
pub(super) fn with_identity(s: &Setup) {
    let mut c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
    c["trust"]["identity"] = "registry.example/org/node".into();
    std::fs::write(&s.config, serde_json::to_vec(&c).unwrap()).unwrap();
}

pub(super) fn img_dir(s: &Setup) -> PathBuf {
    s._dir.path().join("img")
}

pub(super) fn activate_with(s: &Setup, fake: &FakeSystemd, allow_downgrade: bool) -> Report {
    run_opts(
        s,
        fake,
        Options {
            allow_downgrade,
            ..Options::default()
        },
    )
}

/// Re-tags the layout's `t` as a new index that wraps the manifest `t`
/// names now (a different top-level digest, the same signed manifest).
pub(super) fn rewrap_in_index(dir: &Path, note: &str) -> Digest {
    let layout = Layout::open(dir).unwrap();
    let mut index = layout.index().unwrap();
    let mut manifest = index.manifests[0].clone();
    manifest.annotations.clear();
    manifest.platform = Some(Platform::host());
    let mut inner = serde_json::json!({
        "schemaVersion": 2, "mediaType": MEDIA_TYPE_INDEX, "manifests": [manifest],
    });
    inner["annotations"] = serde_json::json!({ "note": note });
    let bytes = serde_json::to_vec(&inner).unwrap();
    let digest = layout.blobs().put_bytes(&bytes).unwrap();
    let mut desc = Descriptor::new(MEDIA_TYPE_INDEX, digest, bytes.len() as u64);
    desc.annotations
        .insert(ANNOTATION_REF_NAME.into(), "t".into());
    index.manifests = vec![desc];
    layout.write_index(&index).unwrap();
    digest
}

/// A host with one NVIDIA GPU and its driver as preflight wants it (module
/// 550.54.15, its control device, `ldconfig -p` listing its libraries);
/// each `ldconfig` run leaves a line in [`ldconfig_calls`]'s file.
pub(super) fn gpu_host(s: &Setup) {
    let calls = s.root.join("ldconfig.calls");
    let calls = calls.display();
    crate::render::gpu::mknod_char(&s.root.dev().join("nvidia0"), 195, 0).unwrap();
    crate::render::gpu::mknod_char(&s.root.dev().join("nvidiactl"), 195, 255).unwrap();
    // the driver preflight wants
    let version = s.root.join("proc/driver/nvidia/version");
    std::fs::create_dir_all(version.parent().unwrap()).unwrap();
    std::fs::write(
        &version,
        "NVRM version: NVIDIA UNIX Kernel Module 550.54.15\n",
    )
    .unwrap();
    let ldconfig = s.root.ldconfig();
    std::fs::create_dir_all(ldconfig.parent().unwrap()).unwrap();
    let marker = match std::env::consts::ARCH {
        "aarch64" => "AArch64",
        _ => "x86-64",
    };
    std::fs::write(
        &ldconfig,
        format!("#!/bin/sh\necho run >> {calls}\nprintf '2 libs found in cache\\n\\tlibcuda.so.1 (libc6,{marker}) => /usr/lib/nvidia/libcuda.so.1\\n\\tlibnvidia-ml.so.1 (libc6,{marker}) => /usr/lib/nvidia/libnvidia-ml.so.1\\n'\n"),
    )
    .unwrap();
    // the libraries it lists, of the module's version (preflight's
    // gpu-libraries)
    let libs = s.root.join("usr/lib/nvidia");
    std::fs::create_dir_all(&libs).unwrap();
    for stem in ["libcuda", "libnvidia-ml"] {
        std::fs::write(libs.join(format!("{stem}.so.550.54.15")), b"").unwrap();
        std::os::unix::fs::symlink(
            format!("{stem}.so.550.54.15"),
            libs.join(format!("{stem}.so.1")),
        )
        .unwrap();
    }
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&ldconfig, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// How many times `<root>/sbin/ldconfig` ran on a [`gpu_host`].
pub(super) fn ldconfig_calls(s: &Setup) -> usize {
    std::fs::read_to_string(s.root.join("ldconfig.calls")).map_or(0, |t| t.lines().count())
}
