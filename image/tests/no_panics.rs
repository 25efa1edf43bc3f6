//! Every decoder of input an image, an archive or a registry controls
//! returns an error on garbage, never panics: random and mutated tar
//! streams through the unpacker, random JSON shapes through the OCI and
//! signature types, mutated Sigstore bundles and trusted roots through
//! keyless verification, random and edited DER through the certificate
//! walker (and everything verification asks a certificate it reads),
//! random header values through the registry and time parsers. The case
//! count is bounded (256 per property) so the suite stays fast; a failure
//! prints the minimal input.

use kubeslot_image::digest::Digest;
use kubeslot_image::oci::{Compression, ImageConfig, Index, Manifest};
use kubeslot_image::signature::Payload;
use kubeslot_image::unpack::{Layer, Policy, Unpacker};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn header(ty: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(ty);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_600_000_000);
    h.set_size(size);
    h
}

/// A small valid tar (a directory, a file, a PAX header, a symlink) to
/// mutate: random bytes alone rarely get past the first checksum.
fn seed_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = header(tar::EntryType::Directory, 0o755, 0);
    b.append_data(&mut h, "etc/", &[][..]).unwrap();
    let mut h = header(tar::EntryType::Regular, 0o644, 6);
    b.append_data(&mut h, "etc/a-rather-long-name-for-a-file", &b"hello\n"[..])
        .unwrap();
    let pax = b"30 mtime=1600000000.123456789\n";
    let mut x = header(tar::EntryType::XHeader, 0o644, pax.len() as u64);
    x.set_path("PaxHeaders/l").unwrap();
    x.set_cksum();
    b.append(&x, &pax[..]).unwrap();
    let mut h = header(tar::EntryType::Symlink, 0o777, 0);
    b.append_link(&mut h, "etc/l", "a-rather-long-name-for-a-file")
        .unwrap();
    b.into_inner().unwrap()
}

/// Unpacks `bytes` as one uncompressed layer into a fresh directory;
/// returns whether it was accepted. Not panicking is the property.
fn unpack(bytes: &[u8]) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("t");
    std::fs::create_dir(&target).unwrap();
    let mut u = Unpacker::new(&target, Policy::default()).unwrap();
    let layer = Layer {
        index: 0,
        digest: Digest::of(bytes),
        diff_id: Digest::of(bytes),
        compression: Compression::None,
        reader: bytes,
    };
    u.apply(layer).is_ok() && u.finish().is_ok()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes_never_panic_the_unpacker(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        unpack(&bytes);
    }

    #[test]
    fn mutated_tar_headers_never_panic_the_unpacker(
        edits in proptest::collection::vec((0usize..4096, any::<u8>()), 1..24),
    ) {
        let mut bytes = seed_tar();
        let len = bytes.len();
        for (at, b) in edits {
            bytes[at % len] = b;
        }
        unpack(&bytes);
    }

    #[test]
    fn mutated_numeric_fields_never_panic_the_unpacker(
        field in prop_oneof![Just(100usize), Just(108), Just(116), Just(124), Just(136)],
        which in 0usize..3,
        raw in proptest::collection::vec(prop_oneof![Just(b'7'), Just(b'0'), Just(b' '), Just(0u8), Just(0x80u8), Just(0xffu8), any::<u8>()], 0..12),
    ) {
        // mode, uid, gid, size or mtime of one of the first headers: octal
        // text, base-256, or junk
        let mut bytes = seed_tar();
        let start = [0usize, 512, 1536][which] + field;
        for (k, b) in raw.iter().enumerate() {
            bytes[start + k] = *b;
        }
        unpack(&bytes);
    }

    #[test]
    fn random_json_never_panics_the_document_types(doc in json()) {
        let bytes = doc.to_string().into_bytes();
        let _ = serde_json::from_slice::<Manifest>(&bytes);
        let _ = serde_json::from_slice::<Index>(&bytes);
        let _ = serde_json::from_slice::<ImageConfig>(&bytes);
        let _ = serde_json::from_slice::<Payload>(&bytes);
    }

    #[test]
    fn mutated_keyless_material_never_panics(at in any::<usize>(), byte in any::<u8>(), doc in json()) {
        use kubeslot_image::keyless::{GithubRule, IdentityRule, KeylessPolicy, Rules, Target, TrustedRoot};
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/keyless");
        let root = std::fs::read(data.join("cosign/trusted_root_pgi.json")).unwrap();
        let policy = KeylessPolicy {
            root: TrustedRoot::parse(&root).unwrap(),
            rules: Rules {
                issuer: "https://github.com/login/oauth".into(),
                identity: IdentityRule::Exact("cody@soyland.com".into()),
                github: GithubRule::default(),
                require_sct: true,
                accept_deprecated_issuer: false,
                allow_unnamed_subject: false,
            },
        };
        let mut bundle = std::fs::read(data.join("cosign/oci-attestation.sigstore.json")).unwrap();
        let i = at % bundle.len();
        bundle[i] = byte;
        let _ = policy.verify_bundle(&bundle, Target([0; 32]));
        let _ = policy.verify_bundle(doc.to_string().as_bytes(), Target([0; 32]));
        let mut root = root;
        let i = at % root.len();
        root[i] = byte;
        let _ = TrustedRoot::parse(&root);
        let _ = policy.verify_legacy([0; 32], &bundle[..i % 80], &bundle, Some(&root), Some(&doc.to_string()), false);
    }

    #[test]
    fn random_der_never_panics_the_certificate_walker(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        walk_certificate(bytes);
    }

    #[test]
    fn edited_certificates_never_panic_the_certificate_walker(
        which in 0usize..3,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..4), 1..6),
    ) {
        let mut der = real_certificates().swap_remove(which);
        for (at, byte, how) in edits {
            let i = at % der.len().max(1);
            match how {
                0 if !der.is_empty() => der[i] = byte,
                1 => der.insert(i.min(der.len()), byte),
                2 if !der.is_empty() => { der.remove(i); }
                _ => der.truncate(i),
            }
        }
        walk_certificate(der);
    }

    #[test]
    fn header_values_never_panic_their_parsers(v in "\\PC{0,80}") {
        let _ = kubeslot_image::registry::parse_challenge(&v);
        let _ = kubeslot_image::retry::retry_after(&v, std::time::SystemTime::now());
        let _ = kubeslot_image::time::parse_rfc3339(&v);
        let _ = v.parse::<kubeslot_image::ImageRef>();
        let _ = v.parse::<kubeslot_image::ImageSource>();
        let _ = Digest::parse_attachment_tag(&v);
        let _ = Digest::parse_referrers_tag(&v);
        let _ = kubeslot_image::reference::Identity::repository(&v);
    }
}

