//! Registry authentication and TLS: basic auth from a password file, a bearer-
//! token registry (a token service made here), credentials never sent on to
//! another host after a redirect, a private CA per registry.

use super::*;

/// A `docker-registry` with htpasswd (basic) auth for one user.
fn auth_registry(user: &str, password: &str) -> (Registry, tempfile::TempDir) {
    let python = require_tool("python3", "python3");
    let dir = tempfile::tempdir().unwrap();
    // bcrypt at cost 4 (rounds=16): the registry checks it on every request.
    let out = Command::new(python)
        .args([
            "-W",
            "ignore",
            "-c",
            "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))",
            password,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = String::from_utf8(out.stdout).unwrap();
    let htpasswd = dir.path().join("htpasswd");
    fs::write(&htpasswd, format!("{user}:{}\n", hash.trim())).unwrap();
    // The registry reads htpasswd on every request: the dir lives as long as it.
    let reg = Registry::start_with(&format!(
        "auth:\n  htpasswd:\n    realm: kubeslot-test\n    path: {}\n",
        htpasswd.display()
    ));
    (reg, dir)
}

#[test]
fn basic_auth_with_a_password_file() {
    let (reg, _htpasswd) = auth_registry("node", "s3cret");
    let work = tempfile::tempdir().unwrap();
    let k = key(5);
    let (layout, built) = small_image(&work.path().join("l"), "v1", b"auth\n", Some(&k));
    push_all_with(
        &layout,
        &format!("{}/test/node", reg.host()),
        &["--dest-tls-verify=false", "--dest-creds", "node:s3cret"],
    );
    let image = format!("{}/test/node:v1", reg.host());

    let anonymous = Host::new(&[&k], false, no_registries());
    let err = anonymous.unpack_err(&image, &anonymous.target("t"));
    assert!(err.contains("credentials is not set"), "{err}");

    let host = Host::new(
        &[&k],
        false,
        serde_json::json!({ reg.host(): {"credentials": {
            "username": "node", "password_file": "/etc/kubeslot/registry-password"}}}),
    );
    fs::write(host.root.join("etc/kubeslot/registry-password"), "s3cret\n").unwrap();
    let out = host.unpack_ok(&image, &host.target("t"));
    assert_eq!(out["image_digest"], built.index.to_string());

    fs::write(host.root.join("etc/kubeslot/registry-password"), "wrong\n").unwrap();
    let err = host.unpack_err(&image, &host.target("t2"));
    assert!(err.contains("401"), "{err}");
}

/// RFC 4648 base32 (no padding), as libtrust uses for key IDs.
fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    let (mut buf, mut bits) = (0u32, 0);
    for &b in bytes {
        buf = (buf << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            out.push(ALPHABET[((buf >> (bits - 5)) & 31) as usize] as char);
            bits -= 5;
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buf << (5 - bits)) & 31) as usize] as char);
    }
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// A token service in the style of the distribution token spec: grants the
/// scopes asked for, as an ES256 JWT the real `docker-registry` verifies
/// against the root certificate it was given. Records every request line
/// and Authorization header it saw.
struct TokenService {
    realm: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

fn token_service(signer: SigningKey, kid: String) -> TokenService {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let realm = format!("http://{}/token", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = io::BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            if io::BufRead::read_line(&mut reader, &mut request).is_err() {
                continue;
            }
            let mut auth = String::new();
            loop {
                let mut line = String::new();
                if io::BufRead::read_line(&mut reader, &mut line).unwrap_or(0) == 0
                    || line == "\r\n"
                {
                    break;
                }
                if line.to_ascii_lowercase().starts_with("authorization:") {
                    auth = line.trim().to_string();
                }
            }
            log.lock()
                .unwrap()
                .push(format!("{} {auth}", request.trim()));
            let target = request.split_whitespace().nth(1).unwrap_or("").to_string();
            let query = target.split_once('?').map_or("", |(_, q)| q);
            let mut access = Vec::new();
            for pair in query.split('&') {
                if let Some(v) = pair.strip_prefix("scope=") {
                    let scope = percent_decode(v);
                    let mut parts = scope.splitn(3, ':');
                    let (kind, name, actions) = (
                        parts.next().unwrap_or(""),
                        parts.next().unwrap_or(""),
                        parts.next().unwrap_or(""),
                    );
                    access.push(serde_json::json!({
                        "type": kind, "name": name,
                        "actions": actions.split(',').collect::<Vec<_>>()
                    }));
                }
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
            let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "kid": kid});
            let claims = serde_json::json!({
                "iss": "kubeslot-test-issuer", "sub": "node", "aud": "kubeslot-test",
                "exp": now + 600, "nbf": now - 60, "iat": now - 60, "jti": format!("{now}"),
                "access": access,
            });
            let signing_input = format!(
                "{}.{}",
                b64(&serde_json::to_vec(&header).unwrap()),
                b64(&serde_json::to_vec(&claims).unwrap())
            );
            let sig: Signature = signer.sign(signing_input.as_bytes());
            let token = format!("{signing_input}.{}", b64(&sig.to_bytes()));
            let body = serde_json::to_vec(&serde_json::json!({"token": token})).unwrap();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(&body);
        }
    });
    TokenService { realm, seen }
}

