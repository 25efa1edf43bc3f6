//! A test-only Sigstore instance: what Fulcio, Rekor and a CT log give
//! GitHub Actions + cosign, made here so that a real image for this host can
//! be signed keylessly (no public vector signs one: testdata/keyless/README.md).
//!
//! [`TestSigstore::new`] makes a Fulcio root and intermediate CA (P-384,
//! ecdsa-with-SHA384, the real chain's extensions), a Rekor log key and a CT
//! log key (P-256), and [`TestSigstore::trusted_root`] writes them as a
//! `trusted_root.json` in the exact shape of Sigstore's. [`TestSigstore::issue`]
//! issues a ten-minute leaf with Fulcio's extensions (OIDC issuer v1 and v2,
//! the GitHub workflow claims, code-signing usage, the workflow identity as
//! SAN URI) and an embedded SCT the CT key signed over the precertificate
//! (RFC 6962 §3.2). [`TestSigstore::sign`] signs image digests both ways
//! cosign does: cosign 2's `.sig` layer (simple-signing payload, certificate,
//! chain, and a Rekor bundle whose SET covers the canonical entry) and cosign
//! 3's v0.3 bundle (DSSE in-toto statement, a `dsse` entry with SET,
//! inclusion proof and signed checkpoint), attached as an OCI referrer
//! through the fallback tag `sha256-<hex>` ([`Material::attach`]).
//! [`Mutation`] lists the changes a host must refuse.
//!
//! Nothing in the product knows this instance: the production verifier
//! checks its output exactly as it checks the public vectors.

use std::collections::BTreeMap;
use std::sync::Mutex;

use base64::Engine as _;
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::{
    Descriptor, Index, Manifest, ANNOTATION_COSIGN_SIGNATURE, MEDIA_TYPE_CONFIG, MEDIA_TYPE_INDEX,
    MEDIA_TYPE_MANIFEST, MEDIA_TYPE_SIMPLE_SIGNING,
};
use kubeslot_image::signature::Payload;
use kubeslot_image::Digest;
use serde_json::{json, Value};

use super::der::{self, Signer};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// GitHub Actions' OIDC issuer.
pub const GITHUB_ISSUER: &str = "https://token.actions.githubusercontent.com";
/// Fulcio's OID arc.
const FULCIO: &str = "1.3.6.1.4.1.57264.1";
const SCT_LIST: &str = "1.3.6.1.4.1.11129.2.4.2";

