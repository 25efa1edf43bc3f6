//! Black-box tests of the Debian package base: `lock`, `lock --check` and
//! `base` against Debian bookworm from this machine's configured mirror.
//! `.deb`s reach the machine only through apt (`lock --download`) and are
//! then served by a loopback `python3 -m http.server`, which the builder's
//! own fetch uses; they are cached under /var/cache/kubeslot-test/ by sha256.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

use kubeslot_test_support::{debian_mirror, free_port, require_tool, workspace_root};

const BIN: &str = env!("CARGO_BIN_EXE_kubeslot-builder");

fn builder(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run kubeslot-builder")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "kubeslot-builder failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn failed(out: Output) -> String {
    assert!(
        !out.status.success(),
        "kubeslot-builder succeeded but should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// A loopback HTTP mirror of a directory, killed by PID on drop.
struct Mirror {
    child: Child,
    url: String,
}

impl Mirror {
    fn serve(dir: &Path) -> Mirror {
        require_tool("python3", "python3");
        let port = free_port();
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn python3 -m http.server");
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Mirror {
            child,
            url: format!("http://127.0.0.1:{port}/debian"),
        }
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(serde::Deserialize)]
struct Lock {
    base_sha256: String,
    platform: Vec<Platform>,
}

#[derive(serde::Deserialize)]
struct Platform {
    arch: String,
    package: Vec<Deb>,
}

#[derive(serde::Deserialize, Clone)]
struct Deb {
    name: String,
    version: String,
    architecture: String,
    path: String,
    sha256: String,
}

struct Fixture {
    _dir: tempfile::TempDir,
    recipe: PathBuf,
    lock: Lock,
    lock_text: String,
    /// `<mirror dir>/debian/pool/...`, filled from the apt-fetched cache.
    mirror_dir: PathBuf,
}

impl Fixture {
    fn amd64(&self) -> &Platform {
        self.lock
            .platform
            .iter()
            .find(|p| p.arch == "amd64")
            .unwrap()
    }
}

/// Locks the test recipe once (apt against the machine's mirror) and makes
/// the loopback mirror's tree from .debs apt downloaded.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        require_tool("apt-get", "apt");
        require_tool("mmdebstrap", "mmdebstrap");
        require_tool("apt-ftparchive", "apt-utils");
        let dir = tempfile::tempdir().unwrap();
        let recipe = dir.path().join("bookworm-base.toml");
        std::fs::copy(
            workspace_root().join("testdata/recipes/bookworm-base.toml"),
            &recipe,
        )
        .unwrap();
        let r = recipe.to_str().unwrap();
        ok(builder(&["lock", r, "--mirror", &debian_mirror()]));
        let lock_text = std::fs::read_to_string(recipe.with_extension("lock")).unwrap();
        let lock: Lock = toml::from_str(&lock_text).unwrap();

        // .debs by sha256, downloaded once per machine by apt itself.
        let cache = PathBuf::from(
            std::env::var("KUBESLOT_TEST_CACHE").unwrap_or("/var/cache/kubeslot-test".into()),
        )
        .join("apt-debs");
        std::fs::create_dir_all(&cache).unwrap();
        let amd64 = lock.platform.iter().find(|p| p.arch == "amd64").unwrap();
        if amd64
            .package
            .iter()
            .any(|d| !cache.join(&d.sha256).is_file())
        {
            let dl = dir.path().join("download");
            ok(builder(&[
                "lock",
                r,
                "--mirror",
                &debian_mirror(),
                "--download",
                dl.to_str().unwrap(),
            ]));
            for d in &amd64.package {
                let tmp = cache.join(format!(".{}.tmp", d.sha256));
                std::fs::copy(dl.join(&d.path), &tmp).unwrap();
                std::fs::rename(&tmp, cache.join(&d.sha256)).unwrap();
            }
            std::fs::remove_dir_all(&dl).unwrap();
        }
        let mirror_dir = dir.path().join("mirror");
        for d in &amd64.package {
            let target = mirror_dir.join("debian").join(&d.path);
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::copy(cache.join(&d.sha256), &target).unwrap();
        }
        Fixture {
            _dir: dir,
            recipe,
            lock,
            lock_text,
            mirror_dir,
        }
    })
}

fn copy_recipe(f: &Fixture, dir: &Path) -> PathBuf {
    let recipe = dir.join("bookworm-base.toml");
    std::fs::copy(&f.recipe, &recipe).unwrap();
    std::fs::write(recipe.with_extension("lock"), &f.lock_text).unwrap();
    recipe
}

fn build(recipe: &Path, mirror: &str, cache: &Path, out: &Path) -> Output {
    builder(&[
        "base",
        recipe.to_str().unwrap(),
        "--platform",
        "amd64",
        "--mirror",
        mirror,
        "--cache",
        cache.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ])
}

#[test]
fn lock_pins_both_platforms_and_names_no_mirror() {
    let f = fixture();
    let host = debian_mirror();
    let host = host.split("://").nth(1).unwrap().split('/').next().unwrap();
    assert!(!f.lock_text.contains(host), "the lock names the mirror");
    assert!(!f.lock_text.contains("http"));
    assert_eq!(f.lock.base_sha256.len(), 64);
    let arches: Vec<&str> = f.lock.platform.iter().map(|p| p.arch.as_str()).collect();
    assert_eq!(arches, ["amd64", "arm64"]);
    for p in &f.lock.platform {
        let names: BTreeSet<&str> = p.package.iter().map(|d| d.name.as_str()).collect();
        for want in [
            "systemd",
            "dbus",
            "iptables",
            "iproute2",
            "dpkg",
            "base-files",
        ] {
            assert!(names.contains(want), "{} lock lacks {want}", p.arch);
        }
        for d in &p.package {
            assert!(d.path.starts_with("pool/"), "{}", d.path);
            assert!(d.architecture == p.arch || d.architecture == "all");
        }
    }
    ok(builder(&["lock", f.recipe.to_str().unwrap(), "--check"]));
}

#[test]
fn build_twice_from_the_lock_is_identical_and_runs_systemctl() {
    require_tool("chroot", "coreutils");
    let f = fixture();
    let mirror = Mirror::serve(&f.mirror_dir);
    let dir = tempfile::tempdir().unwrap();
    let recipe = copy_recipe(f, dir.path());
    let cache = dir.path().join("cache");
    let a = dir.path().join("a.tar");
    let b = dir.path().join("b.tar");
    // First build: every .deb through the builder's fetch from the loopback mirror.
    let first = ok(build(&recipe, &mirror.url, &cache, &a));
    drop(mirror);
    // Second build: offline (nothing listens on port 1), from the cache only.
    let second = ok(build(&recipe, "http://127.0.0.1:1/debian", &cache, &b));
    let digest = |s: &str| s.split_whitespace().next().unwrap().to_string();
    assert!(digest(&first).starts_with("sha256:"), "{first}");
    assert_eq!(
        digest(&first),
        digest(&second),
        "two builds of one lock differ"
    );
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());

    let root = dir.path().join("rootfs");
    std::fs::create_dir(&root).unwrap();
    let st = Command::new("tar")
        .arg("-xf")
        .arg(&a)
        .arg("-C")
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success());
    let out = Command::new("chroot")
        .arg(&root)
        .args(["systemctl", "--version"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("systemd "));

    // The lock lists exactly the installed packages.
    let out = Command::new("chroot")
        .arg(&root)
        .args([
            "dpkg-query",
            "-W",
            "-f",
            "${Package} ${Version} ${Architecture}\\n",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let installed: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let locked: BTreeSet<String> = f
        .amd64()
        .package
        .iter()
        .map(|d| format!("{} {} {}", d.name, d.version, d.architecture))
        .collect();
    assert_eq!(installed, locked);
    // Normalised: no logs, no machine identity, no build paths.
    assert_eq!(
        std::fs::metadata(root.join("etc/machine-id"))
            .unwrap()
            .len(),
        0
    );
    assert!(!root.join("var/log/dpkg.log").exists());
    assert!(!root.join("etc/hostname").exists());
    assert_eq!(
        std::fs::metadata(root.join("etc/apt/sources.list"))
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn a_deb_whose_bytes_differ_from_the_lock_is_refused() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let recipe = copy_recipe(f, dir.path());
    // A mirror whose copy of one package is altered (same size).
    let victim: Deb = f
        .amd64()
        .package
        .iter()
        .find(|d| d.name == "dbus")
        .unwrap()
        .clone();
    let bad = dir.path().join("mirror");
    for d in &f.amd64().package {
        let target = bad.join("debian").join(&d.path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let mut bytes = std::fs::read(f.mirror_dir.join("debian").join(&d.path)).unwrap();
        if d.name == victim.name {
            let n = bytes.len();
            bytes[n / 2] ^= 0xff;
        }
        std::fs::write(&target, bytes).unwrap();
    }
    let mirror = Mirror::serve(&bad);
    let cache = dir.path().join("cache");
    let out_tar = dir.path().join("out.tar");
    let err = failed(build(&recipe, &mirror.url, &cache, &out_tar));
    assert!(
        err.contains(&format!("{} {}", victim.name, victim.version)),
        "{err}"
    );
    assert!(
        err.contains(&victim.sha256) && err.contains("has sha256"),
        "{err}"
    );
    assert!(!out_tar.exists(), "a failed build wrote its output");
    assert!(!cache.join("sha256").join(&victim.sha256).exists());
    let leftovers: Vec<_> = std::fs::read_dir(cache.join("sha256"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "temp files left in the cache");
}

#[test]
fn a_lock_older_than_the_recipe_is_refused() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let recipe = copy_recipe(f, dir.path());
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(
        &recipe,
        text.replace("\"iproute2\"]", "\"iproute2\", \"less\"]"),
    )
    .unwrap();
    let r = recipe.to_str().unwrap();
    let err = failed(builder(&["lock", r, "--check"]));
    assert!(
        err.contains("is stale") && err.contains(&f.lock.base_sha256),
        "{err}"
    );
    let out_tar = dir.path().join("out.tar");
    let cache = dir.path().join("c");
    let err = failed(build(
        &recipe,
        "http://127.0.0.1:1/debian",
        &cache,
        &out_tar,
    ));
    assert!(err.contains("is stale"), "{err}");
    assert!(!out_tar.exists());
    // No lock at all: the build refuses to run.
    std::fs::remove_file(recipe.with_extension("lock")).unwrap();
    let err = failed(build(
        &recipe,
        "http://127.0.0.1:1/debian",
        &cache,
        &out_tar,
    ));
    assert!(err.contains("has a package base but no lock"), "{err}");
    assert!(!out_tar.exists());
}

#[test]
fn a_package_that_does_not_resolve_is_a_clear_error() {
    require_tool("apt-get", "apt");
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("r.toml");
    let text =
        std::fs::read_to_string(workspace_root().join("testdata/recipes/bookworm-base.toml"))
            .unwrap();
    let text = text
        .replace(
            "\"iproute2\"]",
            "\"iproute2\", \"kubeslot-no-such-package\"]",
        )
        .replace(
            "platforms = [\"linux/amd64\", \"linux/arm64\"]",
            "platforms = [\"linux/amd64\"]",
        );
    std::fs::write(&recipe, text).unwrap();
    let err = failed(builder(&[
        "lock",
        recipe.to_str().unwrap(),
        "--mirror",
        &debian_mirror(),
    ]));
    assert!(
        err.contains("package `kubeslot-no-such-package` does not resolve for amd64"),
        "{err}"
    );
    assert!(
        !recipe.with_extension("lock").exists(),
        "a failed lock wrote a lock"
    );
}