#[test]
fn bearer_token_auth_against_a_token_registry() {
    let openssl = require_tool("openssl", "openssl");
    let work = tempfile::tempdir().unwrap();
    // The token signing key and its self-signed certificate (the registry's
    // root bundle), made by the real openssl.
    let key_pem = work.path().join("token-key.pem");
    let cert_pem = work.path().join("token-cert.pem");
    let run = |args: &[&str]| {
        let out = Command::new(&openssl).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        key_pem.to_str().unwrap(),
    ]);
    run(&[
        "req",
        "-x509",
        "-new",
        "-key",
        key_pem.to_str().unwrap(),
        "-subj",
        "/CN=kubeslot-test-token",
        "-days",
        "2",
        "-out",
        cert_pem.to_str().unwrap(),
    ]);
    use p256::pkcs8::DecodePrivateKey as _;
    let signer = SigningKey::from_pkcs8_pem(&fs::read_to_string(&key_pem).unwrap()).unwrap();
    // libtrust key ID: base32 of the first 240 bits of sha256(SPKI DER), in groups of 4.
    let spki = signer.verifying_key().to_public_key_der().unwrap();
    let hash = Digest::of(spki.as_bytes());
    let encoded = base32(&hash.as_bytes()[..30]);
    let kid = encoded
        .as_bytes()
        .chunks(4)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(":");
    let tokens = token_service(signer, kid);

    let reg = Registry::start_with(&format!(
        "auth:\n  token:\n    realm: {}\n    service: kubeslot-test\n    issuer: kubeslot-test-issuer\n    rootcertbundle: {}\n",
        tokens.realm,
        cert_pem.display()
    ));
    let port = reg.port();

    let k = key(7);
    let (layout, built) = small_image(&work.path().join("l"), "v1", b"bearer\n", Some(&k));
    push_all_with(
        &layout,
        &format!("127.0.0.1:{port}/test/node"),
        &["--dest-tls-verify=false", "--dest-creds", "node:s3cret"],
    );
    tokens.seen.lock().unwrap().clear();

    let host = Host::new(
        &[&k],
        false,
        serde_json::json!({ format!("127.0.0.1:{port}"): {"credentials": {
            "username": "node", "password_file": "/etc/kubeslot/registry-password"}}}),
    );
    fs::write(host.root.join("etc/kubeslot/registry-password"), "s3cret\n").unwrap();
    let out = host.unpack_ok(&format!("127.0.0.1:{port}/test/node:v1"), &host.target("t"));
    assert_eq!(out["image_digest"], built.index.to_string());
    assert_eq!(
        fs::read(host.target("t").join("opt/app/version")).unwrap(),
        b"bearer\n"
    );
    let seen = tokens.seen.lock().unwrap().clone();
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("node:s3cret")
    );
    assert!(!seen.is_empty(), "no token was requested");
    for line in &seen {
        assert!(
            line.contains("scope=repository%3Atest%2Fnode%3Apull")
                && line.contains("service=kubeslot-test"),
            "{line}"
        );
        assert!(
            line.contains(&basic),
            "token request without the configured credentials: {line}"
        );
    }
    // One token per run: it is cached for every later request.
    assert_eq!(seen.len(), 1, "{seen:?}");
}

