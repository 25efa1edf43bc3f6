//! The GitHub workflows (.github/workflows: ci.yml, lock.yml, publish.yml):
//! their static checks (ci/lint/workflows.sh: schema, zizmor, shape) on the
//! real files and on broken copies, and the publishing and lock workflows'
//! steps, run the way the workflows run them: the ci/publish scripts with
//! their inputs in the environment (and nothing else: each call starts from
//! an empty environment), against a real `docker-registry` with htpasswd
//! auth on 127.0.0.1, building the demo recipe offline, and a local bare git
//! repository for `origin` with a stand-in `gh` that records what it was
//! asked. What GitHub runs is what these tests run; only the registry host,
//! the recipe, `gh`'s side and the tools' install step (setup.sh) differ.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubeslot_test_support::{debian_mirror, require_tool, workspace_root, Registry};
use serde_json::Value;

const BUILDER: &str = env!("CARGO_BIN_EXE_kubeslot-builder");
/// The credentials `Registry::start_with_auth` accepts.
const USER: &str = "kubeslot";
const PASSWORD: &str = "s3cret";

fn tools() {
    for (tool, package) in [
        ("skopeo", "skopeo"),
        ("jq", "jq"),
        ("git", "git"),
        ("gpg", "gpg"),
        ("curl", "curl"),
        ("python3", "python3"),
        ("docker-registry", "docker-registry"),
    ] {
        require_tool(tool, package);
    }
}

/// The demo recipe's text with its relative paths made absolute.
fn demo_text() -> String {
    let demo_dir = workspace_root().join("testdata/demo");
    std::fs::read_to_string(workspace_root().join("testdata/recipes/demo.toml"))
        .unwrap()
        .replace("\"../demo/", &format!("\"{}/", demo_dir.display()))
}

/// The release before the demo: tag 1.36.3-demo, kubelet 1.36.3, no crictl.
fn previous_release_text() -> String {
    let text = demo_text()
        .replace("tag = \"1.36.4-demo\"", "tag = \"1.36.3-demo\"")
        .replace(
            "[components.kubelet]\nversion = \"1.36.4\"",
            "[components.kubelet]\nversion = \"1.36.3\"",
        )
        .replace(
            "sha256:35c00e04e2a23baaf9e44b68efd4f97d4b3cd57b219fd924174c13321472e135",
            "sha256:915cea692b750b3cc38146217b51ac1215e7cf68dd42f2e4a1827ecbef65b0c7",
        )
        .replace(
            "sha256:1cb573244372b2d895f644791bac484f81ef978cc900fb1593c66cfa8b2b3cd4",
            "sha256:b53b05ac54ebfe546d6e4c53962344f3bfca99e066db913c9a9a65f8cd52476b",
        );
    let start = text.find("[components.crictl]").expect("demo has crictl");
    let end = start + text[start..].find("[[files]]").unwrap();
    format!("{}{}", &text[..start], &text[end..])
}

