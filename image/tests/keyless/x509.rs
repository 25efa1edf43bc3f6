//! The hand-written DER walker (`keyless::cert`) against `openssl`, and
//! against the encodings a strict reader must refuse.
//!
//! * Differential: every certificate in `testdata/keyless` (trusted roots,
//!   bundles, legacy layers) and certificates `openssl` makes here with odd
//!   but valid encodings (20-octet and high-bit serials, multi-valued RDNs,
//!   GeneralizedTime, every SAN kind, a two-octet key usage, foreign
//!   extensions, RSA and Ed25519 keys) are read by the walker and by
//!   `openssl x509`/`asn1parse`, and every field verification uses must
//!   agree: TBS bytes, serial, validity, public key, issuer = subject, the
//!   extensions in order with their criticality, basic constraints, key
//!   usage, extended key usage, SAN, and whether the issuer's signature
//!   verifies.
//! * Refusals: edits of a real Fulcio leaf and intermediate (a small DER
//!   tree editor re-encodes them) that break one DER or RFC 5280 rule each;
//!   the walker refuses each, naming the rule.
//! * Chains: CA certificates made with `openssl` that are not CAs, exceed a
//!   path length, may not sign certificates or not code: refused by the
//!   chain check, as `openssl verify` refuses the first three.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use kubeslot_image::keyless::cert::{Cert, GeneralName, KU_DIGITAL_SIGNATURE};
use kubeslot_image::keyless::chain::verify_chain;
use kubeslot_image::keyless::TrustedRoot;
use serde_json::Value;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn data() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/keyless")
}

fn require_openssl() {
    assert!(
        Command::new("openssl")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "required tool `openssl` is not installed: run `apt-get install -y openssl` (or `ci/setup.sh`)"
    );
}

fn run(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let (good, text) = run(dir, args);
    assert!(good, "openssl {args:?}: {text}");
    text
}

/// `openssl` with the whitespace-separated arguments of `line`, which
/// must succeed; its output.
fn sh(dir: &Path, line: &str) -> String {
    ok(dir, &line.split_whitespace().collect::<Vec<_>>())
}

fn pem_to_der(pem: &str) -> Vec<Vec<u8>> {
    pem.split("-----BEGIN ")
        .skip(1)
        .map(|part| {
            let body = part.split_once("-----\n").unwrap().1;
            let b64: String = body
                .split("-----END")
                .next()
                .unwrap()
                .split_whitespace()
                .collect();
            B64.decode(b64).unwrap()
        })
        .collect()
}

// ---- the corpus ----

