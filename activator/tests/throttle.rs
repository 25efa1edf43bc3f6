//! A host against a registry that is busy: `kubeslot-activator fetch` (the
//! real binary, on a prepared root) and the image crate's source, reading a
//! signed image from a real Debian `docker-registry` through the test relay
//! (`kubeslot_test_support::relay`), which answers chosen requests with 429
//! or 503 and `Retry-After` (seconds or an HTTP-date) and forwards the rest.
//! What is proven: a host asks for each blob once, and for layers at most
//! `fetch::parallel::LAYERS_AT_ONCE` at a time; refusals are waited out
//! (at least what `Retry-After` asks) and reported (`registry_requests` in report.json, progress lines); the
//! deadline ends a run that cannot finish, at once when `Retry-After`
//! reaches past it; a refusing mirror is left for the registry after three
//! tries.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kubeslot_image::layout::Layout;
use kubeslot_image::oci::ANNOTATION_REF_NAME;
use kubeslot_image::registry::{Registries, RegistrySettings};
use kubeslot_image::retry::{Pacing, Policy};
use kubeslot_image::source::Source;
use kubeslot_image::ImageSource;
use kubeslot_test_support::image::{gzip_layer, key, public_pem, sign, write_image, Built};
use kubeslot_test_support::relay::{Answer, Relay, Seen};
use kubeslot_test_support::tar::tar_of;
use kubeslot_test_support::tools::skopeo_push;
use kubeslot_test_support::Registry;

const BIN: &str = env!("CARGO_BIN_EXE_kubeslot-activator");
const REPO: &str = "test/node";

/// A signed two-layer image tagged v1 in a fresh registry, and the digest
/// of its first layer.
fn registry_with_image() -> (Registry, Built, String, tempfile::TempDir) {
    let reg = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::create(dir.path().join("layout")).unwrap();
    let base = gzip_layer(&layout, &tar_of(&[("etc/os-release", b"ID=test\n")]));
    let app = gzip_layer(&layout, &tar_of(&[("opt/app/version", b"1\n")]));
    let first_layer = base.desc.digest.to_string();
    let built = write_image(&layout, "v1", &[base, app]);
    sign(&layout, built.index, &key(7), "127.0.0.1/test/node");
    for d in &layout.index().unwrap().manifests {
        let tag = &d.annotations[ANNOTATION_REF_NAME];
        skopeo_push(layout.dir(), tag, &format!("{}/{REPO}", reg.host()));
    }
    (reg, built, first_layer, dir)
}

/// A host root with the trusted key and a config for `image`.
struct Host {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Host {
    fn new(image: &str, registries: serde_json::Value, deadline_secs: u64) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("etc/kubeslot")).unwrap();
        fs::write(root.join("etc/kubeslot/trust.pem"), public_pem(&key(7))).unwrap();
        let config = serde_json::json!({
            "image": image,
            "registries": registries,
            "trust": {"public_keys": ["/etc/kubeslot/trust.pem"], "identity": "127.0.0.1/test/node"},
            "kubelet": {
                "api_server": "https://10.0.0.1:6443",
                "ca_data": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                "bootstrap_token": "abcdef.0123456789abcdef",
                "node_name": "node-1",
            },
            "gpu": "off",
            "nameservers": ["192.0.2.53"],
            "download": {"deadline_secs": deadline_secs},
        });
        fs::write(
            root.join("etc/kubeslot/activator.json"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();
        Host { _dir: dir, root }
    }

    fn fetch(&self) -> Output {
        Command::new(BIN)
            .args(["fetch", "--root"])
            .arg(&self.root)
            .output()
            .unwrap()
    }

    /// Runs the activator with `args` against this root.
    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .arg("--root")
            .arg(&self.root)
            .output()
            .unwrap()
    }

    fn report(&self) -> serde_json::Value {
        let bytes = fs::read(self.root.join("var/lib/kubeslot/report.json")).unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The GETs the relay saw for paths containing `part`.
fn gets<'a>(seen: &'a [Seen], part: &str) -> Vec<&'a Seen> {
    seen.iter()
        .filter(|s| s.method == "GET" && s.path.contains(part))
        .collect()
}