fn sha256(b: &[u8]) -> [u8; 32] {
    *Digest::of(b).as_bytes()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn rfc3339(t: i64) -> String {
    let s = kubeslot_image::time::rfc3339_seconds(t as u64);
    format!("{}.000Z", s.trim_end_matches('Z'))
}

/// The GitHub Actions workflow run a leaf certificate names.
#[derive(Clone, Debug)]
pub struct Workflow {
    /// `https://github.com/ORG/REPO`
    pub repository: String,
    /// `.github/workflows/publish.yml`
    pub path: String,
    /// `refs/tags/v1.2.3`
    pub git_ref: String,
    pub sha: String,
}

impl Workflow {
    /// `https://github.com/kubeslot-test/node/.github/workflows/publish.yml@refs/tags/v1.0.0`
    pub fn example() -> Workflow {
        Workflow {
            repository: "https://github.com/kubeslot-test/node".into(),
            path: ".github/workflows/publish.yml".into(),
            git_ref: "refs/tags/v1.0.0".into(),
            sha: "4f2a6c1d9e8b7a6f5e4d3c2b1a0f9e8d7c6b5a49".into(),
        }
    }

    /// The SAN Fulcio writes: the workflow file at the ref that ran.
    pub fn identity(&self) -> String {
        format!("{}/{}@{}", self.repository, self.path, self.git_ref)
    }
}

/// What a leaf certificate says, and how it deviates from Fulcio's.
#[derive(Clone, Debug)]
pub struct LeafSpec {
    pub workflow: Workflow,
    pub issuer: String,
    /// The 1.3.6.1.4.1.57264.1.8 issuer beside the deprecated 1.1 (Fulcio
    /// since late 2022); false: the deprecated one alone.
    pub issuer_v2: bool,
    /// An embedded SCT.
    pub sct: bool,
    /// notBefore (Unix seconds); the leaf lives ten minutes.
    pub not_before: i64,
}

impl LeafSpec {
    /// Fulcio's leaf for `workflow` issued now.
    pub fn github(workflow: Workflow) -> LeafSpec {
        LeafSpec {
            workflow,
            issuer: GITHUB_ISSUER.into(),
            issuer_v2: true,
            sct: true,
            not_before: now() - 60,
        }
    }
}

/// An issued leaf: its key (the signer's ephemeral key) and certificate.
pub struct Leaf {
    pub key: Signer,
    pub der: Vec<u8>,
    pub not_before: i64,
    pub not_after: i64,
}

/// A Rekor v1 entry: where it is in the log and what the log signed.
#[derive(Clone, Debug)]
pub struct LogEntry {
    pub index: u64,
    pub integrated_time: i64,
    pub body: Vec<u8>,
    pub set: Vec<u8>,
    pub tree_size: u64,
    pub root_hash: [u8; 32],
    pub hashes: Vec<[u8; 32]>,
    pub checkpoint: String,
}

/// A cosign 2 `.sig` layer: what it is attached to (the `.sig` tag of that
/// digest), its payload and annotations.
#[derive(Clone, Debug)]
pub struct LegacySig {
    pub attached_to: Digest,
    pub payload: Vec<u8>,
    pub annotations: BTreeMap<String, String>,
}

/// An image's keyless signature material, both ways cosign stores it.
#[derive(Clone, Debug, Default)]
pub struct Material {
    pub legacy: Vec<LegacySig>,
    /// Bundles and the image each is a referrer of.
    pub bundles: Vec<(Descriptor, Value)>,
}

/// How to sign: the leaf, the repository payloads and statements name,
/// and which formats.
#[derive(Clone, Debug)]
pub struct SignSpec {
    pub leaf: LeafSpec,
    /// `docker-reference` of the payload, `name` of the statement subject.
    pub repository: String,
    pub legacy: bool,
    pub bundle: bool,
    /// The bundle statement's predicate type (cosign's signature:
    /// `https://sigstore.dev/cosign/sign/v1`; an attestation's otherwise).
    pub predicate_type: String,
    /// Whether the bundle statement's subject names `repository` (cosign
    /// 3's `sign` names none).
    pub subject_named: bool,
}

impl SignSpec {
    /// Both formats, Fulcio's leaf for `workflow`.
    pub fn new(workflow: Workflow, repository: &str) -> SignSpec {
        SignSpec {
            leaf: LeafSpec::github(workflow),
            repository: repository.into(),
            legacy: true,
            bundle: true,
            predicate_type: COSIGN_SIGN_PREDICATE.into(),
            subject_named: true,
        }
    }
}

/// cosign's signature predicate type (what `cosign sign` writes).
pub const COSIGN_SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";

/// A change of the signature material a host must refuse, and what its
/// refusal says (every text, for the material both ways).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// A byte of each signed entry timestamp flipped.
    FlippedSet,
    /// Another valid leaf (same identity, another key) in place of the signer's.
    SwappedCertificate,
    /// Logged (and the SET signed) a minute after the leaf expired.
    TimeOutsideCertificate,
    /// Another image's digest signed, attached to this one.
    AnotherImageDigest,
    /// The OIDC issuer only in the deprecated 1.3.6.1.4.1.57264.1.1.
    DeprecatedIssuerOnly,
    /// Issued by another instance whose root the material carries itself.
    RootInBundle,
    /// A leaf without an SCT.
    MissingSct,
}

impl Mutation {
    pub const ALL: [Mutation; 7] = [
        Mutation::FlippedSet,
        Mutation::SwappedCertificate,
        Mutation::TimeOutsideCertificate,
        Mutation::AnotherImageDigest,
        Mutation::DeprecatedIssuerOnly,
        Mutation::RootInBundle,
        Mutation::MissingSct,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mutation::FlippedSet => "flipped-set-byte",
            Mutation::SwappedCertificate => "swapped-certificate",
            Mutation::TimeOutsideCertificate => "time-outside-certificate",
            Mutation::AnotherImageDigest => "another-image-digest",
            Mutation::DeprecatedIssuerOnly => "issuer-only-in-deprecated-extension",
            Mutation::RootInBundle => "root-in-bundle",
            Mutation::MissingSct => "missing-sct",
        }
    }

    pub fn from_name(name: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == name)
    }

    /// What a host's refusal says (with SCTs required).
    pub fn says(self) -> &'static [&'static str] {
        match self {
            Mutation::FlippedSet => &["signed entry timestamp does not verify"],
            Mutation::SwappedCertificate => &["does not verify with the certificate's key"],
            Mutation::TimeOutsideCertificate => &["outside the certificate's validity"],
            Mutation::AnotherImageDigest => &["payload names digest", "do not include"],
            Mutation::DeprecatedIssuerOnly => {
                &["only in the deprecated extension 1.3.6.1.4.1.57264.1.1"]
            }
            Mutation::RootInBundle => &["supplies its own root certificate"],
            Mutation::MissingSct => &["carries no SCT"],
        }
    }
}

