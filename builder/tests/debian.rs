//! Black-box tests of the Debian package base: `lock`, `lock --check`,
//! `build` (and `base`) of `testdata/recipes/bookworm-base.toml` against
//! Debian bookworm from this machine's configured mirror. `.deb`s reach the
//! machine only through apt (`lock --download`) and are then served by a
//! loopback `python3 -m http.server`, which the builder's own fetch uses;
//! apt's downloads are cached under /var/cache/kubeslot-test/apt-debs/ by
//! sha256, so only the first run on a machine downloads them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

use kubeslot_test_support::tar::sha256_hex;
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
    size: u64,
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
            // apt downloads the amd64 set only (an amd64-only copy of the
            // recipe, in its own directory: its lock is thrown away).
            let dl = dir.path().join("download");
            let only = dir.path().join("amd64-only");
            std::fs::create_dir(&only).unwrap();
            let only_recipe = only.join("bookworm-base.toml");
            std::fs::write(
                &only_recipe,
                std::fs::read_to_string(&recipe).unwrap().replace(
                    "platforms = [\"linux/amd64\", \"linux/arm64\"]",
                    "platforms = [\"linux/amd64\"]",
                ),
            )
            .unwrap();
            ok(builder(&[
                "lock",
                only_recipe.to_str().unwrap(),
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

/// A temp copy of the recipe and its lock, building amd64 only (the host:
/// arm64 is locked but installing it needs qemu-user). `platforms` is outside
/// `[base]`, so the lock stays current.
fn copy_recipe(f: &Fixture, dir: &Path) -> PathBuf {
    let recipe = dir.join("bookworm-base.toml");
    let text = std::fs::read_to_string(&f.recipe).unwrap().replace(
        "platforms = [\"linux/amd64\", \"linux/arm64\"]",
        "platforms = [\"linux/amd64\"]",
    );
    assert!(text.contains("platforms = [\"linux/amd64\"]"));
    std::fs::write(&recipe, text).unwrap();
    std::fs::write(recipe.with_extension("lock"), &f.lock_text).unwrap();
    recipe
}

/// `build RECIPE --mirror MIRROR --cache CACHE --output oci:OUT --json`.
fn build(recipe: &Path, mirror: &str, cache: &Path, out: &Path) -> Output {
    builder(&[
        "build",
        recipe.to_str().unwrap(),
        "--mirror",
        mirror,
        "--cache",
        cache.to_str().unwrap(),
        "--progress",
        "quiet",
        "--json",
        "--output",
        &format!("oci:{}", out.display()),
    ])
}

/// (group, layer digest) of the single manifest of a `build --json` summary.
fn layers(summary: &str) -> Vec<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(summary).unwrap();
    let manifests = v["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{summary}");
    manifests[0]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["group"].as_str().unwrap().to_string(),
                l["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Unpacks the layer of `group` from the layout `out` into `dest`.
fn unpack_layer(out: &Path, summary: &str, group: &str, dest: &Path) {
    let (_, digest) = layers(summary)
        .into_iter()
        .find(|(g, _)| g == group)
        .unwrap_or_else(|| panic!("no layer {group}: {summary}"));
    let blob = out
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap());
    std::fs::create_dir_all(dest).unwrap();
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(&blob)
        .arg("-C")
        .arg(dest)
        .status()
        .unwrap();
    assert!(st.success(), "tar -xzf {}", blob.display());
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
        // The recipe's packages and the minbase (Essential + required).
        for want in [
            "systemd",
            "dbus",
            "iptables",
            "iproute2",
            "dpkg",
            "base-files",
            "apt",
            "mawk",
        ] {
            assert!(names.contains(want), "{} lock lacks {want}", p.arch);
        }
        assert_eq!(names.len(), p.package.len(), "a package is locked twice");
        for d in &p.package {
            assert!(d.path.starts_with("pool/"), "{}", d.path);
            assert!(d.architecture == p.arch || d.architecture == "all");
            assert_eq!(d.sha256.len(), 64);
            assert!(d.size > 0);
        }
    }
    let out = ok(builder(&["lock", f.recipe.to_str().unwrap(), "--check"]));
    assert!(out.contains("up to date"), "{out}");
    let out = ok(builder(&[
        "--json",
        "lock",
        f.recipe.to_str().unwrap(),
        "--check",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["base_sha256"], f.lock.base_sha256.as_str());
    assert_eq!(v["platforms"]["amd64"], f.amd64().package.len());
}

#[test]
fn build_twice_from_the_lock_is_identical_runs_systemctl_and_lists_every_package() {
    require_tool("chroot", "coreutils");
    require_tool("tar", "tar");
    let f = fixture();
    let mirror = Mirror::serve(&f.mirror_dir);
    let dir = tempfile::tempdir().unwrap();
    let recipe = copy_recipe(f, dir.path());
    let cache = dir.path().join("cache");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    // First build: every .deb through the builder's fetch from the loopback mirror.
    let first = ok(build(&recipe, &mirror.url, &cache, &a));
    drop(mirror);
    // Second build: offline (nothing listens on port 1), from the cache only.
    let second = ok(build(&recipe, "http://127.0.0.1:1/debian", &cache, &b));
    let (la, lb) = (layers(&first), layers(&second));
    assert_eq!(la[0].0, "base");
    assert_eq!(
        la[0], lb[0],
        "two builds of one lock give different base layers"
    );
    assert_eq!(la, lb);
    let index = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap()["index"].clone();
    assert_eq!(index(&first), index(&second));

    let root = dir.path().join("rootfs");
    unpack_layer(&a, &first, "base", &root);
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
            "${Package} ${Version} ${Architecture} ${db:Status-Abbrev}\\n",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let installed: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end().to_string())
        .collect();
    let locked: BTreeSet<String> = f
        .amd64()
        .package
        .iter()
        .map(|d| format!("{} {} {} ii", d.name, d.version, d.architecture))
        .collect();
    assert_eq!(installed, locked);
    // Normalised: no logs, no machine identity, no build paths.
    let len = |p: &str| std::fs::metadata(root.join(p)).unwrap().len();
    assert_eq!(len("etc/machine-id"), 0);
    assert_eq!(len("etc/apt/sources.list"), 0);
    assert!(!root.join("var/log/dpkg.log").exists());
    assert!(!root.join("etc/hostname").exists());
    assert!(!root.join("var/cache/ldconfig/aux-cache").exists());
    assert!(!root.join("etc/dpkg/dpkg.cfg.d/99mmdebstrap").exists());
    assert!(!root.join("etc/apt/apt.conf.d/99mmdebstrap").exists());

    // The SBOM embedded in the image lists every locked package.
    let sbom_root = dir.path().join("sbom");
    unpack_layer(&a, &first, "sbom", &sbom_root);
    let text =
        std::fs::read_to_string(sbom_root.join("usr/share/kubeslot/sbom.spdx.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let listed: BTreeSet<(String, String, String)> = doc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| {
            let purl = p["externalRefs"]
                .as_array()?
                .iter()
                .find(|r| r["referenceType"] == "purl")?["referenceLocator"]
                .as_str()?
                .to_string();
            Some((
                p["name"].as_str()?.to_string(),
                p["checksums"][0]["checksumValue"].as_str()?.to_string(),
                purl,
            ))
        })
        .filter(|(_, _, purl)| purl.starts_with("pkg:deb/"))
        .collect();
    let want: BTreeSet<(String, String, String)> = f
        .amd64()
        .package
        .iter()
        .map(|d| {
            let version = d.version.replace(':', "%3A").replace('+', "%2B");
            (
                d.name.clone(),
                d.sha256.clone(),
                format!(
                    "pkg:deb/debian/{}@{version}?arch={}",
                    d.name, d.architecture
                ),
            )
        })
        .collect();
    assert_eq!(listed, want, "the SBOM's .debs differ from the lock");
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
    let mut actual = String::new();
    for d in &f.amd64().package {
        let target = bad.join("debian").join(&d.path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let mut bytes = std::fs::read(f.mirror_dir.join("debian").join(&d.path)).unwrap();
        if d.name == victim.name {
            let n = bytes.len();
            bytes[n / 2] ^= 0xff;
            assert_eq!(bytes.len() as u64, victim.size);
            actual = sha256_hex(&bytes);
        }
        std::fs::write(&target, bytes).unwrap();
    }
    let mirror = Mirror::serve(&bad);
    let cache = dir.path().join("cache");
    let out = dir.path().join("out");
    let err = failed(build(&recipe, &mirror.url, &cache, &out));
    assert!(
        err.contains(&format!("deb {} {}", victim.name, victim.version)),
        "the error does not name the package: {err}"
    );
    assert!(
        err.contains(&format!("expected sha256:{}", victim.sha256)),
        "the error does not name the expected digest: {err}"
    );
    assert!(
        err.contains(&format!("got sha256:{actual}")),
        "the error does not name the actual digest: {err}"
    );
    assert!(!out.exists(), "a failed build wrote its output");
    let cached: Vec<String> = std::fs::read_dir(cache.join("sha256"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(!cached.contains(&victim.sha256));
    assert!(!cached.contains(&actual));
    assert!(
        cached.iter().all(|n| n.len() == 64 && !n.starts_with('.')),
        "temp files left in the cache: {cached:?}"
    );
}

/// A locked package the mirror no longer has: the build names it and the
/// URL's status, and writes nothing.
#[test]
fn a_locked_deb_missing_from_the_mirror_is_named() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let recipe = copy_recipe(f, dir.path());
    let gone = f
        .amd64()
        .package
        .iter()
        .find(|d| d.name == "iproute2")
        .unwrap();
    let partial = dir.path().join("mirror");
    for d in f.amd64().package.iter().filter(|d| d.name != gone.name) {
        let target = partial.join("debian").join(&d.path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::hard_link(f.mirror_dir.join("debian").join(&d.path), &target)
            .or_else(|_| {
                std::fs::copy(f.mirror_dir.join("debian").join(&d.path), &target).map(drop)
            })
            .unwrap();
    }
    let mirror = Mirror::serve(&partial);
    let out = dir.path().join("out");
    let err = failed(build(&recipe, &mirror.url, &dir.path().join("cache"), &out));
    assert!(
        err.contains(&format!("deb {} {}", gone.name, gone.version))
            && err.contains(&gone.path)
            && err.contains("404"),
        "{err}"
    );
    assert!(!out.exists());
}

#[test]
fn a_lock_older_than_the_recipe_or_none_is_refused() {
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
    let out = dir.path().join("out");
    let cache = dir.path().join("c");
    let offline = "http://127.0.0.1:1/debian";
    let err = failed(build(&recipe, offline, &cache, &out));
    assert!(err.contains("is stale"), "{err}");
    assert!(!out.exists());
    assert!(!cache.exists(), "a refused build fetched something");
    let tar = dir.path().join("base.tar");
    let err = failed(builder(&[
        "base",
        r,
        "--mirror",
        offline,
        "--output",
        tar.to_str().unwrap(),
    ]));
    assert!(err.contains("is stale"), "{err}");
    assert!(!tar.exists());
    // No lock at all: the build refuses to run.
    std::fs::remove_file(recipe.with_extension("lock")).unwrap();
    let err = failed(build(&recipe, offline, &cache, &out));
    assert!(err.contains("has a package base but no lock"), "{err}");
    assert!(!out.exists());
    let err = failed(builder(&["lock", r, "--check"]));
    assert!(err.contains("has a package base but no lock"), "{err}");
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

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A flat extra repository (like NVIDIA's: `suite = "/"`, `$(ARCH)` in its
/// URL, its own keyring) is resolved into the same lock: a throwaway-signed
/// loopback repository with one package built here with dpkg-deb.
#[test]
fn an_extra_flat_repository_is_locked_with_its_own_keyring() {
    require_tool("gpg", "gpg");
    require_tool("dpkg-deb", "dpkg");
    require_tool("apt-ftparchive", "apt-utils");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The package.
    let pkg = d.join("pkg");
    std::fs::create_dir_all(pkg.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(pkg.join("usr/share/kubeslot-test-extra")).unwrap();
    std::fs::write(
        pkg.join("DEBIAN/control"),
        "Package: kubeslot-test-extra\nVersion: 1.0-1\nArchitecture: all\n\
         Maintainer: kubeslot tests <tests@kubeslot.invalid>\n\
         Description: a package of an extra repository\n",
    )
    .unwrap();
    std::fs::write(pkg.join("usr/share/kubeslot-test-extra/hello"), "hello\n").unwrap();
    let repo = d.join("serve/extra/amd64");
    std::fs::create_dir_all(&repo).unwrap();
    let deb_path = repo.join("kubeslot-test-extra_1.0-1_all.deb");
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zgzip", "--build"])
        .arg(&pkg)
        .arg(&deb_path));
    // The flat repository, signed with a throwaway key.
    let packages = Command::new("apt-ftparchive")
        .args(["packages", "."])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(packages.status.success());
    std::fs::write(repo.join("Packages"), &packages.stdout).unwrap();
    let release = Command::new("apt-ftparchive")
        .args(["release", "."])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(release.status.success());
    std::fs::write(repo.join("Release"), &release.stdout).unwrap();
    let home = d.join("gnupg");
    std::fs::create_dir(&home).unwrap();
    let gpg = || {
        let mut c = Command::new("gpg");
        c.arg("--homedir").arg(&home).args(["--batch", "--yes"]);
        c
    };
    run(gpg().args([
        "--passphrase",
        "",
        "--quick-gen-key",
        "kubeslot test extra repository",
        "ed25519",
        "sign",
        "never",
    ]));
    run(gpg()
        .arg("--clearsign")
        .arg("--output")
        .arg(repo.join("InRelease"))
        .arg(repo.join("Release")));
    let keyring = d.join("extra.gpg");
    run(gpg().arg("--output").arg(&keyring).arg("--export"));
    let mirror = Mirror::serve(&d.join("serve"));
    let extra_url = format!("{}/extra/$(ARCH)", mirror.url.trim_end_matches("/debian"));

    let recipe = d.join("r.toml");
    let text =
        std::fs::read_to_string(workspace_root().join("testdata/recipes/bookworm-base.toml"))
            .unwrap()
            .replace(
                "platforms = [\"linux/amd64\", \"linux/arm64\"]",
                "platforms = [\"linux/amd64\"]",
            );
    let text = format!(
        "{text}\n[[base.extra_repositories]]\nname = \"extra\"\nurl = \"{extra_url}\"\n\
         suite = \"/\"\nkeyring = \"extra.gpg\"\npackages = [\"kubeslot-test-extra\"]\n"
    );
    std::fs::write(&recipe, text).unwrap();
    ok(builder(&[
        "lock",
        recipe.to_str().unwrap(),
        "--mirror",
        &debian_mirror(),
    ]));
    let lock_text = std::fs::read_to_string(recipe.with_extension("lock")).unwrap();
    assert!(
        !lock_text.contains("127.0.0.1"),
        "the lock names the mirror"
    );
    let lock: toml::Value = toml::from_str(&lock_text).unwrap();
    let platform = &lock["platform"][0];
    let releases: Vec<&str> = platform["release"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["repository"].as_str().unwrap())
        .collect();
    assert_eq!(releases, ["base", "extra"]);
    let inrelease = sha256_hex(&std::fs::read(repo.join("InRelease")).unwrap());
    assert_eq!(
        platform["release"][1]["inrelease_sha256"].as_str(),
        Some(inrelease.as_str())
    );
    let extra: Vec<&toml::Value> = platform["package"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["repository"].as_str() == Some("extra"))
        .collect();
    assert_eq!(extra.len(), 1, "{lock_text}");
    let deb = std::fs::read(&deb_path).unwrap();
    assert_eq!(extra[0]["name"].as_str(), Some("kubeslot-test-extra"));
    assert_eq!(
        extra[0]["path"].as_str(),
        Some("kubeslot-test-extra_1.0-1_all.deb")
    );
    assert_eq!(extra[0]["sha256"].as_str(), Some(sha256_hex(&deb).as_str()));
    assert_eq!(extra[0]["size"].as_integer(), Some(deb.len() as i64));

    // A repository signed by another key than the recipe names: refused.
    let other = d.join("gnupg2");
    std::fs::create_dir(&other).unwrap();
    run(Command::new("gpg").arg("--homedir").arg(&other).args([
        "--batch",
        "--passphrase",
        "",
        "--quick-gen-key",
        "someone else",
        "ed25519",
        "sign",
        "never",
    ]));
    run(Command::new("gpg")
        .arg("--homedir")
        .arg(&other)
        .arg("--batch")
        .arg("--yes")
        .arg("--output")
        .arg(&keyring)
        .arg("--export"));
    std::fs::remove_file(recipe.with_extension("lock")).unwrap();
    let err = failed(builder(&[
        "lock",
        recipe.to_str().unwrap(),
        "--mirror",
        &debian_mirror(),
    ]));
    assert!(
        err.contains("apt-get update") && err.contains("NO_PUBKEY"),
        "{err}"
    );
    assert!(!recipe.with_extension("lock").exists());
}