#[test]
fn a_host_asks_for_each_blob_once_and_a_few_requests_at_a_time() {
    let (reg, built, _, _d) = registry_with_image();
    // Every request is held a moment: a second one sent meanwhile would
    // be seen waiting beside it.
    let relay = Relay::start(&reg.host(), Duration::from_millis(30), |_, _, _| {
        Answer::Forward
    });
    let host = Host::new(
        &format!("{}/{REPO}:v1", relay.host()),
        serde_json::json!({}),
        60,
    );
    let out = host.fetch();
    assert!(out.status.success(), "{}", stderr(&out));
    let seen = relay.seen();
    let mut paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    paths.sort();
    let before = paths.len();
    paths.dedup();
    assert_eq!(paths.len(), before, "a path was asked twice: {seen:#?}");
    // config + two layers + the signature payload
    assert_eq!(gets(&seen, "/blobs/").len(), 4, "{seen:#?}");
    assert!(seen.iter().all(|s| s.status == 200), "{seen:#?}");
    // Layers come side by side (unpacked while they download), never more
    // than the small limit at once.
    assert!(
        (1..=kubeslot_activator::fetch::parallel::LAYERS_AT_ONCE).contains(&relay.max_waiting()),
        "{} requests overlapped",
        relay.max_waiting()
    );
    let report = host.report();
    assert_eq!(report["digest"], built.manifest.to_string());
    assert_eq!(report["index_digest"], built.index.to_string());
    assert_eq!(report["outcome"], "staged");
    let traffic = &report["registry_requests"];
    assert_eq!(traffic["sent"], seen.len() as u64, "{report:#}");
    assert_eq!(traffic["throttled"], 0);
    assert_eq!(traffic["waited_ms"], 0);
}

/// An HTTP-date (IMF-fixdate) `secs` seconds from now.
fn http_date_in(secs: u64) -> String {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + secs;
    let (days, rem) = (t / 86_400, t % 86_400);
    // civil-from-days (Howard Hinnant), for dates after 1970
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let names = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    format!(
        "{weekday}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        names[month as usize - 1],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[test]
fn refusals_with_retry_after_are_waited_out_and_reported() {
    let (reg, built, layer, _d) = registry_with_image();
    let layer_path = format!("/blobs/{layer}");
    let relay = Relay::start(&reg.host(), Duration::ZERO, move |method, path, n| {
        if n > 0 || method != "GET" {
            Answer::Forward
        } else if path.ends_with("/manifests/v1") {
            Answer::Respond {
                status: 503,
                headers: vec![("Retry-After".into(), http_date_in(2))],
            }
        } else if path.ends_with(&layer_path) {
            Answer::too_many("1")
        } else {
            Answer::Forward
        }
    });
    let host = Host::new(
        &format!("{}/{REPO}:v1", relay.host()),
        serde_json::json!({}),
        60,
    );
    let out = host.fetch();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let seen = relay.seen();
    for (part, status, floor) in [("/manifests/v1", 503, 1000), (&layer[..], 429, 1000)] {
        let asked = gets(&seen, part);
        assert_eq!(asked.len(), 2, "{part}: {seen:#?}");
        assert_eq!((asked[0].status, asked[1].status), (status, 200), "{part}");
        let gap = asked[1].at - asked[0].at;
        assert!(
            gap >= Duration::from_millis(floor),
            "{part}: asked again after {gap:?}, before Retry-After"
        );
    }
    let report = host.report();
    assert_eq!(report["digest"], built.manifest.to_string());
    assert_eq!(report["index_digest"], built.index.to_string());
    let traffic = &report["registry_requests"];
    assert_eq!(traffic["throttled"], 2, "{report:#}");
    assert_eq!(traffic["sent"], seen.len() as u64, "{report:#}");
    assert!(traffic["waited_ms"].as_u64().unwrap() >= 2000, "{report:#}");
    assert!(
        err.contains("HTTP 503 for manifests/v1: waiting")
            && err.contains(&format!("HTTP 429 for blobs/{}", &layer[..19]))
            && err.contains("Retry-After 1, refusal 1")
            && err.contains("2 answered 429/503, waited"),
        "{err}"
    );
}

#[test]
fn a_retry_after_past_the_deadline_fails_at_once_and_names_it() {
    let (reg, _, _, _d) = registry_with_image();
    let relay = Relay::start(&reg.host(), Duration::ZERO, |_, path, _| {
        if path.contains("/manifests/") {
            Answer::too_many("3600")
        } else {
            Answer::Forward
        }
    });
    let host = Host::new(
        &format!("{}/{REPO}:v1", relay.host()),
        serde_json::json!({}),
        30,
    );
    let started = Instant::now();
    let out = host.fetch();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "it waited for the deadline"
    );
    assert!(
        err.contains("HTTP 429 for /v2/test/node/manifests/v1")
            && err.contains("Retry-After of 3600 s reaches past the download deadline"),
        "{err}"
    );
    assert_eq!(relay.seen().len(), 1);
    let report = host.report();
    assert_eq!(report["outcome"], "failed");
    assert_eq!(report["registry_requests"]["throttled"], 1, "{report:#}");
    assert!(!host.root.join("var/lib/machines/kube1").exists());
}

#[test]
fn a_registry_that_keeps_refusing_ends_the_run_at_its_deadline() {
    let (reg, _, _, _d) = registry_with_image();
    let relay = Relay::start(&reg.host(), Duration::ZERO, |_, _, _| Answer::too_many("1"));
    let host = Host::new(
        &format!("{}/{REPO}:v1", relay.host()),
        serde_json::json!({}),
        2,
    );
    let started = Instant::now();
    let out = host.fetch();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "gave up early: {err}"
    );
    assert!(
        err.contains("deadline") && err.contains("download"),
        "{err}"
    );
    let seen = relay.seen();
    assert!(
        seen.len() >= 2 && seen.iter().all(|s| s.status == 429),
        "{seen:#?}"
    );
    let report = host.report();
    assert_eq!(
        report["registry_requests"]["throttled"],
        seen.len() as u64,
        "{report:#}"
    );
}

