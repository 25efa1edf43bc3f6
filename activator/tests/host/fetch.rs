//! `fetch` (the inactive slot staged, the running machine left alone, a crash
//! at any step), `gc` and `verify-layers`: what the stores hold.

use super::*;

#[test]
fn fetch_stages_the_inactive_slot_without_touching_the_running_machine() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    let kube1 = h.slot_snapshot(Slot::Kube1);
    h.clear_calls();

    let (code, out, err) = h.cmd(&["fetch", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let r = json(&out, &err);
    assert_eq!(r["command"], "fetch");
    assert_eq!(r["outcome"], "staged", "{r:#}");
    assert_eq!(r["slot"], "kube2");
    assert_eq!(r["digest"], img.v2.to_string());
    assert!(
        r["downloads"]["blobs_fetched"].as_u64().unwrap() >= 1,
        "{r:#}"
    );
    assert_eq!(h.report(), r);
    // nothing a running machine uses was touched, nothing was called
    assert!(h.changes().is_empty(), "{:?}", h.changes());
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.slot_snapshot(Slot::Kube1), kube1);
    assert!(!root.nspawn_file("kube2").exists());
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube1));
    assert_eq!(s.slot(Slot::Kube2).status, SlotStatus::Staged);
    assert_eq!(s.slot(Slot::Kube2).digest, Some(img.v2));
    assert_eq!(h.tree_version(Slot::Kube2), "kubelet v2\n");
    let tree = root.machine_tree("kube2");
    let staged_inode = inode(&tree);

    // again: already staged, nothing downloaded or unpacked
    let (code, out, err) = h.cmd(&["fetch", "--json"]);
    assert_eq!(code, 0, "{err}");
    let r = json(&out, &err);
    assert_eq!(r["outcome"], "staged");
    assert!(r.get("downloads").is_none(), "{r:#}");
    assert_eq!(inode(&tree), staged_inode);

    // the fetch replaced what a rollback would have used (here: nothing
    // committed before kube1 yet), so rollback is refused, nothing touched
    let (code, _, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("kube2") && err.contains("(status staged)"),
        "{err}"
    );
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());

    // activate flips to the staged slot without staging it again
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["outcome"], "committed");
    assert!(r.get("downloads").is_none(), "restaged: {r:#}");
    assert_eq!(inode(&tree), staged_inode, "the slot tree was replaced");
    assert_eq!(h.running(), [Slot::Kube2]);
    assert_eq!(h.state().slot(Slot::Kube2).digest, Some(img.v2));

    // the active slot runs the image: nothing to fetch
    let (code, out, err) = h.cmd(&["fetch", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out, &err)["outcome"], "up-to-date");
}

#[test]
fn a_fetch_killed_at_any_step_leaves_the_running_machine_alone_and_the_next_run_converges() {
    let img = images();
    let cases = [
        "after-lock",
        "after-recover",
        "after-unpack",
        "after-mark-dirty",
        "after-stage",
        "after-staged",
        "state-between-writes",
    ];
    for chunk in cases.chunks(3) {
        std::thread::scope(|scope| {
            for fp in chunk {
                let img = &img;
                scope.spawn(move || fetch_crash_case(img, fp));
            }
        });
    }
}

fn fetch_crash_case(img: &Images, fp: &str) {
    // kube2 runs v2, kube1 keeps v1 for rollback; the fetch stages v4
    // over kube1
    let h = Host::new(img);
    assert_eq!(h.activate().0, 0, "{fp}");
    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0, "{fp}");
    h.set_config("v4", serde_json::json!({}));
    let active = h.slot_snapshot(Slot::Kube2);
    h.clear_calls();

    let out = h.run(&["fetch"], Some(fp));
    assert_eq!(
        out.status.signal(),
        Some(6),
        "{fp}: no abort: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(h.slot_snapshot(Slot::Kube2), active, "{fp}");
    assert_eq!(h.running(), [Slot::Kube2], "{fp}");
    assert!(h.changes().is_empty(), "{fp}: {:?}", h.changes());
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube2), "{fp}");
    assert_eq!(s.slot(Slot::Kube2).status, SlotStatus::Active, "{fp}");
    // the state never claims more than kube1's tree holds
    match (s.slot(Slot::Kube1).status, s.slot(Slot::Kube1).digest) {
        (SlotStatus::Previous, Some(d)) => {
            assert_eq!(d, img.v1, "{fp}");
            assert_eq!(h.tree_version(Slot::Kube1), "kubelet v1\n", "{fp}");
        }
        (SlotStatus::Staged, Some(d)) => {
            assert_eq!(d, img.v4, "{fp}");
            assert_eq!(h.tree_version(Slot::Kube1), "kubelet v4\n", "{fp}");
        }
        (SlotStatus::Dirty, None) => {}
        other => panic!("{fp}: kube1 is {other:?}"),
    }

    // the next fetch converges without touching the running machine
    let (code, out, err) = h.cmd(&["fetch", "--json"]);
    assert_eq!(code, 0, "{fp}: {out}\n{err}");
    assert_eq!(json(&out, &err)["outcome"], "staged", "{fp}");
    let s = h.state();
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Staged, "{fp}");
    assert_eq!(s.slot(Slot::Kube1).digest, Some(img.v4), "{fp}");
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v4\n", "{fp}");
    assert!(h.changes().is_empty(), "{fp}: {:?}", h.changes());
    assert_eq!(h.slot_snapshot(Slot::Kube2), active, "{fp}");

    // and activate only flips
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{fp}: {err}\n{r:#}");
    assert!(r.get("downloads").is_none(), "{fp}: {r:#}");
    assert_eq!(h.running(), [Slot::Kube1], "{fp}");
}