/// `DIR/<release>/node.toml`: both releases are the recipe `node`.
fn recipe(dir: &Path, release: &str, text: &str) -> PathBuf {
    let d = dir.join(release);
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("node.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// A key pair from `kubeslot-builder keygen`: (private PEM, public PEM).
fn keypair(dir: &Path, name: &str) -> (String, String) {
    let prefix = dir.join("keys").join(name);
    let out = Command::new(BUILDER)
        .arg("keygen")
        .arg("--out")
        .arg(&prefix)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (
        std::fs::read_to_string(prefix.with_extension("key")).unwrap(),
        std::fs::read_to_string(prefix.with_extension("pub")).unwrap(),
    )
}

/// One workflow run's environment: what the workflows set, pointed at the
/// local registry and a temp dir.
struct Run {
    dir: tempfile::TempDir,
    vars: Vec<(String, String)>,
    /// Every script's stdout and stderr, to look for secrets in.
    transcript: std::cell::RefCell<String>,
}

impl Run {
    fn new(registry: &Registry) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["tmp", "home"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        // The builder the scripts call, through a wrapper that records the
        // mode of the key file `sign` is given.
        let wrapper = d.join("kubeslot-builder");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nprev=\nfor a in \"$@\"; do\n  if [ \"$prev\" = --key ]; then stat -c '%a %n' \"$a\" >>'{}'; fi\n  prev=$a\ndone\nexec '{BUILDER}' \"$@\"\n",
                d.join("key-modes").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let path = |p: &Path| p.display().to_string();
        let vars = vec![
            ("PATH", std::env::var("PATH").unwrap()),
            ("HOME", path(&d.join("home"))),
            ("TMPDIR", path(&d.join("tmp"))),
            ("KUBESLOT_BUILDER", path(&wrapper)),
            ("KUBESLOT_REGISTRY", registry.host()),
            ("KUBESLOT_OUT", path(&d.join("out"))),
            ("KUBESLOT_CACHE", path(&d.join("cache"))),
            ("KUBESLOT_REGISTRY_USER", USER.into()),
            ("KUBESLOT_REGISTRY_PASSWORD", PASSWORD.into()),
            // What Actions sets: the namespace comes from the repository,
            // in the case its owner wrote it.
            ("GITHUB_REPOSITORY", "Test-Owner/KubeSlot".into()),
            ("GITHUB_SERVER_URL", "https://github.invalid".into()),
            (
                "GITHUB_SHA",
                "0123456789abcdef0123456789abcdef01234567".into(),
            ),
            ("GITHUB_STEP_SUMMARY", path(&d.join("summary.md"))),
        ];
        Run {
            dir,
            vars: vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            transcript: Default::default(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn set(&mut self, key: &str, value: &str) {
        self.vars.retain(|(k, _)| k != key);
        self.vars.push((key.into(), value.into()));
    }

    /// Runs `ci/publish/<name>` with the run's variables plus `extra`.
    fn script(&self, name: &str, extra: &[(&str, &str)]) -> Output {
        let out = Command::new(workspace_root().join("ci/publish").join(name))
            .env_clear()
            .envs(self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(extra.iter().copied())
            .current_dir(workspace_root())
            .output()
            .unwrap();
        let mut t = self.transcript.borrow_mut();
        t.push_str(&String::from_utf8_lossy(&out.stdout));
        t.push_str(&String::from_utf8_lossy(&out.stderr));
        out
    }

    fn ok(&self, name: &str, extra: &[(&str, &str)]) -> String {
        let out = self.script(name, extra);
        assert!(
            out.status.success(),
            "{name} failed:\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn fails(&self, name: &str, extra: &[(&str, &str)]) -> String {
        let out = self.script(name, extra);
        assert!(
            !out.status.success(),
            "{name} succeeded:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    }

    fn work(&self) -> PathBuf {
        self.path().join("out/node")
    }
}

/// skopeo with the test registry's credentials.
fn skopeo(args: &[&str]) -> Output {
    let creds = format!("{USER}:{PASSWORD}");
    Command::new("skopeo")
        .arg(args[0])
        .args(["--tls-verify=false", "--creds", &creds])
        .args(&args[1..])
        .output()
        .unwrap()
}

fn tags(image: &str) -> Vec<String> {
    let out = skopeo(&["list-tags", &format!("docker://{image}")]);
    if !out.status.success() {
        return Vec::new();
    }
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["Tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

fn digest_of(reference: &str) -> String {
    let out = skopeo(&["inspect", "--raw", &format!("docker://{reference}")]);
    assert!(out.status.success(), "{out:?}");
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(&out.stdout)))
}

#[test]
fn two_releases_go_through_build_verify_sbom_notes_and_promote() {
    tools();
    let reg = Registry::start_with_auth();
    let mut run = Run::new(&reg);
    let (private, public) = keypair(run.path(), "release");
    run.set("KUBESLOT_PUBLIC_KEY", &public);
    run.set("KUBESLOT_PUSH", "1");
    let image = format!("{}/test-owner/kubeslot/node", reg.host());
    let releases = [
        ("r1", previous_release_text(), "1.36.3-demo"),
        ("r2", demo_text(), "1.36.4-demo"),
    ];
    let mut digests = Vec::new();
    for (i, (name, text, tag)) in releases.iter().enumerate() {
        let r = recipe(run.path(), name, text);
        run.set("KUBESLOT_RECIPE", r.to_str().unwrap());
        let out = run.ok("build.sh", &[("KUBESLOT_SIGNING_KEY", &private)]);
        let pushed = out.lines().last().unwrap().to_string();
        let digest = std::fs::read_to_string(run.work().join("digest"))
            .unwrap()
            .trim()
            .to_string();
        assert_eq!(
            pushed,
            format!("{image}@{digest}"),
            "owner/repository lowercased"
        );
        assert_eq!(digest_of(&format!("{image}:{tag}")), digest);
        assert!(
            run.work().join("node.tar").is_file(),
            "the air-gapped archive"
        );
        run.ok("verify.sh", &[]);
        run.ok("sbom.sh", &[]);
        for arch in ["amd64", "arm64"] {
            let doc: Value = serde_json::from_slice(
                &std::fs::read(run.work().join(format!("sbom/linux-{arch}.spdx.json"))).unwrap(),
            )
            .unwrap();
            let kubelet = doc["packages"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "kubelet")
                .unwrap();
            let want = if i == 0 { "1.36.3" } else { "1.36.4" };
            assert_eq!(kubelet["versionInfo"], want, "{arch}");
        }
        let notes = run.ok("release-notes.sh", &[]);
        if i == 0 {
            assert!(
                notes.contains("First release") && notes.contains("* kubelet 1.36.3"),
                "{notes}"
            );
        } else {
            assert!(
                notes.contains(&format!("Changes since `{image}:latest`")),
                "{notes}"
            );
            assert!(notes.contains("kubelet  1.36.3 -> 1.36.4"), "{notes}");
            assert!(notes.contains("crictl   1.36.0 (added)"), "{notes}");
            let diff: Value =
                serde_json::from_slice(&std::fs::read(run.work().join("diff.json")).unwrap())
                    .unwrap();
            assert_eq!(diff["old"]["digest"], digests[0]);
            assert_eq!(diff["new"]["digest"], digest);
        }
        assert_eq!(
            std::fs::read_to_string(run.work().join("release-notes.md")).unwrap(),
            notes
        );
        run.ok("promote.sh", &[]);
        assert_eq!(digest_of(&format!("{image}:latest")), digest);
        digests.push(digest);
    }

    // One lower-case repository holds both releases, latest, signatures
    // and SBOMs.
    let all = tags(&image);
    for t in ["1.36.3-demo", "1.36.4-demo", "latest"] {
        assert!(all.contains(&t.to_string()), "{all:?}");
    }
    assert!(all.iter().any(|t| t.ends_with(".sig")) && all.iter().any(|t| t.ends_with(".sbom")));
    // The release statements went with the images; the scheduled renewal
    // re-issues latest's, keeping its waves, and reads it back.
    let latest_hex = digests[1].trim_start_matches("sha256:").to_string();
    assert!(
        all.contains(&format!("sha256-{latest_hex}.release")),
        "{all:?}"
    );
    let renewed = run.ok("renew.sh", &[("KUBESLOT_SIGNING_KEY", &private)]);
    assert!(
        renewed.contains(&format!(
            "release statement sha256-{latest_hex}.release for "
        )) && renewed.contains(", expires "),
        "{renewed}"
    );
    assert!(
        run.transcript.borrow().contains("(renewed: schedule kept)"),
        "the renewal started a new schedule"
    );
    // The annotations GitHub's variables give.
    let index: Value = serde_json::from_slice(
        &skopeo(&["inspect", "--raw", &format!("docker://{image}:latest")]).stdout,
    )
    .unwrap();
    assert_eq!(
        index["annotations"]["org.opencontainers.image.revision"],
        "0123456789abcdef0123456789abcdef01234567"
    );
    assert_eq!(
        index["annotations"]["org.opencontainers.image.source"],
        "https://github.invalid/Test-Owner/KubeSlot"
    );
    // Both releases' notes are on the summary page.
    let summary = std::fs::read_to_string(run.path().join("summary.md")).unwrap();
    assert!(summary.contains("## node 1.36.3-demo") && summary.contains("## node 1.36.4-demo"));

    // The key was a 0600 file while `sign` ran, and is gone; nothing is
    // left in TMPDIR.
    let modes = std::fs::read_to_string(run.path().join("key-modes")).unwrap();
    let lines: Vec<&str> = modes.lines().collect();
    // per release: `sign` and `statement issue`; then the renewal's
    assert_eq!(lines.len(), 5, "{modes}");
    for l in lines {
        let (mode, path) = l.split_once(' ').unwrap();
        assert_eq!(mode, "600", "{l}");
        assert!(
            path.starts_with(&run.path().join("tmp").display().to_string()),
            "{l}"
        );
        assert!(!Path::new(path).exists(), "{path} left behind");
    }
    let left: Vec<_> = std::fs::read_dir(run.path().join("tmp")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    // No secret in any output.
    let transcript = run.transcript.borrow();
    let key_body: String = private
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    for secret in [PASSWORD, key_body.as_str()] {
        assert!(
            !transcript.contains(secret),
            "a secret appears in the scripts' output"
        );
    }
    for line in private.lines().filter(|l| !l.starts_with("-----")) {
        assert!(
            !transcript.contains(line),
            "a key line appears in the output"
        );
    }
}

#[test]
fn signatures_by_another_key_are_refused_before_and_after_the_push() {
    tools();
    let reg = Registry::start_with_auth();
    let mut run = Run::new(&reg);
    let (private, public) = keypair(run.path(), "release");
    let (_, other_public) = keypair(run.path(), "other");
    let r = recipe(run.path(), "r", &demo_text());
    run.set("KUBESLOT_RECIPE", r.to_str().unwrap());
    run.set("KUBESLOT_PUSH", "1");
    let image = format!("{}/test-owner/kubeslot/node", reg.host());

    // The secret does not match the key hosts trust: nothing is pushed.
    let err = run.fails(
        "build.sh",
        &[
            ("KUBESLOT_SIGNING_KEY", &private),
            ("KUBESLOT_PUBLIC_KEY", &other_public),
        ],
    );
    assert!(err.contains("signature"), "{err}");
    assert!(tags(&image).is_empty(), "pushed: {:?}", tags(&image));

    run.set("KUBESLOT_PUBLIC_KEY", &public);
    run.ok("build.sh", &[("KUBESLOT_SIGNING_KEY", &private)]);
    run.ok("verify.sh", &[]);
    let err = run.fails("verify.sh", &[("KUBESLOT_PUBLIC_KEY", &other_public)]);
    assert!(err.contains("signature"), "{err}");

    // A signature naming another identity, added in the registry by the
    // same key: the builder's verifier accepts the key, the identity check
    // does not.
    let key_file = run.path().join("keys/release.key");
    let digest = std::fs::read_to_string(run.work().join("digest")).unwrap();
    let out = Command::new(BUILDER)
        .env_clear()
        .env("KUBESLOT_REGISTRY_USER", USER)
        .env("KUBESLOT_REGISTRY_PASSWORD", PASSWORD)
        .args(["--progress", "quiet", "sign", "--key"])
        .arg(&key_file)
        .args(["--identity", "example.invalid/someone/else"])
        .arg(format!("{image}@{}", digest.trim()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = run.fails("verify.sh", &[]);
    assert!(
        err.contains("names example.invalid/someone/else, not") && err.contains(&image),
        "{err}"
    );
}

#[test]
fn pull_request_runs_sign_with_a_throwaway_key_and_publish_nothing() {
    tools();
    let reg = Registry::start_with_auth();
    let mut run = Run::new(&reg);
    let r = recipe(run.path(), "r", &demo_text());
    run.set("KUBESLOT_RECIPE", r.to_str().unwrap());
    let image = format!("{}/test-owner/kubeslot/node", reg.host());

    let err = run.fails("build.sh", &[]);
    assert!(err.contains("KUBESLOT_SIGNING_KEY is not set"), "{err}");
    let err = run.fails(
        "build.sh",
        &[("KUBESLOT_EPHEMERAL_KEY", "1"), ("KUBESLOT_PUSH", "1")],
    );
    assert!(err.contains("would be published"), "{err}");

    run.set("KUBESLOT_EPHEMERAL_KEY", "1");
    run.set("KUBESLOT_PUSH", "0");
    run.ok("build.sh", &[]);
    assert!(run.work().join("ephemeral.pub").is_file());
    assert!(run.work().join("node.tar").is_file());
    assert!(!run.work().join("pushed").exists());
    let err = run.fails("verify.sh", &[("KUBESLOT_PUBLIC_KEY", "unused")]);
    assert!(err.contains("did not push"), "{err}");
    run.ok("sbom.sh", &[]);
    assert!(run.work().join("sbom/linux-arm64.spdx.json").is_file());
    let notes = run.ok("release-notes.sh", &[]);
    assert!(notes.contains("First release"), "{notes}");
    assert!(tags(&image).is_empty(), "a pull request run pushed");

    // Names that cannot be image names are refused up front, naming them.
    let err = run.fails("build.sh", &[("GITHUB_REPOSITORY", "Some Owner/repo")]);
    assert!(err.contains("\"some owner\""), "{err}");
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn lock_script_checks_refreshes_and_pushes_the_lock_with_its_deb_changes() {
    tools();
    require_tool("apt-get", "apt");
    let reg = Registry::start();
    let mut run = Run::new(&reg);
    let d = run.path().to_path_buf();
    // A repository with a pull request branch holding a package-base recipe
    // (amd64 only: one apt resolution) and an old, stale lock.
    git(&d, &["init", "--quiet", "--bare", "origin.git"]);
    git(&d, &["clone", "--quiet", "origin.git", "work"]);
    let work = d.join("work");
    git(&work, &["checkout", "--quiet", "-b", "pr"]);
    std::fs::create_dir(work.join("recipes")).unwrap();
    let text =
        std::fs::read_to_string(workspace_root().join("testdata/recipes/bookworm-base.toml"))
            .unwrap()
            .replace(
                "platforms = [\"linux/amd64\", \"linux/arm64\"]",
                "platforms = [\"linux/amd64\"]",
            );
    std::fs::write(work.join("recipes/base.toml"), text).unwrap();
    let demo = work.join("recipes/demo.toml");
    std::fs::write(&demo, demo_text()).unwrap();
    let zeros = "0".repeat(64);
    std::fs::write(
        work.join("recipes/base.lock"),
        format!(
            "version = 1\nbase_sha256 = \"{zeros}\"\n\n[[platform]]\narch = \"amd64\"\n\n\
             [[platform.release]]\nrepository = \"base\"\nsuite = \"bookworm\"\ninrelease_sha256 = \"{zeros}\"\n\n\
             [[platform.package]]\nname = \"adduser\"\nversion = \"0.0-old\"\narchitecture = \"all\"\n\
             repository = \"base\"\npath = \"pool/main/a/adduser/adduser_0.0-old_all.deb\"\nsize = 1\nsha256 = \"{zeros}\"\n\n\
             [[platform.package]]\nname = \"kubeslot-gone\"\nversion = \"1.0\"\narchitecture = \"all\"\n\
             repository = \"base\"\npath = \"pool/main/k/kubeslot-gone/kubeslot-gone_1.0_all.deb\"\nsize = 1\nsha256 = \"{zeros}\"\n"
        ),
    )
    .unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "--quiet", "-m", "a recipe"]);
    git(&work, &["push", "--quiet", "origin", "pr"]);

    run.set("KUBESLOT_RECIPES", "recipes/demo.toml recipes/base.toml");
    let in_work = |run: &Run, name: &str, extra: &[(&str, &str)]| {
        let out = Command::new(workspace_root().join("ci/publish").join(name))
            .env_clear()
            .envs(run.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(extra.iter().copied())
            .current_dir(&work)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };

    // check: the stale lock fails the run, naming the recipe; the demo has
    // no package base and says so.
    let (ok, _, err) = in_work(&run, "lock.sh", &[]);
    assert!(!ok, "{err}");
    assert!(err.contains("stale lock for recipes/base.toml"), "{err}");
    assert!(err.contains("recipes/demo.toml: no package base"), "{err}");

    // refresh on the pull request: apt resolves, the .deb changes are
    // printed and committed to the branch, the token stays out of git.
    let mirror = debian_mirror();
    run.set("KUBESLOT_LOCK_MIRROR", &mirror);
    let token = "ghs_kubeslot-test-token";
    let (ok, out, err) = in_work(
        &run,
        "lock.sh",
        &[
            ("KUBESLOT_LOCK_MODE", "refresh"),
            ("KUBESLOT_LOCK_BRANCH", "pr"),
            ("GITHUB_TOKEN", token),
        ],
    );
    assert!(ok, "{out}\n{err}");
    let lock: toml::Value =
        toml::from_str(&std::fs::read_to_string(work.join("recipes/base.lock")).unwrap()).unwrap();
    let adduser = lock["platform"][0]["package"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str() == Some("adduser"))
        .unwrap()["version"]
        .as_str()
        .unwrap()
        .to_string();
    for row in [
        format!("| adduser | 0.0-old | {adduser} |"),
        "| kubeslot-gone | 1.0 | – |".to_string(),
    ] {
        assert!(out.contains(&row), "{row} missing from:\n{out}");
    }
    let summary = std::fs::read_to_string(d.join("summary.md")).unwrap();
    assert!(summary.contains("### recipes/base.lock"), "{summary}");
    // The branch on the remote has the lock, in a commit that lists the changes.
    let pushed = git(&d.join("origin.git"), &["show", "pr:recipes/base.lock"]);
    assert_eq!(
        pushed,
        std::fs::read_to_string(work.join("recipes/base.lock")).unwrap()
    );
    let message = git(&d.join("origin.git"), &["log", "-1", "--format=%B", "pr"]);
    assert!(
        message.starts_with("recipes: refresh package-base locks"),
        "{message}"
    );
    assert!(
        message.contains(&format!("| adduser | 0.0-old | {adduser} |")),
        "{message}"
    );
    let config = std::fs::read_to_string(work.join(".git/config")).unwrap();
    assert!(!config.contains(token) && !out.contains(token) && !err.contains(token));

    // check again: up to date.
    let (ok, _, err) = in_work(&run, "lock.sh", &[]);
    assert!(ok, "{err}");
}

#[test]
fn nvidia_key_is_installed_only_with_the_published_fingerprint() {
    tools();
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("gnupg");
    std::fs::create_dir(&home).unwrap();
    let gpg = |args: &[&str]| -> Output {
        let out = Command::new("gpg")
            .arg("--homedir")
            .arg(&home)
            .args(["--batch", "--yes", "--passphrase", ""])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "gpg {args:?}: {out:?}");
        out
    };
    gpg(&[
        "--quick-gen-key",
        "kubeslot test repository key",
        "ed25519",
        "sign",
        "never",
    ]);
    let key = t.path().join("gpgkey");
    gpg(&["--armor", "--output", key.to_str().unwrap(), "--export"]);
    let listing = String::from_utf8(gpg(&["--with-colons", "--list-keys"]).stdout).unwrap();
    let fingerprint = listing
        .lines()
        .find_map(|l| l.strip_prefix("fpr:"))
        .unwrap()
        .trim_matches(':')
        .to_string();
    let keyring = t.path().join("keyrings/nvidia.gpg");
    std::fs::create_dir_all(keyring.parent().unwrap()).unwrap();
    let run = |want: &str| -> Output {
        Command::new(workspace_root().join("ci/publish/nvidia-key.sh"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", t.path())
            .env("NVIDIA_KEY_FINGERPRINT", want)
            .env(
                "KUBESLOT_NVIDIA_KEY_URL",
                format!("file://{}", key.display()),
            )
            .env("KUBESLOT_NVIDIA_KEYRING", &keyring)
            .output()
            .unwrap()
    };
    let wrong = "0123 4567 89AB CDEF 0123  4567 89AB CDEF 0123 4567";
    let out = run(wrong);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&fingerprint) && err.contains("not installed"),
        "{err}"
    );
    assert!(!keyring.exists());
    // As NVIDIA prints it: groups of four, spaces between.
    let spaced: Vec<String> = fingerprint
        .as_bytes()
        .chunks(4)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    let out = run(&spaced.join(" "));
    assert!(out.status.success(), "{out:?}");
    // The installed file is the binary keyring apt's signed-by reads.
    let shown = gpg(&["--with-colons", "--show-keys", keyring.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains(&fingerprint));
}

/// The workflow lint (ci/lint/workflows.sh) on the given files.
fn workflow_lint(files: &[&Path]) -> Output {
    for (tool, package) in [
        ("check-jsonschema", "check-jsonschema (ci/setup.sh)"),
        ("zizmor", "zizmor (ci/setup.sh)"),
    ] {
        require_tool(tool, package);
    }
    Command::new(workspace_root().join("ci/lint/workflows.sh"))
        .args(files)
        .current_dir(workspace_root())
        .output()
        .unwrap()
}

#[test]
fn every_workflow_passes_the_schema_zizmor_and_shape_checks() {
    let dir = workspace_root().join(".github/workflows");
    let out = workflow_lint(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["ci.yml", "lock.yml", "publish.yml"] {
        assert!(
            dir.join(name).is_file(),
            "{name} is not in .github/workflows"
        );
        assert!(
            stdout.contains(&format!(".github/workflows/{name}")),
            "{name} was not checked: {stdout}"
        );
    }
    // What each is for, in the lines GitHub acts on.
    let ci = std::fs::read_to_string(dir.join("ci.yml")).unwrap();
    assert!(ci.contains("runs-on: ubuntu-24.04"), "{ci}");
    assert!(ci.contains("run: ci/test-as-root.sh"), "{ci}");
    let runner = std::fs::read_to_string(workspace_root().join("ci/test-as-root.sh")).unwrap();
    assert!(
        runner.lines().any(|l| l.trim() == "ci/test.sh"),
        "ci/test-as-root.sh does not end in the test command"
    );
    let lock = std::fs::read_to_string(dir.join("lock.yml")).unwrap();
    for want in [
        "  schedule:\n",
        "  workflow_dispatch:\n",
        "KUBESLOT_LOCK_MODE: refresh",
        "KUBESLOT_LOCK_PULL_REQUEST: ",
        "run: ci/publish/lock.sh",
        "contents: write",
        "pull-requests: write",
    ] {
        assert!(lock.contains(want), "lock.yml lacks {want:?}");
    }
}

#[test]
fn the_workflow_lint_refuses_inline_scripts_unpinned_actions_and_default_permissions() {
    let t = tempfile::tempdir().unwrap();
    let good = "name: t\non:\n  workflow_dispatch:\npermissions: {}\njobs:\n  t:\n    runs-on: ubuntu-24.04\n    permissions:\n      contents: read\n    steps:\n      - uses: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683 # v4.2.2\n        with:\n          persist-credentials: false\n      - run: ci/test.sh\n";
    let write = |name: &str, text: &str| {
        let p = t.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let p = write("good.yml", good);
    let out = workflow_lint(&[&p]);
    assert!(out.status.success(), "the well-formed workflow: {out:?}");
    for (name, text, said) in [
        (
            "inline.yml",
            good.replace("run: ci/test.sh", "run: cargo test"),
            "run: must call one script under ci/ (inputs through env:), found: cargo test",
        ),
        // zizmor's own audit
        (
            "unpinned.yml",
            good.replace(
                "actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683 # v4.2.2",
                "actions/checkout@v4.2.2",
            ),
            "error[unpinned-uses]: unpinned action reference",
        ),
        // pinned, but which version it is cannot be read
        (
            "no-version.yml",
            good.replace(" # v4.2.2", ""),
            "uses: must be pinned to a full commit SHA with \"# vX.Y.Z\" after it",
        ),
        (
            "default-permissions.yml",
            good.replace("permissions: {}\n", ""),
            "no top-level \"permissions: {}\"",
        ),
        (
            "no-script.yml",
            good.replace("run: ci/test.sh", "run: ci/no-such-script.sh"),
            "ci/no-such-script.sh is not an executable script",
        ),
    ] {
        let p = write(name, &text);
        let out = workflow_lint(&[&p]);
        let said_all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{name} passed the lint");
        assert!(
            said_all.contains(&format!("{}:", p.display())) && said_all.contains(said),
            "{name}: wanted {said:?} in:\n{said_all}"
        );
    }
}

/// A package-base recipe (amd64 only: one apt resolution) in DIR/recipes,
/// no lock beside it.
fn base_recipe(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("recipes")).unwrap();
    let text =
        std::fs::read_to_string(workspace_root().join("testdata/recipes/bookworm-base.toml"))
            .unwrap()
            .replace(
                "platforms = [\"linux/amd64\", \"linux/arm64\"]",
                "platforms = [\"linux/amd64\"]",
            );
    let p = dir.join("recipes/base.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn publishing_without_a_committed_lock_fails_at_once_naming_the_lock_workflow() {
    tools();
    let reg = Registry::start_with_auth();
    let mut run = Run::new(&reg);
    let recipe = base_recipe(run.path());
    run.set("KUBESLOT_RECIPE", recipe.to_str().unwrap());
    run.set("KUBESLOT_RECIPES", recipe.to_str().unwrap());
    assert!(workspace_root()
        .join(".github/workflows/lock.yml")
        .is_file());

    // The publish job: before any key, build or push.
    let started = std::time::Instant::now();
    let err = run.fails(
        "build.sh",
        &[("KUBESLOT_EPHEMERAL_KEY", "1"), ("KUBESLOT_PUSH", "0")],
    );
    assert!(
        err.contains("has a package base but no lock")
            && err.contains(".github/workflows/lock.yml")
            && err.contains("lock package bases"),
        "{err}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "not at once: {:?}",
        started.elapsed()
    );
    assert!(
        !run.path().join("out").exists(),
        "build.sh wrote its work dir"
    );
    // The lock job of a push (check mode) says the same.
    let err = run.fails("lock.sh", &[]);
    assert!(
        err.contains(&format!("no lock committed for {}", recipe.display()))
            && err.contains(".github/workflows/lock.yml"),
        "{err}"
    );
}

#[test]
fn lock_workflow_opens_a_pull_request_with_the_new_lock_and_updates_it() {
    tools();
    require_tool("apt-get", "apt");
    let reg = Registry::start();
    let mut run = Run::new(&reg);
    let d = run.path().to_path_buf();
    git(&d, &["init", "--quiet", "--bare", "origin.git"]);
    git(&d, &["clone", "--quiet", "origin.git", "work"]);
    let work = d.join("work");
    git(&work, &["checkout", "--quiet", "-b", "main"]);
    base_recipe(&work);
    git(&work, &["add", "."]);
    git(&work, &["commit", "--quiet", "-m", "a recipe, no lock yet"]);
    git(&work, &["push", "--quiet", "origin", "main"]);

    // gh as the workflow's runner has it, recording each call, its token
    // and repository and the description it was given; `pr list` answers
    // the number in gh-open (none at first).
    let bin = d.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let gh = bin.join("gh");
    std::fs::write(
        &gh,
        format!(
            "#!/bin/sh\nd='{}'\nprintf '%s\\n' \"$*\" >>\"$d/gh-calls\"\nprintf 'token=%s repo=%s\\n' \"$GH_TOKEN\" \"$GH_REPO\" >>\"$d/gh-env\"\n\
             prev=\nfor a in \"$@\"; do [ \"$prev\" = --body-file ] && cp \"$a\" \"$d/gh-body.md\"; prev=$a; done\n\
             case \"$1 $2\" in\n  'pr list') cat \"$d/gh-open\" 2>/dev/null || true ;;\n  'pr create') echo 7 >\"$d/gh-open\"; echo https://github.invalid/pull/7 ;;\nesac\n",
            d.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&gh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    run.set("PATH", &path);
    run.set("KUBESLOT_RECIPES", "recipes/base.toml");
    run.set("KUBESLOT_LOCK_MIRROR", &debian_mirror());
    let token = "ghs_kubeslot-lock-token";
    let branch = "kubeslot/lock-refresh";
    let lock_run = |run: &Run| {
        let out = Command::new(workspace_root().join("ci/publish/lock.sh"))
            .env_clear()
            .envs(run.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs([
                ("KUBESLOT_LOCK_MODE", "refresh"),
                ("KUBESLOT_LOCK_PULL_REQUEST", branch),
                ("GITHUB_REF_NAME", "main"),
                ("GITHUB_TOKEN", token),
            ])
            .current_dir(&work)
            .output()
            .unwrap();
        let (o, e) = (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        assert!(out.status.success(), "lock.sh:\n{o}\n{e}");
        assert!(
            !o.contains(token) && !e.contains(token),
            "the token was printed"
        );
        (o, e)
    };
    let calls = || std::fs::read_to_string(d.join("gh-calls")).unwrap_or_default();
    let origin = d.join("origin.git");
    let back_to_main = || {
        git(&work, &["checkout", "--quiet", "-f", "main"]);
        git(&work, &["reset", "--quiet", "--hard", "origin/main"]);
        git(&work, &["clean", "--quiet", "-fd"]);
    };

    // The first lock: a branch with it, and a pull request into main whose
    // description is lock-diff.py's summary; main itself is untouched.
    let (_, err) = lock_run(&run);
    assert!(err.contains("opened a pull request"), "{err}");
    let lock = std::fs::read_to_string(work.join("recipes/base.lock")).unwrap();
    assert_eq!(
        git(&origin, &["show", &format!("{branch}:recipes/base.lock")]),
        lock
    );
    assert_eq!(
        git(&origin, &["ls-tree", "--name-only", "main", "recipes/"]),
        "recipes/base.toml\n"
    );
    let c = calls();
    assert!(
        c.contains(&format!("pr list --head {branch} --base main --state open"))
            && c.contains(&format!(
                "pr create --base main --head {branch} --title recipes: refresh package-base locks --body-file "
            )),
        "{c}"
    );
    let body = std::fs::read_to_string(d.join("gh-body.md")).unwrap();
    for want in [
        "### recipes/base.lock",
        "A new lock (no earlier one).",
        "amd64: 0 → ",
        ".github/workflows/lock.yml",
    ] {
        assert!(body.contains(want), "{want:?} missing from:\n{body}");
    }
    assert_eq!(
        std::fs::read_to_string(d.join("gh-env"))
            .unwrap()
            .lines()
            .last(),
        Some("token=ghs_kubeslot-lock-token repo=Test-Owner/KubeSlot")
    );
    let config = std::fs::read_to_string(work.join(".git/config")).unwrap();
    assert!(!config.contains(token), "the token is in .git/config");
    let first = git(&origin, &["rev-parse", branch]);

    // A week without new versions: the same lock, the branch left as it
    // is, the open pull request's description updated.
    back_to_main();
    let (_, err) = lock_run(&run);
    assert!(
        err.contains("already has these locks: not pushed again"),
        "{err}"
    );
    assert_eq!(git(&origin, &["rev-parse", branch]), first);
    assert!(calls().contains("pr edit 7 --title recipes: refresh package-base locks --body-file "));
    assert_eq!(calls().matches("pr create").count(), 1);

    // The recipe changed on main: the branch is made again from main (force
    // pushed over the old one) with the new lock, the same pull request.
    back_to_main();
    let text = std::fs::read_to_string(work.join("recipes/base.toml")).unwrap();
    assert!(text.contains("packages = ["), "{text}");
    std::fs::write(
        work.join("recipes/base.toml"),
        text.replacen("packages = [", "packages = [\"less\", ", 1),
    )
    .unwrap();
    git(&work, &["commit", "--quiet", "-am", "less in the base"]);
    git(&work, &["push", "--quiet", "origin", "main"]);
    let (_, err) = lock_run(&run);
    assert!(err.contains(&format!("to {branch}")), "{err}");
    let second = git(&origin, &["rev-parse", branch]);
    assert_ne!(second, first);
    assert_eq!(
        git(&origin, &["rev-parse", &format!("{branch}~1")]),
        git(&origin, &["rev-parse", "main"]),
        "the branch is not one commit on top of main"
    );
    assert!(
        git(&origin, &["show", &format!("{branch}:recipes/base.lock")]).contains("name = \"less\"")
    );
    assert_eq!(calls().matches("pr edit 7").count(), 2);
    assert_eq!(calls().matches("pr create").count(), 1);
}