/// The log: leaf hashes, with some entries before ours.
struct Log {
    leaves: Vec<[u8; 32]>,
}

fn node(l: &[u8; 32], r: &[u8; 32]) -> [u8; 32] {
    let mut b = vec![1u8];
    b.extend_from_slice(l);
    b.extend_from_slice(r);
    sha256(&b)
}

/// RFC 6962 §2.1: the Merkle tree hash of `leaves`.
fn mth(leaves: &[[u8; 32]]) -> [u8; 32] {
    match leaves.len() {
        0 => sha256(b""),
        1 => leaves[0],
        n => {
            let k = n.next_power_of_two() / 2;
            node(&mth(&leaves[..k]), &mth(&leaves[k..]))
        }
    }
}

/// RFC 6962 §2.1.1: the audit path of leaf `m`, leaf to root.
fn path(m: usize, leaves: &[[u8; 32]]) -> Vec<[u8; 32]> {
    let n = leaves.len();
    if n <= 1 {
        return Vec::new();
    }
    let k = n.next_power_of_two() / 2;
    if m < k {
        let mut p = path(m, &leaves[..k]);
        p.push(mth(&leaves[k..]));
        p
    } else {
        let mut p = path(m - k, &leaves[k..]);
        p.push(mth(&leaves[..k]));
        p
    }
}

/// A test Sigstore instance (see the module docs).
pub struct TestSigstore {
    seed: [u8; 32],
    pub root_der: Vec<u8>,
    intermediate_key: Signer,
    pub intermediate_der: Vec<u8>,
    rekor: Signer,
    ct: Signer,
    log: Mutex<Log>,
    counter: Mutex<u64>,
    /// When it was made; its CAs and logs are valid from a day before.
    pub start: i64,
}

const ORG: &str = "kubeslot.test";

impl Default for TestSigstore {
    fn default() -> Self {
        TestSigstore::new()
    }
}

impl TestSigstore {
    /// A fresh instance: new keys, an empty log (but for a few entries of
    /// others, so inclusion proofs have a path).
    pub fn new() -> TestSigstore {
        use ring::rand::SecureRandom as _;
        let mut seed = [0u8; 32];
        ring::rand::SystemRandom::new().fill(&mut seed).unwrap();
        let start = now();
        let derive = |label: &str| {
            let mut b = seed.to_vec();
            b.extend_from_slice(label.as_bytes());
            Signer::p256(sha256(&b))
        };
        let root_key = Signer::p384();
        let intermediate_key = Signer::p384();
        let root_name = der::name(ORG, "kubeslot-test-root");
        let intermediate_name = der::name(ORG, "kubeslot-test-intermediate");
        let (from, to) = (start - 86_400, start + 10 * 365 * 86_400);
        let root_spki = root_key.spki();
        let root_ski = sha256(&root_spki)[..20].to_vec();
        let root_der = der::certificate(
            der::tbs(
                &der::TbsSpec {
                    serial: &sha256(b"root")[..16],
                    issuer: &root_name,
                    subject: &root_name,
                    not_before: from,
                    not_after: to,
                    spki: &root_spki,
                    extensions: &[
                        der::extension("2.5.29.15", true, &der::tlv(der::BIT_STRING, &[1, 0x06])),
                        der::extension(
                            "2.5.29.19",
                            true,
                            &der::seq(&[der::tlv(der::BOOLEAN, &[0xff])]),
                        ),
                        der::extension("2.5.29.14", false, &der::octets(&root_ski)),
                    ],
                },
                root_key.algorithm(),
            ),
            &root_key,
        );
        let intermediate_spki = intermediate_key.spki();
        let ski = sha256(&intermediate_spki)[..20].to_vec();
        let intermediate_der = der::certificate(
            der::tbs(
                &der::TbsSpec {
                    serial: &sha256(b"intermediate")[..16],
                    issuer: &root_name,
                    subject: &intermediate_name,
                    not_before: from,
                    not_after: to,
                    spki: &intermediate_spki,
                    extensions: &[
                        der::extension("2.5.29.15", true, &der::tlv(der::BIT_STRING, &[1, 0x06])),
                        der::extension(
                            "2.5.29.37",
                            false,
                            &der::seq(&[der::oid("1.3.6.1.5.5.7.3.3")]),
                        ),
                        der::extension(
                            "2.5.29.19",
                            true,
                            &der::seq(&[der::tlv(der::BOOLEAN, &[0xff]), der::uint(&[0])]),
                        ),
                        der::extension("2.5.29.14", false, &der::octets(&ski)),
                        der::extension("2.5.29.35", false, &der::seq(&[der::tlv(0x80, &root_ski)])),
                    ],
                },
                root_key.algorithm(),
            ),
            &root_key,
        );
        // entries of others before ours: the proofs have a path to check
        let leaves = (0..5u8).map(|i| sha256(&[0, i])).collect();
        TestSigstore {
            seed,
            root_der,
            intermediate_key,
            intermediate_der,
            rekor: derive("rekor"),
            ct: derive("ct"),
            log: Mutex::new(Log { leaves }),
            counter: Mutex::new(0),
            start,
        }
    }