/// The blobs image `m` (a manifest in the test layout) is made of: the
/// manifest, its config and its layers, as the layout (not the store) says.
fn blobs_of(layout: &Path, m: Digest) -> std::collections::BTreeSet<String> {
    let l = kubeslot_image::layout::Layout::open(layout).unwrap();
    let man: kubeslot_image::oci::Manifest = l.read_json(&m, None).unwrap();
    std::iter::once(m)
        .chain(std::iter::once(man.config.digest))
        .chain(man.layers.iter().map(|d| d.digest))
        .map(|d| d.hex())
        .collect()
}

fn store_listing(h: &Host) -> std::collections::BTreeSet<String> {
    fs::read_dir(h.root().join("var/lib/kubeslot/blobs/sha256"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// `gc` keeps what the two slots' images need and removes the rest: an
/// orphan blob and a stale partial go (bytes freed counted), `--dry-run`
/// removes nothing, a partial a live fetch holds stays; after a third
/// release the post-commit collection leaves only the two slots' blobs.
#[test]
fn gc_keeps_the_two_slots_images_and_removes_the_rest() {
    use std::collections::BTreeSet;
    let img = images();
    let h = Host::new(&img);
    for v in ["v1", "v2"] {
        h.set_config(v, serde_json::json!({}));
        let (code, r, err) = h.activate();
        assert_eq!(code, 0, "{v}: {err}\n{r:#}");
    }
    let both: BTreeSet<String> = blobs_of(&img.layout, img.v1)
        .union(&blobs_of(&img.layout, img.v2))
        .cloned()
        .collect();
    assert_eq!(store_listing(&h), both);

    let store = h.root().join("var/lib/kubeslot/blobs/sha256");
    let orphan = b"a blob no image names";
    let orphan_digest = Digest::of(orphan);
    fs::write(store.join(orphan_digest.hex()), orphan).unwrap();
    let stale = store.join(format!(".partial-{}", "a".repeat(64)));
    fs::write(&stale, b"half a download").unwrap();
    let held = store.join(format!(".partial-{}", "b".repeat(64)));
    fs::write(&held, b"being downloaded").unwrap();
    let held_file = fs::File::open(&held).unwrap();
    rustix::fs::flock(&held_file, rustix::fs::FlockOperation::LockExclusive).unwrap();

    let before = store_listing(&h);
    let (code, out, err) = h.cmd(&["gc", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{err}");
    let dry: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        dry["removed_blobs"],
        serde_json::json!([orphan_digest.to_string()])
    );
    assert_eq!(store_listing(&h), before, "--dry-run removed something");

    let (code, out, err) = h.cmd(&["gc", "--json"]);
    assert_eq!(code, 0, "{err}");
    let done: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(done["removed_blobs"], dry["removed_blobs"]);
    assert_eq!(
        done["removed_partials"],
        serde_json::json!([stale.display().to_string()])
    );
    assert_eq!(
        done["bytes_freed"],
        (orphan.len() + b"half a download".len()) as u64
    );
    assert_eq!(done["kept_blobs"], both.len());
    assert!(held.exists(), "a partial a live fetch holds was removed");
    assert!(!stale.exists());
    drop(held_file);
    fs::remove_file(&held).unwrap();

    // A third release: the commit's collection leaves kube1 (v4) and kube2 (v2).
    h.set_config("v4", serde_json::json!({}));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert!(r["gc"].as_str().unwrap().starts_with("removed "), "{r:#}");
    let want: BTreeSet<String> = blobs_of(&img.layout, img.v2)
        .union(&blobs_of(&img.layout, img.v4))
        .cloned()
        .collect();
    assert_eq!(store_listing(&h), want);
}

/// `verify-layers`: an intact layer store passes; a file of a lower layer
/// changed behind the activator's back is named, and so is a file added.
#[test]
fn verify_layers_names_a_tampered_layer_file() {
    let img = images();
    let h = Host::with_slots(&img, Some("overlay"));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["slot_mode"], "overlay", "{r:#}");
    let (code, out, err) = h.cmd(&["verify-layers", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // the image's layer and its metadata layer (`meta-<chain id>`)
    assert_eq!(v["layers"], 2);
    assert_eq!(v["mismatches"], serde_json::json!([]));
    let layers = h.root().join("var/lib/kubeslot/layers");
    let layer = fs::read_dir(&layers)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            p.is_dir() && !name.starts_with('.') && !name.starts_with("meta-")
        })
        .unwrap();
    fs::write(layer.join("usr/bin/kubelet-version"), b"kubelet evil\n").unwrap();
    fs::write(layer.join("etc/added"), b"x").unwrap();
    let (code, out, err) = h.cmd(&["verify-layers"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("usr/bin/kubelet-version: contents changed")
            && out.contains("etc/added: added"),
        "{out}"
    );
    assert!(err.contains("differ from what was unpacked"), "{err}");
}