/// Every certificate of `testdata/keyless`, deduplicated, with where it
/// was first found.
fn corpus() -> Vec<(String, Vec<u8>)> {
    fn walk(v: &Value, parent: &str, at: &str, out: &mut Vec<(String, Vec<u8>)>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    if let (Some(s), "rawBytes") = (v.as_str(), k.as_str()) {
                        if parent == "certificate" || parent == "certificates" {
                            out.push((at.to_string(), B64.decode(s).unwrap()));
                        }
                    } else if let (Some(s), "cert") = (v.as_str(), k.as_str()) {
                        let pem = String::from_utf8(B64.decode(s).unwrap()).unwrap();
                        out.extend(pem_to_der(&pem).into_iter().map(|d| (at.to_string(), d)));
                    } else if let Some(s) = v.as_str().filter(|s| s.contains("BEGIN CERTIFICATE")) {
                        out.extend(pem_to_der(s).into_iter().map(|d| (at.to_string(), d)));
                    } else {
                        walk(v, k, at, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, parent, at, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![data()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(v) = serde_json::from_slice::<Value>(&std::fs::read(&p).unwrap()) {
                let at = p.strip_prefix(data()).unwrap().display().to_string();
                walk(&v, "", &at, &mut out);
            }
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|(_, der)| seen.insert(der.clone()));
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

// ---- what openssl says ----

/// The fields `openssl` reads from one certificate.
#[derive(Debug, Default)]
struct Openssl {
    serial: String,
    signature_algorithm: String,
    not_before: i64,
    not_after: i64,
    self_issued: bool,
    spki: Vec<u8>,
    tbs: Vec<u8>,
    /// Extension headers in order: name (or dotted OID), critical.
    extensions: Vec<(String, bool)>,
    /// First value line of an extension, by name.
    values: std::collections::BTreeMap<String, String>,
}

fn openssl_fields(dir: &Path, der: &[u8]) -> Openssl {
    std::fs::write(dir.join("c.der"), der).unwrap();
    let text = sh(
        dir,
        "x509 -inform DER -in c.der -noout -serial -startdate -enddate -dateopt iso_8601 \
         -issuer -subject -nameopt RFC2253 -pubkey -text",
    );
    let mut o = Openssl::default();
    let time = |s: &str| kubeslot_image::time::parse_rfc3339(&s.replace(' ', "T")).unwrap();
    let (mut issuer, mut subject) = (String::new(), String::new());
    for l in text.lines() {
        if let Some(v) = l.strip_prefix("serial=") {
            o.serial = v.to_string();
        } else if let Some(v) = l.strip_prefix("notBefore=") {
            o.not_before = time(v);
        } else if let Some(v) = l.strip_prefix("notAfter=") {
            o.not_after = time(v);
        } else if let Some(v) = l.strip_prefix("issuer=") {
            issuer = v.to_string();
        } else if let Some(v) = l.strip_prefix("subject=") {
            subject = v.to_string();
        }
    }
    o.self_issued = issuer == subject;
    o.signature_algorithm = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Signature Algorithm: "))
        .unwrap()
        .to_string();
    let key = text
        .split("-----BEGIN PUBLIC KEY-----")
        .nth(1)
        .unwrap()
        .split("-----END PUBLIC KEY-----")
        .next()
        .unwrap();
    o.spki = B64
        .decode(key.split_whitespace().collect::<String>())
        .unwrap();
    if let Some(exts) = text.split("        X509v3 extensions:\n").nth(1) {
        let exts = exts.split("\n    Signature Algorithm:").next().unwrap();
        let mut current = None;
        for l in exts.lines() {
            let indent = l.len() - l.trim_start().len();
            if indent == 12 {
                let (name, rest) = l.trim().rsplit_once(':').unwrap();
                o.extensions
                    .push((name.to_string(), rest.trim() == "critical"));
                current = Some(name.to_string());
            } else if let Some(name) = current.take() {
                o.values.insert(name, l.trim().to_string());
            }
        }
    }
    // the TBS: the second TLV asn1parse lists
    let parsed = sh(dir, "asn1parse -inform DER -in c.der");
    let line = parsed.lines().nth(1).unwrap();
    let field = |k: &str| -> usize {
        let at = line.find(k).unwrap() + k.len();
        line[at..]
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let offset: usize = line.split(':').next().unwrap().trim().parse().unwrap();
    let (hl, l) = (field("hl="), field(" l="));
    o.tbs = der[offset..offset + hl + l].to_vec();
    o
}

/// openssl's name of a signature algorithm, by OID.
fn openssl_algorithm(oid: &str) -> String {
    match oid {
        "1.2.840.10045.4.3.2" => "ecdsa-with-SHA256",
        "1.2.840.10045.4.3.3" => "ecdsa-with-SHA384",
        "1.2.840.10045.4.3.4" => "ecdsa-with-SHA512",
        "1.2.840.113549.1.1.11" => "sha256WithRSAEncryption",
        "1.2.840.113549.1.1.12" => "sha384WithRSAEncryption",
        "1.3.101.112" => "ED25519",
        other => other,
    }
    .to_string()
}

/// Whether the walker verifies signatures of this algorithm.
fn ecdsa_sha2(c: &Cert) -> bool {
    ["1.2.840.10045.4.3.2", "1.2.840.10045.4.3.3"].contains(&c.signature_algorithm().as_str())
}

/// openssl's name of an extension, by OID.
fn openssl_name(oid: &str) -> String {
    match oid {
        "2.5.29.19" => "X509v3 Basic Constraints",
        "2.5.29.15" => "X509v3 Key Usage",
        "2.5.29.37" => "X509v3 Extended Key Usage",
        "2.5.29.17" => "X509v3 Subject Alternative Name",
        "2.5.29.18" => "X509v3 Issuer Alternative Name",
        "2.5.29.14" => "X509v3 Subject Key Identifier",
        "2.5.29.35" => "X509v3 Authority Key Identifier",
        "2.5.29.31" => "X509v3 CRL Distribution Points",
        "2.5.29.32" => "X509v3 Certificate Policies",
        "2.5.29.30" => "X509v3 Name Constraints",
        "1.3.6.1.5.5.7.1.1" => "Authority Information Access",
        "1.3.6.1.4.1.11129.2.4.2" => "CT Precertificate SCTs",
        other => other,
    }
    .to_string()
}

fn key_usage_text(bits: u16) -> String {
    const NAMES: [&str; 9] = [
        "Digital Signature",
        "Non Repudiation",
        "Key Encipherment",
        "Data Encipherment",
        "Key Agreement",
        "Certificate Sign",
        "CRL Sign",
        "Encipher Only",
        "Decipher Only",
    ];
    (0..9)
        .filter(|i| bits & (1 << i) != 0)
        .map(|i| NAMES[i])
        .collect::<Vec<_>>()
        .join(", ")
}

fn eku_text(oids: &[String]) -> String {
    oids.iter()
        .map(|o| match o.as_str() {
            "1.3.6.1.5.5.7.3.1" => "TLS Web Server Authentication".to_string(),
            "1.3.6.1.5.5.7.3.2" => "TLS Web Client Authentication".to_string(),
            "1.3.6.1.5.5.7.3.3" => "Code Signing".to_string(),
            "1.3.6.1.5.5.7.3.4" => "E-mail Protection".to_string(),
            "1.3.6.1.5.5.7.3.8" => "Time Stamping".to_string(),
            "2.5.29.37.0" => "Any Extended Key Usage".to_string(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The SAN's kinds and values as the walker reads them, in openssl's
/// words (values only where the walker keeps them).
fn san_kinds(names: &[GeneralName]) -> Vec<String> {
    names
        .iter()
        .map(|n| match n {
            GeneralName::Uri(s) => format!("URI:{s}"),
            GeneralName::Email(s) => format!("email:{s}"),
            GeneralName::Dns(s) => format!("DNS:{s}"),
            GeneralName::Username(s) => format!("othername: 1.3.6.1.4.1.57264.1.7::{s}"),
            GeneralName::Other(0x87) => "IP Address".into(),
            GeneralName::Other(0xa0) => "othername".into(),
            GeneralName::Other(0xa4) => "DirName".into(),
            GeneralName::Other(t) => format!("tag {t:#x}"),
        })
        .collect()
}

fn openssl_san(text: &str) -> Vec<String> {
    text.split(", ")
        .map(|n| {
            if n.starts_with("othername: 1.3.6.1.4.1.57264.1.7::") {
                n.to_string()
            } else if let Some(kind) = ["IP Address", "othername", "DirName"]
                .into_iter()
                .find(|k| n.starts_with(k))
            {
                kind.to_string()
            } else {
                n.to_string()
            }
        })
        .collect()
}

/// Compares the walker's reading of `der` with openssl's.
fn compare(dir: &Path, what: &str, der: &[u8]) -> Cert {
    let c = Cert::from_der(der.to_vec()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let o = openssl_fields(dir, der);
    let serial: String = c
        .serial()
        .iter()
        .skip_while(|b| **b == 0)
        .map(|b| format!("{b:02X}"))
        .collect();
    assert_eq!(serial, o.serial, "{what}: serial");
    assert_eq!(
        openssl_algorithm(&c.signature_algorithm()),
        o.signature_algorithm,
        "{what}: signature algorithm"
    );
    assert_eq!(
        c.validity(),
        (o.not_before, o.not_after),
        "{what}: validity"
    );
    assert_eq!(c.spki_der(), o.spki.as_slice(), "{what}: public key");
    assert_eq!(c.tbs_der(), o.tbs.as_slice(), "{what}: TBS");
    assert_eq!(
        c.is_self_issued(),
        o.self_issued,
        "{what}: issuer = subject"
    );
    let ours: Vec<(String, bool)> = c
        .extension_list()
        .into_iter()
        .map(|(oid, critical)| (openssl_name(&oid), critical))
        .collect();
    assert_eq!(ours, o.extensions, "{what}: extensions and criticality");
    let value = |name: &str| o.values.get(name).cloned();
    let bc = c.basic_constraints().map(|bc| {
        let mut s = format!("CA:{}", if bc.ca { "TRUE" } else { "FALSE" });
        if let Some(n) = bc.path_len {
            s.push_str(&format!(", pathlen:{n}"));
        }
        s
    });
    assert_eq!(
        bc,
        value("X509v3 Basic Constraints"),
        "{what}: basic constraints"
    );
    assert_eq!(
        c.key_usage().map(key_usage_text),
        value("X509v3 Key Usage"),
        "{what}: key usage"
    );
    assert_eq!(
        c.extended_key_usage().map(|e| eku_text(&e)),
        value("X509v3 Extended Key Usage"),
        "{what}: extended key usage"
    );
    assert_eq!(
        c.subject_alt_names().map(san_kinds),
        value("X509v3 Subject Alternative Name").map(|v| openssl_san(&v)),
        "{what}: subject alternative names"
    );
    c
}

/// Whether openssl finds `issuer`'s signature on `cert` (a chain of one,
/// the issuer trusted as given, no time or purpose checks).
fn openssl_signed(dir: &Path, cert: &[u8], issuer: &[u8]) -> bool {
    std::fs::write(dir.join("s.der"), cert).unwrap();
    std::fs::write(dir.join("i.der"), issuer).unwrap();
    sh(dir, "x509 -inform DER -in s.der -out s.pem");
    sh(dir, "x509 -inform DER -in i.der -out i.pem");
    let (good, text) = run(
        dir,
        &[
            "verify",
            "-no_check_time",
            "-partial_chain",
            "-CAfile",
            "i.pem",
            "s.pem",
        ],
    );
    good && text.contains("s.pem: OK")
}

#[test]
fn every_vector_certificate_reads_as_openssl_reads_it() {
    require_openssl();
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus();
    assert!(corpus.len() >= 20, "{} certificates", corpus.len());
    let certs: Vec<(String, Vec<u8>, Cert)> = corpus
        .into_iter()
        .map(|(at, der)| {
            let c = compare(dir.path(), &at, &der);
            (at, der, c)
        })
        .collect();
    // Signatures: every pair whose names link, both ways of checking.
    let mut pairs = 0;
    for (at, der, c) in &certs {
        for (_, ider, i) in &certs {
            if !c_issuer_is(c, i) {
                continue;
            }
            if !ecdsa_sha2(c) || i.key().is_err() {
                // RSA (a conformance test CA): refused, never verified
                assert!(!c.issued_by(i), "{at}: {}", c.signature_algorithm());
                continue;
            }
            pairs += 1;
            assert_eq!(
                c.issued_by(i),
                openssl_signed(dir.path(), der, ider),
                "{at}: signed by {}",
                i.subject_summary()
            );
        }
    }
    assert!(pairs >= 10, "{pairs} issuer pairs");
}

/// Whether `c` names `i`'s subject as its issuer (the walker's byte
/// comparison, checked through `issued_by`'s first step).
fn c_issuer_is(c: &Cert, i: &Cert) -> bool {
    // a self-issued certificate names itself; otherwise compare through
    // the DER: the issuer Name is the TBS field after serial and algorithm
    let name = |der: &[u8], field: usize| -> Vec<u8> {
        let tree = Node::parse_one(der);
        let Node::Cons { children, .. } = &tree else {
            unreachable!()
        };
        let Node::Cons { children: tbs, .. } = &children[0] else {
            unreachable!()
        };
        tbs[field].encode()
    };
    name(&c.der, 3) == name(&i.der, 5)
}

// ---- certificates openssl makes ----

/// Writes `ext.cnf` in `dir`: the system's openssl.cnf and `body` (the
/// extension sections, named `t_*`).
fn openssl_cnf(dir: &Path, body: &str) {
    let base = std::fs::read_to_string("/etc/ssl/openssl.cnf").unwrap_or_default();
    std::fs::write(dir.join("ext.cnf"), format!("{base}\n{body}")).unwrap();
}

/// A self-signed certificate made by `openssl req -x509`: a `key`
/// (`ec:P-256`, `ec:P-384`, `rsa:2048`, `ed25519`), the subject, more
/// arguments, the extension section of `ext.cnf`.
fn self_signed(
    dir: &Path,
    name: &str,
    key: &str,
    subject: &str,
    more: &str,
    section: &str,
) -> Vec<u8> {
    let newkey = match key.split_once(':') {
        Some(("ec", curve)) => format!("-newkey ec -pkeyopt ec_paramgen_curve:{curve}"),
        _ => format!("-newkey {key}"),
    };
    let mut args: Vec<String> = format!(
        "req -x509 -nodes -keyout {name}.key {newkey} -out {name}.pem -config ext.cnf -extensions {section} {more} -subj"
    )
    .split_whitespace()
    .map(str::to_string)
    .collect();
    args.push(subject.to_string());
    ok(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
    pem_to_der(&std::fs::read_to_string(dir.join(format!("{name}.pem"))).unwrap()).remove(0)
}

/// `name` (P-256, `O=kubeslot.test/CN=name`) issued by `ca` (files
/// `ca.pem`/`ca.key` in `dir`) with the extension section `section` of
/// `ext.cnf`.
fn issued(dir: &Path, name: &str, ca: &str, section: &str) -> Vec<u8> {
    sh(
        dir,
        &format!(
            "req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout {name}.key \
             -subj /O=kubeslot.test/CN={name} -out {name}.csr"
        ),
    );
    sh(
        dir,
        &format!(
            "x509 -req -in {name}.csr -CA {ca}.pem -CAkey {ca}.key -set_serial 0x1234 -days 30 \
             -extfile ext.cnf -extensions {section} -out {name}.pem"
        ),
    );
    pem_to_der(&std::fs::read_to_string(dir.join(format!("{name}.pem"))).unwrap()).remove(0)
}

#[test]
fn odd_but_valid_openssl_certificates_read_as_openssl_reads_them() {
    require_openssl();
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    openssl_cnf(
        d,
        "[t_odd]
basicConstraints = critical,CA:TRUE,pathlen:3
keyUsage = critical,digitalSignature,keyCertSign,decipherOnly
extendedKeyUsage = codeSigning,serverAuth,anyExtendedKeyUsage,1.2.3.4.5
subjectAltName = @alt
1.2.3.4 = ASN1:UTF8String:hello
1.3.6.1.4.1.57264.1.8 = ASN1:UTF8String:https://issuer.example
1.3.6.1.4.1.57264.1.1 = DER:68:74:74:70:73:3a:2f:2f:69:73:73:75:65:72:2e:65:78:61:6d:70:6c:65
[alt]
URI.1 = https://example.com/x
email.1 = a@example.com
DNS.1 = example.com
IP.1 = 192.0.2.1
IP.2 = 2001:db8::1
otherName.1 = 1.3.6.1.4.1.57264.1.7;UTF8:someone
otherName.2 = 1.2.3.4;UTF8:other
dirName.1 = dir
[dir]
CN = a dir name
[t_plain]
subjectKeyIdentifier = hash
[t_user]
subjectAltName = critical,otherName:1.3.6.1.4.1.57264.1.7;UTF8:someone
keyUsage = critical,digitalSignature
extendedKeyUsage = codeSigning
[t_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
",
    );
    let ca = self_signed(d, "ca", "ec:P-256", "/O=kubeslot.test/CN=ca", "", "t_ca");
    let leaf = issued(d, "user", "ca", "t_user");
    let made: Vec<(&str, Vec<u8>)> = vec![
        // P-384, a 20-octet serial, a multi-valued RDN, UTF8 names,
        // GeneralizedTime (after 2049), every SAN kind, a two-octet key
        // usage, foreign and Fulcio extensions
        (
            "odd",
            self_signed(
                d,
                "odd",
                "ec:P-384",
                "/O=odd org/CN=odd+OU=multi",
                "-multivalue-rdn -utf8 -days 20000 -set_serial 0xff00ff00ff00ff00ff00ff00ff00ff00ff00ff",
                "t_odd",
            ),
        ),
        // a serial with its high bit set (DER: a leading zero octet)
        (
            "high-bit-serial",
            self_signed(d, "high", "ec:P-256", "/CN=high", "-set_serial 0x80", "t_plain"),
        ),
        // RSA (sha256WithRSAEncryption has NULL parameters) and Ed25519 (no
        // parameters, no hash): read, never taken for ECDSA
        ("rsa", self_signed(d, "rsa", "rsa:2048", "/CN=rsa", "", "t_ca")),
        ("ed25519", self_signed(d, "ed", "ed25519", "/CN=ed", "", "t_ca")),
        // a CA and a Fulcio-like leaf with a username SAN it issued
        ("ca", ca.clone()),
        ("user", leaf.clone()),
    ];
    for (what, der) in &made {
        compare(d, what, der);
    }
    let c = |der: &[u8]| Cert::from_der(der.to_vec()).unwrap();
    assert_eq!(c(&leaf).san().unwrap(), "someone");
    assert!(c(&leaf).issued_by(&c(&ca)) && openssl_signed(d, &leaf, &ca));
    c(&leaf).check_leaf_usage().unwrap();
    // the odd one names eight identities: none is picked
    let e = c(&made[0].1).san().unwrap_err();
    assert!(e.contains("lists 8 names"), "{e}");
    assert_eq!(
        c(&made[0].1).issuer().v2.as_deref(),
        Some("https://issuer.example")
    );
    assert_eq!(
        c(&made[0].1).issuer().v1.as_deref(),
        Some("https://issuer.example")
    );
    // signatures by algorithms keyless verification does not use: false,
    // though openssl verifies them
    for what in ["rsa", "ed25519"] {
        let der = &made.iter().find(|m| m.0 == what).unwrap().1;
        assert!(openssl_signed(d, der, der), "{what}");
        assert!(!c(der).issued_by(&c(der)), "{what}");
        assert!(c(der).key().is_err(), "{what}");
    }
    let odd = &made[0].1;
    assert!(openssl_signed(d, odd, odd) && c(odd).issued_by(&c(odd)));

    // ECDSA with parameters in its AlgorithmIdentifier (RFC 5758 §3.2:
    // absent): the leaf re-signed by the CA's key over its TBS, once as it
    // is (verifies) and once with NULL parameters in both identifiers
    // (read, never verified).
    let resign = |params: bool| {
        let mut tree = Node::parse_one(&leaf);
        if params {
            tbs(&mut tree)[2].kids().push(prim(0x05, &[]));
            tree.kids()[1].kids().push(prim(0x05, &[]));
        }
        std::fs::write(d.join("tbs.der"), tree.kids()[0].encode()).unwrap();
        sh(d, "dgst -sha256 -sign ca.key -out tbs.sig tbs.der");
        let mut sig = vec![0u8];
        sig.extend(std::fs::read(d.join("tbs.sig")).unwrap());
        *tree.kids()[2].content() = sig;
        Cert::from_der(tree.encode()).unwrap()
    };
    assert!(resign(false).issued_by(&c(&ca)));
    assert!(!resign(true).issued_by(&c(&ca)));
}

#[test]
fn what_openssl_reads_but_a_strict_verifier_refuses() {
    require_openssl();
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    openssl_cnf(
        d,
        "[t_unknown_critical]
basicConstraints = critical,CA:TRUE
1.2.3.4 = critical,ASN1:NULL
[t_name_constraints]
basicConstraints = critical,CA:TRUE
nameConstraints = critical,permitted;DNS:example.com
",
    );
    // An unknown critical extension: openssl parses it, and its verifier
    // refuses it too (RFC 5280 §4.2).
    let der = self_signed(d, "uc", "ec:P-256", "/CN=uc", "", "t_unknown_critical");
    let e = Cert::from_der(der.clone()).unwrap_err();
    assert!(e.contains("unknown critical extension 1.2.3.4"), "{e}");
    let (_, text) = run(d, &["verify", "-CAfile", "uc.pem", "uc.pem"]);
    assert!(text.contains("unhandled critical extension"), "{text}");
    // A critical extension this verifier does not process (openssl does):
    // refused rather than ignored.
    let der = self_signed(d, "nc", "ec:P-256", "/CN=nc", "", "t_name_constraints");
    let e = Cert::from_der(der).unwrap_err();
    assert!(e.contains("unknown critical extension 2.5.29.30"), "{e}");
    // X.509 v1 (openssl x509 -req without extensions makes one)
    sh(
        d,
        "req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout v1.key -subj /CN=v1 -out v1.csr",
    );
    sh(d, "x509 -req -in v1.csr -signkey v1.key -out v1.pem");
    let text = ok(d, &["x509", "-in", "v1.pem", "-noout", "-text"]);
    assert!(text.contains("Version: 1 (0x0)"), "{text}");
    let der = pem_to_der(&std::fs::read_to_string(d.join("v1.pem")).unwrap()).remove(0);
    let e = Cert::from_der(der).unwrap_err();
    assert!(e.contains("only X.509 v3"), "{e}");
}

// ---- a DER tree editor, and the edits a strict walker refuses ----

/// A DER tree (test side only: lenient, it reads what it is given).
#[derive(Clone, Debug)]
enum Node {
    Prim {
        tag: u8,
        content: Vec<u8>,
    },
    Cons {
        tag: u8,
        children: Vec<Node>,
    },
    /// Bytes written as they are (a deliberately odd encoding).
    Raw(Vec<u8>),
}

impl Node {
    fn parse_all(mut b: &[u8]) -> Vec<Node> {
        let mut out = Vec::new();
        while !b.is_empty() {
            let tag = b[0];
            let (len, hl) = if b[1] < 0x80 {
                (b[1] as usize, 2)
            } else {
                let n = (b[1] & 0x7f) as usize;
                (
                    b[2..2 + n].iter().fold(0usize, |l, x| l << 8 | *x as usize),
                    2 + n,
                )
            };
            let content = &b[hl..hl + len];
            out.push(if tag & 0x20 != 0 {
                Node::Cons {
                    tag,
                    children: Node::parse_all(content),
                }
            } else {
                Node::Prim {
                    tag,
                    content: content.to_vec(),
                }
            });
            b = &b[hl + len..];
        }
        out
    }

    fn parse_one(b: &[u8]) -> Node {
        Node::parse_all(b).remove(0)
    }

    fn encode(&self) -> Vec<u8> {
        let (tag, content) = match self {
            Node::Raw(b) => return b.clone(),
            Node::Prim { tag, content } => (*tag, content.clone()),
            Node::Cons { tag, children } => {
                (*tag, children.iter().flat_map(Node::encode).collect())
            }
        };
        let mut v = vec![tag];
        let len = content.len();
        if len < 0x80 {
            v.push(len as u8);
        } else {
            let bytes: Vec<u8> = len
                .to_be_bytes()
                .into_iter()
                .skip_while(|b| *b == 0)
                .collect();
            v.push(0x80 | bytes.len() as u8);
            v.extend(bytes);
        }
        v.extend(content);
        v
    }

    fn kids(&mut self) -> &mut Vec<Node> {
        match self {
            Node::Cons { children, .. } => children,
            other => panic!("not constructed: {other:?}"),
        }
    }

    fn content(&mut self) -> &mut Vec<u8> {
        match self {
            Node::Prim { content, .. } => content,
            other => panic!("not primitive: {other:?}"),
        }
    }
}

fn prim(tag: u8, content: &[u8]) -> Node {
    Node::Prim {
        tag,
        content: content.to_vec(),
    }
}

fn oid_content(dotted: &str) -> Vec<u8> {
    let arcs: Vec<u64> = dotted.split('.').map(|a| a.parse().unwrap()).collect();
    let mut out = Vec::new();
    for (i, mut a) in std::iter::once(arcs[0] * 40 + arcs[1])
        .chain(arcs[2..].iter().copied())
        .enumerate()
    {
        let _ = i;
        let mut g = vec![(a & 0x7f) as u8];
        a >>= 7;
        while a > 0 {
            g.push((a & 0x7f) as u8 | 0x80);
            a >>= 7;
        }
        g.reverse();
        out.extend(g);
    }
    out
}

/// The TBS's fields of a certificate tree.
fn tbs(cert: &mut Node) -> &mut Vec<Node> {
    cert.kids()[0].kids()
}

/// The extensions (each a SEQUENCE) of a certificate tree.
fn exts(cert: &mut Node) -> &mut Vec<Node> {
    let t = tbs(cert);
    let at = t.len() - 1;
    t[at].kids()[0].kids()
}

/// The index of the extension `oid` in `exts`.
fn ext_at(exts: &mut [Node], dotted: &str) -> usize {
    let want = oid_content(dotted);
    exts.iter_mut()
        .position(|e| *e.kids()[0].content() == want)
        .unwrap_or_else(|| panic!("no extension {dotted}"))
}

/// The value (OCTET STRING content) of extension `i`, as a tree.
fn ext_value(exts: &mut [Node], i: usize) -> Node {
    let e = exts[i].kids();
    let last = e.len() - 1;
    Node::parse_one(e[last].content())
}

fn set_ext_value(exts: &mut [Node], i: usize, v: &Node) {
    let e = exts[i].kids();
    let last = e.len() - 1;
    *e[last].content() = v.encode();
}

fn der_of(path: &str, pointer: &str) -> Vec<u8> {
    let v: Value = serde_json::from_slice(&std::fs::read(data().join(path)).unwrap()).unwrap();
    B64.decode(v.pointer(pointer).unwrap().as_str().unwrap())
        .unwrap()
}

#[test]
fn each_edit_that_breaks_der_or_rfc_5280_is_refused() {
    // a real Fulcio leaf (GitHub Actions) and the real Fulcio intermediate
    let leaf = der_of(
        "sigstore-rs/bundle_v03.json",
        "/verificationMaterial/certificate/rawBytes",
    );
    let ca = der_of(
        "cosign/trusted_root_pgi.json",
        "/certificateAuthorities/1/certChain/certificates/0/rawBytes",
    );
    // the editor's round trip is the identity
    assert_eq!(Node::parse_one(&leaf).encode(), leaf);
    assert_eq!(Node::parse_one(&ca).encode(), ca);
    Cert::from_der(leaf.clone()).unwrap();

    type Edit = Box<dyn Fn(&mut Node)>;
    let leaf_edits: Vec<(&str, Edit, &str)> = vec![
        (
            "the SAN's length in long form",
            Box::new(|c| {
                let e = exts(c);
                let i = ext_at(e, "2.5.29.17");
                let value = e[i].kids()[2].content().clone();
                assert!(value.len() < 0x80);
                let mut raw = vec![0x04, 0x81, value.len() as u8];
                raw.extend(value);
                e[i].kids()[2] = Node::Raw(raw);
            }),
            "an extension: not DER",
        ),
        (
            "the TBS with an indefinite length",
            Box::new(|c| {
                let mut raw = vec![0x30, 0x80];
                for k in tbs(c).iter() {
                    raw.extend(k.encode());
                }
                raw.extend([0, 0]);
                c.kids()[0] = Node::Raw(raw);
            }),
            "the TBS certificate: not DER",
        ),
        (
            "a byte after the certificate's signature",
            Box::new(|c| {
                c.kids().push(prim(0x05, &[]));
            }),
            "data after the signature",
        ),
        (
            "critical FALSE encoded",
            Box::new(|c| {
                let e = exts(c);
                let i = ext_at(e, "2.5.29.37");
                e[i].kids().insert(1, prim(0x01, &[0x00]));
            }),
            "critical flag is not DER TRUE",
        ),
        (
            "critical as 0x01",
            Box::new(|c| {
                let e = exts(c);
                let i = ext_at(e, "2.5.29.37");
                e[i].kids().insert(1, prim(0x01, &[0x01]));
            }),
            "critical flag is not DER TRUE",
        ),
        (
            "the SAN twice",
            Box::new(|c| {
                let e = exts(c);
                let i = ext_at(e, "2.5.29.17");
                let san = e[i].clone();
                e.push(san);
            }),
            "extension 2.5.29.17 appears twice",
        ),
        (
            "an unknown critical extension",
            Box::new(|c| {
                exts(c).push(Node::Cons {
                    tag: 0x30,
                    children: vec![
                        prim(0x06, &oid_content("1.3.6.1.4.1.57264.99")),
                        prim(0x01, &[0xff]),
                        prim(0x04, &[0x05, 0x00]),
                    ],
                });
            }),
            "unknown critical extension 1.3.6.1.4.1.57264.99",
        ),
        (
            "an extension OID with a padded arc",
            Box::new(|c| {
                let e = exts(c);
                let i = ext_at(e, "2.5.29.14");
                *e[i].kids()[0].content() = vec![0x55, 0x80, 0x1d, 0x0e];
            }),
            "OID is not DER",
        ),
        (
            "an empty extensions list",
            Box::new(|c| {
                exts(c).clear();
            }),
            "an empty extensions list",
        ),
        (
            "data after the extensions",
            Box::new(|c| {
                let t = tbs(c);
                let at = t.len() - 1;
                t[at].kids().push(prim(0x05, &[]));
            }),
            "data after the extensions",
        ),
        (
            "an unknown field after the public key",
            Box::new(|c| {
                let t = tbs(c);
                let at = t.len() - 1;
                t.insert(
                    at,
                    Node::Cons {
                        tag: 0xa4,
                        children: vec![],
                    },
                );
            }),
            "unexpected data after the subject public key info",
        ),
        (
            "no version (v1)",
            Box::new(|c| {
                tbs(c).remove(0);
            }),
            "only X.509 v3",
        ),
        (
            "version v2",
            Box::new(|c| {
                *tbs(c)[0].kids()[0].content() = vec![1];
            }),
            "not an X.509 v3 certificate",
        ),
        (
            "a serial with a needless zero octet",
            Box::new(|c| {
                let s = tbs(c)[1].content();
                assert!(s[0] < 0x80);
                s.insert(0, 0);
            }),
            "not a minimal positive INTEGER",
        ),
        (
            "a negative serial",
            Box::new(|c| {
                tbs(c)[1].content()[0] |= 0x80;
            }),
            "not a minimal positive INTEGER",
        ),
        (
            "a 21-octet serial",
            Box::new(|c| {
                let s = tbs(c)[1].content();
                s.insert(0, 0x01);
            }),
            "longer than 20 octets",
        ),
        (
            "the TBS signature algorithm changed",
            Box::new(|c| {
                *tbs(c)[2].kids()[0].content() = oid_content("1.2.840.10045.4.3.2");
            }),
            "differs from the certificate's",
        ),
        (
            "notBefore as GeneralizedTime before 2050",
            Box::new(|c| {
                let v = tbs(c)[4].kids();
                let utc = String::from_utf8(v[0].content().clone()).unwrap();
                v[0] = prim(0x18, format!("20{utc}").as_bytes());
            }),
            "notBefore",
        ),
        (
            "notAfter with fractions",
            Box::new(|c| {
                let v = tbs(c)[4].kids();
                let utc = String::from_utf8(v[1].content().clone()).unwrap();
                v[1] = prim(0x17, utc.replace('Z', ".5Z").as_bytes());
            }),
            "notAfter",
        ),
        (
            "a third time in the validity",
            Box::new(|c| {
                let v = tbs(c)[4].kids();
                let again = v[1].clone();
                v.push(again);
            }),
            "data after notAfter",
        ),
        (
            "an issuer RDN with an empty SET",
            Box::new(|c| {
                tbs(c)[3].kids().push(Node::Cons {
                    tag: 0x31,
                    children: vec![],
                });
            }),
            "the issuer is not a non-empty DER Name",
        ),
        (
            "an empty extended key usage",
            Box::new(|c| {
                let e = exts(c);
                let i = ext_at(e, "2.5.29.37");
                set_ext_value(
                    e,
                    i,
                    &Node::Cons {
                        tag: 0x30,
                        children: vec![],
                    },
                );
            }),
            "extension 2.5.29.37: malformed",
        ),
        (
            "key usage with a trailing zero octet",
            Box::new(|c| {
                let e = exts(c);
                let i = ext_at(e, "2.5.29.15");
                set_ext_value(e, i, &prim(0x03, &[0, 0x80, 0x00]));
            }),
            "extension 2.5.29.15: malformed",
        ),
        (
            "key usage with unused bits set",
            Box::new(|c| {
                let e = exts(c);
                let i = ext_at(e, "2.5.29.15");
                set_ext_value(e, i, &prim(0x03, &[7, 0x81]));
            }),
            "extension 2.5.29.15: malformed",
        ),
        (
            "a SAN URI that is not IA5",
            Box::new(|c| {
                let e = exts(c);
                let i = ext_at(e, "2.5.29.17");
                set_ext_value(
                    e,
                    i,
                    &Node::Cons {
                        tag: 0x30,
                        children: vec![prim(0x86, "https://gïthub.com/x".as_bytes())],
                    },
                );
            }),
            "extension 2.5.29.17: malformed",
        ),
        (
            "an empty SAN",
            Box::new(|c| {
                let e = exts(c);
                let i = ext_at(e, "2.5.29.17");
                set_ext_value(
                    e,
                    i,
                    &Node::Cons {
                        tag: 0x30,
                        children: vec![],
                    },
                );
            }),
            "extension 2.5.29.17: malformed",
        ),
        (
            "basic constraints with a path length but no cA",
            Box::new(|c| {
                exts(c).push(Node::Cons {
                    tag: 0x30,
                    children: vec![
                        prim(0x06, &oid_content("2.5.29.19")),
                        prim(
                            0x04,
                            &Node::Cons {
                                tag: 0x30,
                                children: vec![prim(0x02, &[0])],
                            }
                            .encode(),
                        ),
                    ],
                });
            }),
            "extension 2.5.29.19: malformed",
        ),
        (
            "larger than the cap",
            Box::new(|c| {
                exts(c).push(Node::Cons {
                    tag: 0x30,
                    children: vec![
                        prim(0x06, &oid_content("1.2.3.4")),
                        prim(0x04, &vec![0u8; 40_000]),
                    ],
                });
            }),
            "larger than 32768 bytes",
        ),
    ];
    for (what, edit, says) in &leaf_edits {
        let mut tree = Node::parse_one(&leaf);
        edit(&mut tree);
        let der = tree.encode();
        match Cert::from_der(der) {
            Err(e) => assert!(e.contains(says), "{what}: {e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }

    // two names in the SAN: read, but no identity is picked
    let mut tree = Node::parse_one(&leaf);
    {
        let e = exts(&mut tree);
        let i = ext_at(e, "2.5.29.17");
        let mut v = ext_value(e, i);
        let first = v.kids()[0].clone();
        v.kids().push(first);
        set_ext_value(e, i, &v);
    }
    let c = Cert::from_der(tree.encode()).unwrap();
    let e = c.san().unwrap_err();
    assert!(e.contains("lists 2 names"), "{e}");
    // a DNS name alone is no identity
    let mut tree = Node::parse_one(&leaf);
    {
        let e = exts(&mut tree);
        let i = ext_at(e, "2.5.29.17");
        set_ext_value(
            e,
            i,
            &Node::Cons {
                tag: 0x30,
                children: vec![prim(0x82, b"example.com")],
            },
        );
    }
    let e = Cert::from_der(tree.encode()).unwrap().san().unwrap_err();
    assert!(
        e.contains("not a URI, an e-mail address or a Fulcio username"),
        "{e}"
    );

    // the intermediate's basic constraints
    let ca_edits: Vec<(&str, Vec<Node>)> = vec![
        ("cA FALSE encoded", vec![prim(0x01, &[0x00])]),
        ("cA as 0x01", vec![prim(0x01, &[0x01])]),
        (
            "a negative path length",
            vec![prim(0x01, &[0xff]), prim(0x02, &[0xff])],
        ),
        (
            "a path length with a needless zero",
            vec![prim(0x01, &[0xff]), prim(0x02, &[0, 1])],
        ),
        (
            "data after the path length",
            vec![prim(0x01, &[0xff]), prim(0x02, &[0]), prim(0x05, &[])],
        ),
    ];
    for (what, fields) in ca_edits {
        let mut tree = Node::parse_one(&ca);
        let e = exts(&mut tree);
        let i = ext_at(e, "2.5.29.19");
        set_ext_value(
            e,
            i,
            &Node::Cons {
                tag: 0x30,
                children: fields,
            },
        );
        let err = Cert::from_der(tree.encode()).unwrap_err();
        assert!(
            err.contains("extension 2.5.29.19: malformed"),
            "{what}: {err}"
        );
    }
    let c = Cert::from_der(ca).unwrap();
    let bc = c.basic_constraints().unwrap();
    assert!(bc.ca && bc.path_len == Some(0));
    assert_eq!(c.key_usage().unwrap() & KU_DIGITAL_SIGNATURE, 0);
}

// ---- CA chains ----

fn root_json(chain: &[&[u8]]) -> TrustedRoot {
    let json = serde_json::json!({
        "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "tlogs": [{"baseUrl": "https://rekor.invalid", "hashAlgorithm": "SHA2_256",
            "publicKey": {"rawBytes": "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE2G2Y+2tabdTV5BcGiBIx0a9fAFwrkBbmLSGtks4L3qX6yYY0zufBnhC8Ur/iy55GhWP/9A/bY2LhC30M9+RYtw==",
                "keyDetails": "PKIX_ECDSA_P256_SHA_256", "validFor": {"start": "2021-01-01T00:00:00Z"}},
            "logId": {"keyId": "wNI9atQGlz+VWfO6LRygH4QUfY/8W4RFwiT5i5WRgB0="}}],
        "certificateAuthorities": [{"uri": "https://fulcio.invalid",
            "certChain": {"certificates": chain.iter().map(|c| serde_json::json!({"rawBytes": B64.encode(c)})).collect::<Vec<_>>()},
            "validFor": {"start": "2021-01-01T00:00:00Z"}}],
    });
    TrustedRoot::parse(&serde_json::to_vec(&json).unwrap()).unwrap()
}

#[test]
fn ca_chains_are_checked_as_rfc_5280_and_openssl_check_them() {
    require_openssl();
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    openssl_cnf(
        d,
        "[t_root]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
[t_intermediate]
basicConstraints = critical,CA:TRUE,pathlen:0
keyUsage = critical,keyCertSign,cRLSign
extendedKeyUsage = codeSigning
[t_not_ca]
basicConstraints = critical,CA:FALSE
keyUsage = critical,keyCertSign,cRLSign
[t_no_cert_sign]
basicConstraints = critical,CA:TRUE
keyUsage = critical,digitalSignature
[t_server_only]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign
extendedKeyUsage = serverAuth
[t_leaf]
keyUsage = critical,digitalSignature
extendedKeyUsage = codeSigning
subjectAltName = critical,URI:https://github.com/org/node/.github/workflows/p.yml@refs/heads/main
",
    );
    let root = self_signed(
        d,
        "root",
        "ec:P-384",
        "/O=kubeslot.test/CN=root",
        "",
        "t_root",
    );
    let at = Cert::from_der(root.clone()).unwrap().validity().0 + 60;
    let check = |chain: &[&[u8]], leaf: &[u8]| {
        let leaf = Cert::from_der(leaf.to_vec()).unwrap();
        verify_chain(&leaf, &root_json(chain), at).map(|_| ())
    };
    let openssl_accepts = |untrusted: &[&str], leaf: &str| {
        let pems: String = untrusted
            .iter()
            .map(|n| std::fs::read_to_string(d.join(format!("{n}.pem"))).unwrap())
            .collect();
        std::fs::write(d.join("untrusted.pem"), pems).unwrap();
        let pem = format!("{leaf}.pem");
        let args = [
            "verify",
            "-x509_strict",
            "-CAfile",
            "root.pem",
            "-untrusted",
            "untrusted.pem",
            &pem,
        ];
        run(d, &args).0
    };

    // root → intermediate (pathlen 0) → leaf: both accept
    let int = issued(d, "int", "root", "t_intermediate");
    let leaf = issued(d, "leaf", "int", "t_leaf");
    check(&[&int, &root], &leaf).unwrap();
    assert!(openssl_accepts(&["int"], "leaf"));
    // one intermediate too many below the path length 0
    let int2 = issued(d, "int2", "int", "t_root");
    let leaf2 = issued(d, "leaf2", "int2", "t_leaf");
    let e = check(&[&int2, &int, &root], &leaf2).unwrap_err();
    assert!(
        e.contains("allows 0 intermediate CAs below it, the chain has 1"),
        "{e}"
    );
    assert!(!openssl_accepts(&["int", "int2"], "leaf2"));
    // an issuer that is not a CA
    let not_ca = issued(d, "not_ca", "root", "t_not_ca");
    let leaf3 = issued(d, "leaf3", "not_ca", "t_leaf");
    let e = check(&[&not_ca, &root], &leaf3).unwrap_err();
    assert!(e.contains("is not a CA (basic constraints)"), "{e}");
    assert!(!openssl_accepts(&["not_ca"], "leaf3"));
    // a CA whose key usage lacks certificate signing
    let no_sign = issued(d, "no_sign", "root", "t_no_cert_sign");
    let leaf4 = issued(d, "leaf4", "no_sign", "t_leaf");
    let e = check(&[&no_sign, &root], &leaf4).unwrap_err();
    assert!(e.contains("key usage lacks certificate signing"), "{e}");
    assert!(!openssl_accepts(&["no_sign"], "leaf4"));
    // a CA restricted to TLS servers (Go's verifier, which cosign uses,
    // refuses it for code signing; openssl checks no purpose by default)
    let server = issued(d, "server", "root", "t_server_only");
    let leaf5 = issued(d, "leaf5", "server", "t_leaf");
    let e = check(&[&server, &root], &leaf5).unwrap_err();
    assert!(
        e.contains("extended key usage does not allow code signing"),
        "{e}"
    );
}