    /// The Rekor log's ID: the SHA-256 of its DER public key.
    pub fn log_id(&self) -> [u8; 32] {
        sha256(&self.rekor.spki())
    }

    fn ct_log_id(&self) -> [u8; 32] {
        sha256(&self.ct.spki())
    }

    /// The instance's `trusted_root.json`, shaped as Sigstore's.
    pub fn trusted_root(&self) -> Value {
        let valid = json!({"start": rfc3339(self.start - 86_400)});
        json!({
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [{
                "baseUrl": "https://rekor.kubeslot.test",
                "hashAlgorithm": "SHA2_256",
                "publicKey": {
                    "rawBytes": B64.encode(self.rekor.spki()),
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                    "validFor": valid,
                },
                "logId": {"keyId": B64.encode(self.log_id())},
            }],
            "certificateAuthorities": [{
                "subject": {"organization": ORG, "commonName": "kubeslot-test-root"},
                "uri": "https://fulcio.kubeslot.test",
                "certChain": {"certificates": [
                    {"rawBytes": B64.encode(&self.intermediate_der)},
                    {"rawBytes": B64.encode(&self.root_der)},
                ]},
                "validFor": valid,
            }],
            "ctlogs": [{
                "baseUrl": "https://ctfe.kubeslot.test",
                "hashAlgorithm": "SHA2_256",
                "publicKey": {
                    "rawBytes": B64.encode(self.ct.spki()),
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                    "validFor": valid,
                },
                "logId": {"keyId": B64.encode(self.ct_log_id())},
            }],
            "timestampAuthorities": [],
        })
    }

