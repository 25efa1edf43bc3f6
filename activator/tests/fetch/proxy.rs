//! The config's egress proxy (issue 42): every registry request of `unpack`
//! goes through it (tinyproxy, Debian's, on a free 127.0.0.1 port, logs each
//! request), a proxy that is down fails the run instead of being bypassed,
//! and a host `no_proxy` names is reached directly.

use super::*;

/// tinyproxy in the foreground on a free 127.0.0.1 port; killed on drop.
struct Tinyproxy {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    fn start() -> Tinyproxy {
        let bin = require_tool("tinyproxy", "tinyproxy");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = dir.path().join("tinyproxy.log");
        let conf = dir.path().join("tinyproxy.conf");
        fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 60\nLogFile \"{}\"\nLogLevel Connect\n\
                 PidFile \"{}\"\nMaxClients 20\nAllow 127.0.0.1\n",
                log.display(),
                dir.path().join("tinyproxy.pid").display()
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tinyproxy did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Tinyproxy {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `host`'s config with `proxy` set.
fn set_proxy(host: &Host, proxy: serde_json::Value) {
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&fs::read(&host.config).unwrap()).unwrap();
    cfg["proxy"] = proxy;
    fs::write(&host.config, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
}

#[test]
fn registry_requests_go_through_the_configured_proxy_and_never_around_it() {
    let reg = Registry::start();
    let proxy = Tinyproxy::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(1);
    let (layout, v1) = small_image(&work.path().join("v1"), "v1", b"1\n", Some(&k));
    push_all(&layout, &reg, "test/node");
    let image = format!("{}/test/node:v1", reg.host());

    // through the proxy: the image arrives, and the proxy saw the registry
    let host = Host::new(&[&k], false, no_registries());
    let url = format!("http://127.0.0.1:{}", proxy.port);
    set_proxy(&host, serde_json::json!({"https": url, "http": url}));
    let out = host.unpack_ok(&image, &host.target("a"));
    assert_eq!(out["image_digest"], v1.index.to_string());
    let log = proxy.log();
    // the client tunnels (CONNECT) to the registry, plain HTTP included
    assert!(
        log.contains(&format!(": CONNECT {} HTTP/1.1", reg.host())),
        "the proxy was never asked for the registry:\n{log}"
    );

    // a proxy that is down: the run fails, it does not go around it
    let host = Host::new(&[&k], false, no_registries());
    let down = format!("http://127.0.0.1:{}", free_port());
    set_proxy(&host, serde_json::json!({"http": down}));
    let err = host.unpack_err(&image, &host.target("b"));
    assert!(err.contains("connection failed"), "{err}");

    // no_proxy names the registry: reached directly, the dead proxy unused
    let host = Host::new(&[&k], false, no_registries());
    set_proxy(
        &host,
        serde_json::json!({"http": down, "no_proxy": ["127.0.0.1"]}),
    );
    let out = host.unpack_ok(&image, &host.target("c"));
    assert_eq!(out["image_digest"], v1.index.to_string());
}
