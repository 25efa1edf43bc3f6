//! Mirrors as attackers: user info in a mirror URL and a token realm that
//! redirects to plain HTTP (issue 26, finding 7).

use super::*;

/// Finding 7: `unpack --config` accepted a mirror URL with user info (only
/// the host config path refused it), and a failing mirror printed
/// `mirror http://user:password@host` in the error. Every command that
/// reads `registries` refuses it the same way now, and nothing it prints
/// or records holds the password.
#[test]
fn mirror_user_info_is_refused_by_every_command_and_never_shown() {
    const SECRET: &str = "hunter2-mirror-secret";
    let n = Node::new("copy");
    let (registry, mirror) = (
        kubeslot_test_support::free_port(),
        kubeslot_test_support::free_port(),
    );
    let registries = serde_json::json!({ format!("127.0.0.1:{registry}"): {
        "mirrors": [format!("http://bob:{SECRET}@127.0.0.1:{mirror}")]}});
    let image = format!("127.0.0.1:{registry}/test/node:v1");
    let check = |what: &str, texts: &[&str]| {
        let all = texts.join("\n");
        assert!(!all.contains(SECRET), "{what} shows the password:\n{all}");
        assert!(
            all.contains("mirror 1") && all.contains("user info"),
            "{what}:\n{all}"
        );
    };

    // unpack, with only the sections it reads
    let cfg = n.dir.path().join("unpack.json");
    fs::write(
        &cfg,
        serde_json::to_vec(&serde_json::json!({
            "registries": registries, "trust": {"allow_unsigned": true}}))
        .unwrap(),
    )
    .unwrap();
    let out: Output = Command::new(BIN)
        .args(["unpack", "--config"])
        .arg(&cfg)
        .arg("--root")
        .arg(n.root.dir())
        .arg(&image)
        .arg(n.dir.path().join("target"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    check(
        "unpack",
        &[
            &String::from_utf8_lossy(&out.stdout),
            &String::from_utf8_lossy(&out.stderr),
        ],
    );

    // the host commands, report included
    n.set("/image", image.into());
    let mut c: serde_json::Value = serde_json::from_slice(&fs::read(&n.config).unwrap()).unwrap();
    c["registries"] = registries;
    fs::write(&n.config, serde_json::to_vec(&c).unwrap()).unwrap();
    for (what, ran) in [
        (
            "activate",
            activate::activate(&n.root, &n.config, &n.fake, &Options::default()),
        ),
        (
            "fetch",
            activate::fetch(&n.root, &n.config, &n.fake, &Options::default()),
        ),
    ] {
        assert_eq!(
            ran.report.exit_code,
            exit::CONFIG,
            "{what}: {:?}",
            ran.report
        );
        let saved = fs::read_to_string(n.root.report_file()).unwrap();
        check(what, &[ran.report.error.as_deref().unwrap(), &saved]);
    }
}

/// Finding 9: the token-realm request had no `https_only`: an https realm
/// could redirect the token fetch to plain HTTP. A TLS registry (openssl
/// s_server, answering from files) challenges with an https realm that
/// redirects to a plain-HTTP listener; the activator never asks it.
#[test]
fn an_https_token_realm_cannot_redirect_to_plain_http() {
    use std::io::Read as _;
    let openssl = require_tool("openssl", "openssl");
    let work = tempfile::tempdir().unwrap();
    let (ca, cert, key) = crate::fetch::test_ca(work.path());
    // the plain-HTTP listener the realm redirects to
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_port = plain.local_addr().unwrap().port();
    plain.set_nonblocking(true).unwrap();
    let port = kubeslot_test_support::free_port();
    let www = work.path().join("www");
    fs::create_dir_all(www.join("v2/test/node/manifests")).unwrap();
    fs::write(
        www.join("v2/test/node/manifests/v1"),
        format!("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"https://127.0.0.1:{port}/token\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    )
    .unwrap();
    fs::write(
        www.join("token?scope=repository%3Atest%2Fnode%3Apull"),
        format!("HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{plain_port}/token\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    )
    .unwrap();
    let mut server = Command::new(&openssl)
        .args([
            "s_server",
            "-quiet",
            "-HTTP",
            "-accept",
            &port.to_string(),
            "-cert",
        ])
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .current_dir(&www)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "openssl s_server did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let root = work.path().join("root");
    fs::create_dir_all(root.join("etc/kubeslot")).unwrap();
    fs::copy(&ca, root.join("etc/kubeslot/ca.pem")).unwrap();
    let cfg = work.path().join("cfg.json");
    fs::write(
        &cfg,
        serde_json::to_vec(&serde_json::json!({
            "registries": {format!("127.0.0.1:{port}"): {"ca_file": "/etc/kubeslot/ca.pem"}},
            "trust": {"allow_unsigned": true}}))
        .unwrap(),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["unpack", "--config"])
        .arg(&cfg)
        .arg("--root")
        .arg(&root)
        .arg(format!("127.0.0.1:{port}/test/node:v1"))
        .arg(work.path().join("target"))
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let mut asked = Vec::new();
    if let Ok((mut s, _)) = plain.accept() {
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap_or(0);
        asked.extend_from_slice(&buf[..n]);
    }
    assert!(
        asked.is_empty(),
        "the token request went to plain HTTP: {}",
        String::from_utf8_lossy(&asked)
    );
    // refused at the redirect itself, naming the realm and where it pointed
    assert!(
        err.contains("token realm")
            && err.contains("https only")
            && err.contains(&format!("http://127.0.0.1:{plain_port}/token")),
        "{err}"
    );
}
