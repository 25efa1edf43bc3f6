//! Layers unpacked while they download from a registry (the layer store of
//! overlay slots, a copy slot's staging tree): a layer whose bytes do not
//! match its digest leaves nothing of itself, in either, though the
//! unpacker wrote it before the end of the blob showed the mismatch.

use super::*;
use kubeslot_activator::slots::stage::{self, Verified};

/// A signed three-layer image in a registry: a small gzip layer, a 3 MiB
/// uncompressed one (one file of noise: unpacked whole before its last
/// bytes arrive), another small gzip layer. With `tamper`, one byte in the
/// middle layer's file data is flipped in the registry's storage, so the
/// whole file is written before the digest can be checked. Returns the
/// image reference and the middle layer.
fn three_layers(
    reg: &Registry,
    work: &Path,
    tag: &str,
    k: &SigningKey,
    tamper: bool,
) -> (String, kubeslot_test_support::image::LayerBlob) {
    let layout = Layout::create(work.join(tag)).unwrap();
    let base = gzip_layer(&layout, &tar_of(&[("etc/os-release", b"ID=test\n")]));
    let big = big_layer(&layout, "opt/big", big_size(tag));
    let top = gzip_layer(&layout, &tar_of(&[("opt/app/version", tag.as_bytes())]));
    let built = write_image(&layout, tag, &[base, big.clone(), top]);
    sign(&layout, built.index, k, IDENTITY);
    push_all(&layout, reg, "test/node");
    if tamper {
        let hex = big.desc.digest.hex();
        let data = reg
            .storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(&hex)
            .join("data");
        let mut bytes = fs::read(&data).unwrap();
        // in the file's data, 1 MiB before its end
        let at = bytes.len() - (1 << 20);
        bytes[at] ^= 0x55;
        fs::write(&data, &bytes).unwrap();
    }
    (format!("{}/test/node:{tag}", reg.host()), big)
}

/// The size of the big layer's file in image `tag`: each tag's is its own
/// blob (the noise is the same).
fn big_size(tag: &str) -> u64 {
    (3 << 20) + 512 * tag.len() as u64
}

/// `image` resolved and checked against `k`, as a run does first.
fn verified(image: &str, k: &SigningKey, scratch: &Path) -> (Source, Verified) {
    let source = Source::open(&image.parse().unwrap(), &BTreeMap::new(), scratch).unwrap();
    let top = source.resolve().unwrap();
    let trusted = kubeslot_image::signature::TrustedKeys::from_keys(vec![*k.verifying_key()]);
    let policy = kubeslot_image::verify::Policy::new(trusted, false);
    let image = source.select(&top, &Platform::host()).unwrap();
    let verdict = kubeslot_image::verify::check(&source, &image, &policy).unwrap();
    (source, Verified { image, verdict })
}

/// Names in `dir` (none when it is missing).
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The content store holds no partial and nothing named `hex`.
fn store_has_none_of(root: &Root, hex: &str) {
    let blobs = names(&root.store().join("sha256"));
    assert!(
        blobs.iter().all(|n| !n.starts_with('.') && n != hex),
        "{blobs:?}"
    );
}

#[test]
fn a_tampered_layer_streamed_into_the_layer_store_leaves_nothing_of_it() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(7);
    let root = Root::new(work.path().join("root"));

    // A good image first: every layer unpacked as it downloads, all kept.
    let (good, _) = three_layers(&reg, work.path(), "good", &k, false);
    let (source, v) = verified(&good, &k, work.path());
    let (report, ensured) = stage::prepare_layers(&root, source, &v, &Default::default()).unwrap();
    assert_eq!((report.downloaded_layers, ensured.unpacked), (3, 3));
    assert_eq!(
        fs::metadata(ensured.dirs[1].join("opt/big")).unwrap().len(),
        big_size("good")
    );
    assert_eq!(
        fs::read(ensured.dirs[2].join("opt/app/version")).unwrap(),
        b"good"
    );
    // and reused from both stores the next time
    let (source, v) = verified(&good, &k, work.path());
    let (report, ensured) = stage::prepare_layers(&root, source, &v, &Default::default()).unwrap();
    assert_eq!((report.reused_layers, ensured.reused), (3, 3));
    let before = names(&root.layers_dir());

    let (bad, big) = three_layers(&reg, work.path(), "bad", &k, true);
    // every layer of it is new (the big file's size differs)
    let (source, v) = verified(&bad, &k, work.path());
    let err = stage::prepare_layers(&root, source, &v, &Default::default()).unwrap_err();
    let text = kubeslot_image::error_chain(&err);
    let hex = big.desc.digest.hex();
    assert!(text.contains(&hex) && text.contains("hashes to"), "{text}");
    let after = names(&root.layers_dir());
    assert!(
        after
            .iter()
            .all(|n| !n.contains(&big.diff_id.hex()) && !n.starts_with('.')),
        "{after:?}"
    );
    // nothing of the good image's layers changed
    assert!(
        before.iter().all(|n| after.contains(n)),
        "{before:?} {after:?}"
    );
    store_has_none_of(&root, &hex);
}

#[test]
fn a_tampered_layer_streamed_into_a_copy_slot_leaves_nothing_beside_it() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(8);
    let root = Root::new(work.path().join("root"));

    let (bad, big) = three_layers(&reg, work.path(), "bad", &k, true);
    let (source, v) = verified(&bad, &k, work.path());
    let err = stage::stage_resolved(&root, source, &v, &Default::default(), "kube1").unwrap_err();
    let text = kubeslot_image::error_chain(&err);
    let hex = big.desc.digest.hex();
    assert!(text.contains(&hex) && text.contains("hashes to"), "{text}");
    assert_eq!(names(&root.machines_dir()), Vec::<String>::new());
    store_has_none_of(&root, &hex);

    // the same image untampered is staged, every layer downloaded once
    let (good, _) = three_layers(&reg, work.path(), "good", &k, false);
    let (source, v) = verified(&good, &k, work.path());
    let staged = stage::stage_resolved(&root, source, &v, &Default::default(), "kube1").unwrap();
    // the base layer (the same in both) was verified and kept by the
    // refused run; the other two are downloaded now
    let r = &staged.report;
    assert_eq!((r.downloaded_layers, r.reused_layers), (2, 1), "{r:?}");
    let tree = root.machine_tree("kube1");
    assert_eq!(
        fs::metadata(tree.join("opt/big")).unwrap().len(),
        big_size("good")
    );
    assert_eq!(fs::read(tree.join("opt/app/version")).unwrap(), b"good");
    assert_eq!(names(&root.machines_dir()), ["kube1"]);
}