    /// Writes [`TestSigstore::trusted_root`] to `path`.
    pub fn write_trusted_root(&self, path: &std::path::Path) {
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&self.trusted_root()).unwrap(),
        )
        .unwrap();
    }

    fn next(&self) -> u64 {
        let mut c = self.counter.lock().unwrap();
        *c += 1;
        *c
    }

    /// Issues a leaf as Fulcio does for a GitHub Actions token.
    pub fn issue(&self, spec: &LeafSpec) -> Leaf {
        let n = self.next();
        let mut seed = self.seed.to_vec();
        seed.extend_from_slice(format!("leaf-{n}").as_bytes());
        let key = Signer::p256(sha256(&seed));
        let spki = key.spki();
        let (not_before, not_after) = (spec.not_before, spec.not_before + 600);
        let w = &spec.workflow;
        let identity = w.identity();
        let repo = w.repository.trim_start_matches("https://github.com/");
        let owner = w.repository.rsplit_once('/').map_or("", |(o, _)| o);
        let run = format!("{}/actions/runs/{}/attempts/1", w.repository, 1000 + n);
        let raw =
            |arc: u32, v: &str| der::extension(&format!("{FULCIO}.{arc}"), false, v.as_bytes());
        let text =
            |arc: u32, v: &str| der::extension(&format!("{FULCIO}.{arc}"), false, &der::utf8(v));
        let issuer_ski = sha256(&self.intermediate_key.spki())[..20].to_vec();
        let mut exts = vec![
            der::extension("2.5.29.15", true, &der::tlv(der::BIT_STRING, &[7, 0x80])),
            der::extension(
                "2.5.29.37",
                false,
                &der::seq(&[der::oid("1.3.6.1.5.5.7.3.3")]),
            ),
            der::extension("2.5.29.14", false, &der::octets(&sha256(&spki)[..20])),
            der::extension(
                "2.5.29.35",
                false,
                &der::seq(&[der::tlv(0x80, &issuer_ski)]),
            ),
            der::extension(
                "2.5.29.17",
                true,
                &der::seq(&[der::tlv(0x86, identity.as_bytes())]),
            ),
            raw(1, &spec.issuer),
            raw(2, "push"),
            raw(3, &w.sha),
            raw(4, "publish"),
            raw(5, repo),
            raw(6, &w.git_ref),
        ];
        if spec.issuer_v2 {
            exts.push(text(8, &spec.issuer));
        }
        exts.extend([
            text(9, &identity),
            text(10, &w.sha),
            text(11, "github-hosted"),
            text(12, &w.repository),
            text(13, &w.sha),
            text(14, &w.git_ref),
            text(15, "123456789"),
            text(16, owner),
            text(17, "987654321"),
            text(18, &identity),
            text(19, &w.sha),
            text(20, "push"),
            text(21, &run),
            text(22, "public"),
        ]);
        let serial = sha256(format!("{n}-{}", hex(&self.seed)).as_bytes());
        let tbs_spec = |extensions: &[Vec<u8>]| {
            der::tbs(
                &der::TbsSpec {
                    serial: &serial[..20],
                    issuer: &der::name(ORG, "kubeslot-test-intermediate"),
                    subject: &der::name("", ""),
                    not_before,
                    not_after,
                    spki: &spki,
                    extensions,
                },
                self.intermediate_key.algorithm(),
            )
        };
        if spec.sct {
            // RFC 6962 §3.2: the log signs the precertificate's TBS (the
            // certificate without the SCT list) and the issuer's key hash.
            let precert = tbs_spec(&exts);
            let timestamp = (not_before as u64) * 1000 + 250;
            let mut signed = vec![0u8, 0u8];
            signed.extend(timestamp.to_be_bytes());
            signed.extend([0, 1]);
            signed.extend(sha256(&self.intermediate_key.spki()));
            signed.extend(&(precert.len() as u32).to_be_bytes()[1..]);
            signed.extend(&precert);
            signed.extend([0, 0]);
            let sig = self.ct.sign(&signed);
            let mut sct = vec![0u8];
            sct.extend(self.ct_log_id());
            sct.extend(timestamp.to_be_bytes());
            sct.extend([0, 0, 4, 3]);
            sct.extend((sig.len() as u16).to_be_bytes());
            sct.extend(&sig);
            let mut one = (sct.len() as u16).to_be_bytes().to_vec();
            one.extend(sct);
            let mut list = (one.len() as u16).to_be_bytes().to_vec();
            list.extend(one);
            exts.push(der::extension(SCT_LIST, false, &der::octets(&list)));
        }
        let der = der::certificate(tbs_spec(&exts), &self.intermediate_key);
        Leaf {
            key,
            der,
            not_before,
            not_after,
        }
    }

    /// Logs `body` at `integrated_time`: the SET over the canonical entry,
    /// the inclusion proof in the tree that now ends with it, and a
    /// checkpoint for that tree signed by the log.
    pub fn log(&self, body: Vec<u8>, integrated_time: i64) -> LogEntry {
        let mut log = self.log.lock().unwrap();
        let mut leaf = vec![0u8];
        leaf.extend_from_slice(&body);
        log.leaves.push(sha256(&leaf));
        let index = log.leaves.len() as u64 - 1;
        let canonical = format!(
            r#"{{"body":"{}","integratedTime":{},"logID":"{}","logIndex":{}}}"#,
            B64.encode(&body),
            integrated_time,
            hex(&self.log_id()),
            index
        );
        let set = self.rekor.sign(canonical.as_bytes());
        let root_hash = mth(&log.leaves);
        let tree_size = log.leaves.len() as u64;
        let note = format!(
            "rekor.kubeslot.test - 1234567890\n{tree_size}\n{}\n",
            B64.encode(root_hash)
        );
        let mut sig = self.log_id()[..4].to_vec();
        sig.extend(self.rekor.sign(note.as_bytes()));
        let checkpoint = format!("{note}\n\u{2014} rekor.kubeslot.test {}\n", B64.encode(sig));
        LogEntry {
            index,
            integrated_time,
            body,
            set,
            tree_size,
            root_hash,
            hashes: path(index as usize, &log.leaves),
            checkpoint,
        }
    }

    /// The PEM chain cosign writes beside the leaf: intermediate, root.
    pub fn chain_pem(&self) -> String {
        format!(
            "{}{}",
            der::pem(&self.intermediate_der),
            der::pem(&self.root_der)
        )
    }

    /// cosign 2's `.sig` layer for `signed`, attached to `attached_to`.
    pub fn legacy(
        &self,
        leaf: &Leaf,
        signed: Digest,
        attached_to: Digest,
        repository: &str,
        integrated_time: i64,
    ) -> LegacySig {
        let payload = Payload::new(repository, signed).to_bytes();
        let signature = leaf.key.sign(&payload);
        let cert_pem = der::pem(&leaf.der);
        let body = serde_json::to_vec(&json!({
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": {"hash": {"algorithm": "sha256", "value": hex(&sha256(&payload))}},
                "signature": {
                    "content": B64.encode(&signature),
                    "publicKey": {"content": B64.encode(cert_pem.as_bytes())},
                },
            },
        }))
        .unwrap();
        let e = self.log(body, integrated_time);
        let rekor_bundle = json!({
            "SignedEntryTimestamp": B64.encode(&e.set),
            "Payload": {
                "body": B64.encode(&e.body),
                "integratedTime": e.integrated_time,
                "logIndex": e.index,
                "logID": hex(&self.log_id()),
            },
        });
        let mut annotations = BTreeMap::new();
        annotations.insert(
            ANNOTATION_COSIGN_SIGNATURE.to_string(),
            B64.encode(&signature),
        );
        annotations.insert("dev.sigstore.cosign/certificate".into(), cert_pem);
        annotations.insert("dev.sigstore.cosign/chain".into(), self.chain_pem());
        annotations.insert(
            "dev.sigstore.cosign/bundle".into(),
            rekor_bundle.to_string(),
        );
        LegacySig {
            attached_to,
            payload,
            annotations,
        }
    }

    /// cosign 3's v0.3 bundle: a DSSE in-toto statement whose subject is
    /// `signed` (named `repository`), logged as a `dsse` entry.
    pub fn bundle(
        &self,
        leaf: &Leaf,
        signed: Digest,
        repository: &str,
        integrated_time: i64,
    ) -> Value {
        self.bundle_of(
            leaf,
            signed,
            Some(repository),
            COSIGN_SIGN_PREDICATE,
            integrated_time,
        )
    }

    /// [`TestSigstore::bundle`] with the statement's subject `name` (none:
    /// as cosign 3's `sign` writes it) and `predicate_type` chosen.
    pub fn bundle_of(
        &self,
        leaf: &Leaf,
        signed: Digest,
        name: Option<&str>,
        predicate_type: &str,
        integrated_time: i64,
    ) -> Value {
        let mut subject = json!({"digest": {"sha256": signed.hex()}});
        if let Some(n) = name {
            subject["name"] = n.into();
        }
        let statement = serde_json::to_vec(&json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [subject],
            "predicateType": predicate_type,
            "predicate": {},
        }))
        .unwrap();
        let payload_type = "application/vnd.in-toto+json";
        let mut pae = format!(
            "DSSEv1 {} {} {} ",
            payload_type.len(),
            payload_type,
            statement.len()
        )
        .into_bytes();
        pae.extend_from_slice(&statement);
        let signature = leaf.key.sign(&pae);
        let envelope = json!({
            "payload": B64.encode(&statement),
            "payloadType": payload_type,
            "signatures": [{"sig": B64.encode(&signature), "keyid": ""}],
        });
        let body = serde_json::to_vec(&json!({
            "apiVersion": "0.0.1",
            "kind": "dsse",
            "spec": {
                "envelopeHash": {"algorithm": "sha256", "value": hex(&sha256(&serde_json::to_vec(&envelope).unwrap()))},
                "payloadHash": {"algorithm": "sha256", "value": hex(&sha256(&statement))},
                "signatures": [{
                    "signature": B64.encode(&signature),
                    "verifier": B64.encode(der::pem(&leaf.der).as_bytes()),
                }],
            },
        }))
        .unwrap();
        let e = self.log(body, integrated_time);
        json!({
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {
                "certificate": {"rawBytes": B64.encode(&leaf.der)},
                "tlogEntries": [{
                    "logIndex": e.index.to_string(),
                    "logId": {"keyId": B64.encode(self.log_id())},
                    "kindVersion": {"kind": "dsse", "version": "0.0.1"},
                    "integratedTime": e.integrated_time.to_string(),
                    "inclusionPromise": {"signedEntryTimestamp": B64.encode(&e.set)},
                    "inclusionProof": {
                        "logIndex": e.index.to_string(),
                        "rootHash": B64.encode(e.root_hash),
                        "treeSize": e.tree_size.to_string(),
                        "hashes": e.hashes.iter().map(|h| B64.encode(h)).collect::<Vec<_>>(),
                        "checkpoint": {"envelope": e.checkpoint},
                    },
                    "canonicalizedBody": B64.encode(&e.body),
                }],
            },
            "dsseEnvelope": envelope,
        })
    }

    /// Signs each of `subjects` (an image's index and platform manifest)
    /// the ways `spec` says, with one leaf, logged ten seconds after it
    /// was issued.
    pub fn sign(&self, subjects: &[Descriptor], spec: &SignSpec) -> Material {
        let leaf = self.issue(&spec.leaf);
        self.sign_with(&leaf, subjects, spec, leaf.not_before + 10, None)
    }

    fn sign_with(
        &self,
        leaf: &Leaf,
        subjects: &[Descriptor],
        spec: &SignSpec,
        integrated_time: i64,
        signed: Option<Digest>,
    ) -> Material {
        let mut m = Material::default();
        for s in subjects {
            let what = signed.unwrap_or(s.digest);
            if spec.legacy {
                m.legacy
                    .push(self.legacy(leaf, what, s.digest, &spec.repository, integrated_time));
            }
            if spec.bundle {
                m.bundles.push((
                    s.clone(),
                    self.bundle_of(
                        leaf,
                        what,
                        spec.subject_named.then_some(spec.repository.as_str()),
                        &spec.predicate_type,
                        integrated_time,
                    ),
                ));
            }
        }
        m
    }

    /// [`TestSigstore::sign`] with `mutation` applied.
    pub fn sign_mutated(
        &self,
        subjects: &[Descriptor],
        spec: &SignSpec,
        mutation: Mutation,
    ) -> Material {
        match mutation {
            Mutation::FlippedSet => {
                let mut m = self.sign(subjects, spec);
                for l in &mut m.legacy {
                    let a = l.annotations.get_mut("dev.sigstore.cosign/bundle").unwrap();
                    let mut v: Value = serde_json::from_str(a).unwrap();
                    flip(&mut v["SignedEntryTimestamp"]);
                    *a = v.to_string();
                }
                for (_, b) in &mut m.bundles {
                    flip(
                        &mut b["verificationMaterial"]["tlogEntries"][0]["inclusionPromise"]
                            ["signedEntryTimestamp"],
                    );
                }
                m
            }
            Mutation::SwappedCertificate => {
                let mut m = self.sign(subjects, spec);
                let other = self.issue(&spec.leaf);
                for l in &mut m.legacy {
                    l.annotations.insert(
                        "dev.sigstore.cosign/certificate".into(),
                        der::pem(&other.der),
                    );
                }
                for (_, b) in &mut m.bundles {
                    b["verificationMaterial"]["certificate"]["rawBytes"] =
                        B64.encode(&other.der).into();
                }
                m
            }
            Mutation::TimeOutsideCertificate => {
                let leaf = self.issue(&spec.leaf);
                self.sign_with(&leaf, subjects, spec, leaf.not_after + 60, None)
            }
            Mutation::AnotherImageDigest => {
                let leaf = self.issue(&spec.leaf);
                let other = Digest::of(b"another image");
                self.sign_with(&leaf, subjects, spec, leaf.not_before + 10, Some(other))
            }
            Mutation::DeprecatedIssuerOnly => {
                let mut s = spec.clone();
                s.leaf.issuer_v2 = false;
                self.sign(subjects, &s)
            }
            Mutation::MissingSct => {
                let mut s = spec.clone();
                s.leaf.sct = false;
                self.sign(subjects, &s)
            }
            Mutation::RootInBundle => {
                let other = TestSigstore::new();
                let mut m = other.sign(subjects, spec);
                for (_, b) in &mut m.bundles {
                    let vm = b["verificationMaterial"].as_object_mut().unwrap();
                    let leaf = vm.remove("certificate").unwrap();
                    vm.insert(
                        "x509CertificateChain".into(),
                        json!({"certificates": [
                            leaf,
                            {"rawBytes": B64.encode(&other.intermediate_der)},
                            {"rawBytes": B64.encode(&other.root_der)},
                        ]}),
                    );
                }
                m
            }
        }
    }
}