/// A real Fulcio leaf (with an SCT), the Fulcio intermediate and root.
fn real_certificates() -> Vec<Vec<u8>> {
    use base64::Engine as _;
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/keyless");
    let json = |p: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(data.join(p)).unwrap()).unwrap()
    };
    let b64 = |v: &serde_json::Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    };
    let bundle = json("sigstore-rs/bundle_v03.json");
    let root = json("cosign/trusted_root_pgi.json");
    let chain = &root["certificateAuthorities"][1]["certChain"]["certificates"];
    vec![
        b64(&bundle["verificationMaterial"]["certificate"]["rawBytes"]),
        b64(&chain[0]["rawBytes"]),
        b64(&chain[1]["rawBytes"]),
    ]
}

/// Parses `der` as a certificate and, when it reads, asks it everything
/// verification asks. Not panicking is the property.
fn walk_certificate(der: Vec<u8>) {
    use kubeslot_image::keyless::cert::Cert;
    use kubeslot_image::keyless::{chain, TrustedRoot};
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &der)
    );
    let _ = Cert::all_from_pem(pem.as_bytes());
    let Ok(c) = Cert::from_der(der) else {
        return;
    };
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/keyless");
    let root =
        TrustedRoot::parse(&std::fs::read(data.join("cosign/trusted_root_pgi.json")).unwrap())
            .unwrap();
    let _ = (
        c.san(),
        c.issuer(),
        c.check_leaf_usage(),
        c.check_ca_usage(1),
    );
    let _ = (
        c.precert_tbs(),
        c.subject_summary(),
        c.extension_list(),
        c.key(),
    );
    let _ = (
        c.basic_constraints(),
        c.key_usage(),
        c.extended_key_usage(),
        c.subject_alt_names(),
    );
    let _ = c.issued_by(&c);
    let _ = chain::verify_chain(&c, &root, 1_700_000_000);
    let _ = chain::verify_sct(&c, &root.authorities[1].chain[0], &root);
}

/// Random JSON values shaped like OCI documents: the right keys with
/// arbitrary values (sizes of u64::MAX and negative numbers included).
fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        Just(serde_json::Value::from(u64::MAX)),
        "[a-z:./0-9]{0,70}".prop_map(serde_json::Value::from),
        Just(serde_json::Value::from(format!(
            "sha256:{}",
            "a".repeat(64)
        ))),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        let key = prop_oneof![
            Just("schemaVersion"),
            Just("mediaType"),
            Just("config"),
            Just("layers"),
            Just("manifests"),
            Just("digest"),
            Just("size"),
            Just("platform"),
            Just("rootfs"),
            Just("diff_ids"),
            Just("critical"),
            Just("identity"),
            Just("docker-reference"),
            Just("image"),
            Just("docker-manifest-digest"),
            Just("type"),
            Just("annotations"),
            Just("architecture"),
            Just("os"),
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(key.prop_map(str::to_string), inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn the_seed_tar_itself_unpacks() {
    // the mutations start from an accepted stream, so they reach the
    // parsers past the first header
    assert!(unpack(&seed_tar()));
}