/// A registry (or a hostile mirror in front of it) that redirects a blob
/// elsewhere gets the registry's credentials sent only to itself: the
/// redirect target sees no `Authorization` header.
#[test]
fn credentials_never_follow_a_redirect_to_another_host() {
    use kubeslot_test_support::relay::{Answer, Relay};
    use std::io::{BufRead as _, BufReader};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    let (reg, _htpasswd) = auth_registry("node", "s3cret");
    let work = tempfile::tempdir().unwrap();
    let k = key(6);
    let (layout, _) = small_image(&work.path().join("l"), "v1", b"redirect\n", Some(&k));
    push_all_with(
        &layout,
        &format!("{}/test/node", reg.host()),
        &["--dest-tls-verify=false", "--dest-creds", "node:s3cret"],
    );
    // Another host: records the request head it gets, answers 404.
    let capture = TcpListener::bind("127.0.0.1:0").unwrap();
    let elsewhere = format!("127.0.0.1:{}", capture.local_addr().unwrap().port());
    let heads: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let heads = heads.clone();
        std::thread::spawn(move || {
            for conn in capture.incoming().flatten() {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                heads.lock().unwrap().push(head);
                let _ = (&conn).write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        });
    }
    let target = elsewhere.clone();
    let relay = Relay::start(&reg.host(), Duration::ZERO, move |_, path, _| {
        if path.contains("/blobs/") {
            Answer::Respond {
                status: 307,
                headers: vec![("Location".into(), format!("http://{target}/storage{path}"))],
            }
        } else {
            Answer::Forward
        }
    });
    let host = Host::new(
        &[&k],
        false,
        serde_json::json!({ relay.host(): {"credentials": {
            "username": "node", "password_file": "/etc/kubeslot/registry-password"}}}),
    );
    fs::write(host.root.join("etc/kubeslot/registry-password"), "s3cret\n").unwrap();
    let err = host.unpack_err(&format!("{}/test/node:v1", relay.host()), &host.target("t"));
    assert!(err.contains("404"), "{err}");
    let heads = heads.lock().unwrap();
    assert!(!heads.is_empty(), "the redirect was not followed: {err}");
    for h in heads.iter() {
        assert!(
            !h.to_ascii_lowercase().contains("authorization:"),
            "credentials followed the redirect:\n{h}"
        );
    }
    // The relay (the configured host) did get authenticated requests: its
    // manifest answers were 200, not 401.
    assert!(
        relay
            .seen()
            .iter()
            .any(|s| s.path.contains("/manifests/") && s.status == 200),
        "{:?}",
        relay.seen()
    );
}

/// `registries.<host>.ca_file`: a registry serving TLS with a private CA
/// (Debian's docker-registry with a certificate the test made) is pulled
/// from over HTTPS with that CA, even on loopback, and refused without it,
/// naming the host and the certificate problem.
#[test]
fn a_private_ca_per_registry_makes_its_tls_trusted() {
    let work = tempfile::tempdir().unwrap();
    let (ca, crt, srv_key) = test_ca(work.path());
    let reg = Registry::start_with(&format!(
        "  tls:\n    certificate: {}\n    key: {}\n",
        crt.display(),
        srv_key.display()
    ));
    let k = key(9);
    let (layout, built) = small_image(&work.path().join("l"), "v1", b"tls\n", Some(&k));
    // skopeo's cert dir: the CA only (a *.key there is a client key)
    let certs = work.path().join("certs");
    fs::create_dir(&certs).unwrap();
    fs::copy(&ca, certs.join("ca.crt")).unwrap();
    let cert_dir = format!("--dest-cert-dir={}", certs.display());
    push_all_with(&layout, &format!("{}/test/node", reg.host()), &[&cert_dir]);
    let image = format!("{}/test/node:v1", reg.host());
    let host = Host::new(
        &[&k],
        false,
        serde_json::json!({ reg.host(): {"ca_file": "/etc/kubeslot/mirror-ca.pem"} }),
    );
    fs::copy(&ca, host.root.join("etc/kubeslot/mirror-ca.pem")).unwrap();
    let out = host.unpack_ok(&image, &host.target("t"));
    assert_eq!(out["manifest_digest"], built.manifest.to_string());

    // Without the CA file's certificate (another CA): refused, naming the
    // endpoint and the certificate.
    let other = tempfile::tempdir().unwrap();
    let (other_ca, _, _) = test_ca(other.path());
    fs::copy(&other_ca, host.root.join("etc/kubeslot/mirror-ca.pem")).unwrap();
    let err = host.unpack_err(&image, &host.target("t2"));
    assert!(
        err.contains(&format!("https://{}", reg.host()))
            && err.to_lowercase().contains("certificate"),
        "{err}"
    );
    // A CA file that is not PEM: the error names the file.
    fs::write(
        host.root.join("etc/kubeslot/mirror-ca.pem"),
        "not a certificate\n",
    )
    .unwrap();
    let err = host.unpack_err(&image, &host.target("t3"));
    assert!(err.contains("mirror-ca.pem"), "{err}");
}