#[test]
fn a_refusing_mirror_is_left_for_the_registry_after_three_tries() {
    let (reg, built, _, _d) = registry_with_image();
    let mirror = Relay::start(&reg.host(), Duration::ZERO, |_, _, _| Answer::too_many("0"));
    let registries: Registries = BTreeMap::from([(
        reg.host(),
        RegistrySettings {
            mirrors: vec![mirror.host()],
            ..Default::default()
        },
    )]);
    // The library with a short backoff: the rule, not the default timing,
    // is what this test is about.
    let pacing = Arc::new(Pacing::new(Policy {
        base: Duration::from_millis(20),
        ..Policy::default()
    }));
    let scratch = tempfile::tempdir().unwrap();
    let src: ImageSource = format!("{}/{REPO}:v1", reg.host()).parse().unwrap();
    let source = Source::open_paced(&src, &registries, scratch.path(), pacing.clone()).unwrap();
    let top = source.resolve().unwrap();
    assert_eq!(top.digest, built.index);
    let seen = mirror.seen();
    assert_eq!(gets(&seen, "/manifests/v1").len(), 3, "{seen:#?}");
    let t = pacing.traffic();
    assert_eq!((t.sent, t.throttled), (4, 3), "{t:?}");
    assert!(t.waited_ms >= 20, "{t:?}");
}

#[test]
fn plan_and_preflight_report_a_busy_registry_within_their_short_deadline() {
    let (reg, _, _, _d) = registry_with_image();
    // Retry-After fits the run's download deadline (1200 s), not the 30 s
    // a look at the image may take
    let relay = Relay::start(&reg.host(), Duration::ZERO, |_, path, _| {
        if path.contains("/manifests/") {
            Answer::too_many("45")
        } else {
            Answer::Forward
        }
    });
    let host = Host::new(
        &format!("{}/{REPO}:v1", relay.host()),
        serde_json::json!({}),
        1200,
    );
    let out = host.run(&["plan"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("Retry-After of 45 s reaches past the download deadline")
            && err.contains("of 30 s)"),
        "{err}"
    );
    let out = host.run(&["preflight"]);
    let err = stderr(&out);
    assert!(
        err.contains("preflight: image size unknown:")
            && err.contains("Retry-After of 45 s reaches past the download deadline")
            && err.contains("of 30 s)"),
        "{err}"
    );
    // each asked the manifest once and gave up
    assert_eq!(relay.seen().len(), 2, "{:#?}", relay.seen());
}