fn flip(v: &mut Value) {
    let mut bytes = B64.decode(v.as_str().unwrap()).unwrap();
    bytes[12] ^= 1;
    *v = Value::String(B64.encode(bytes));
}

/// What `tag` of `layout` names and, for an index, its manifests: what
/// cosign signs for a multi-platform image (`--recursive`).
pub fn image_subjects(layout: &Layout, tag: &str) -> Vec<Descriptor> {
    let top =
        crate::keyless::tagged(layout, tag).unwrap_or_else(|| panic!("no index.json entry {tag}"));
    let mut out = vec![top.clone()];
    if top.media_type == MEDIA_TYPE_INDEX {
        let index: Index = layout.read_json(&top.digest, Some(top.size)).unwrap();
        out.extend(index.manifests);
    }
    for d in &mut out {
        d.annotations.clear();
        d.platform = None;
    }
    out
}

impl Material {
    /// Attaches the material as cosign does: `.sig` layers under
    /// `sha256-<hex>.sig` (added to a `.sig` artifact already there), each
    /// bundle as a referrer listed in the fallback tag `sha256-<hex>`.
    pub fn attach(&self, layout: &Layout) {
        for l in &self.legacy {
            let pd = layout.blobs().put_bytes(&l.payload).unwrap();
            let mut layer = Descriptor::new(MEDIA_TYPE_SIMPLE_SIGNING, pd, l.payload.len() as u64);
            layer.annotations = l.annotations.clone();
            let tag = l.attached_to.attachment_tag("sig");
            let mut manifest = match crate::keyless::tagged(layout, &tag) {
                Some(d) => layout
                    .read_json::<Manifest>(&d.digest, Some(d.size))
                    .unwrap(),
                None => {
                    let cd = layout.blobs().put_bytes(b"{}").unwrap();
                    Manifest {
                        schema_version: 2,
                        media_type: Some(MEDIA_TYPE_MANIFEST.into()),
                        artifact_type: None,
                        config: Descriptor::new(MEDIA_TYPE_CONFIG, cd, 2),
                        layers: Vec::new(),
                        subject: None,
                        annotations: Default::default(),
                    }
                }
            };
            manifest.layers.push(layer);
            let bytes = serde_json::to_vec(&manifest).unwrap();
            let md = layout.blobs().put_bytes(&bytes).unwrap();
            crate::image::tag_entry(
                layout,
                &tag,
                Descriptor::new(MEDIA_TYPE_MANIFEST, md, bytes.len() as u64),
            );
        }
        for (subject, bundle) in &self.bundles {
            crate::keyless::attach_bundle(layout, subject, bundle);
        }
    }

    /// The tags [`Material::attach`] wrote (for pushing them).
    pub fn tags(&self) -> Vec<String> {
        let mut tags: Vec<String> = self
            .legacy
            .iter()
            .map(|l| l.attached_to.attachment_tag("sig"))
            .chain(self.bundles.iter().map(|(s, _)| s.digest.referrers_tag()))
            .collect();
        tags.sort();
        tags.dedup();
        tags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merkle_paths_lead_to_the_root() {
        let leaves: Vec<[u8; 32]> = (0..7u8).map(|i| sha256(&[0, i])).collect();
        let root = mth(&leaves);
        for (m, leaf) in leaves.iter().enumerate() {
            // recompute the root from the path (RFC 9162 §2.1.3.2)
            let (mut fnode, mut snode, mut r) = (m, leaves.len() - 1, *leaf);
            for p in path(m, &leaves) {
                if fnode & 1 == 1 || fnode == snode {
                    r = node(&p, &r);
                    while fnode & 1 == 0 && fnode != 0 {
                        fnode >>= 1;
                        snode >>= 1;
                    }
                } else {
                    r = node(&r, &p);
                }
                fnode >>= 1;
                snode >>= 1;
            }
            assert_eq!(r, root, "leaf {m}");
        }
    }
}
