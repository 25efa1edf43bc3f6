//! A relay in front of a real registry that can answer some requests itself
//! (429 with `Retry-After`, 503, ...) and forwards the rest unchanged: the
//! registry stays real, only the refusals are scripted.
//!
//! Given the upstream `host:port` and a rule that sees each request (method,
//! path, how many times that method and path were asked before), it
//! listens on a free 127.0.0.1 port, one connection per request (it asks
//! the upstream to close, so every answer ends the connection), and
//! records what it saw: method, path, status, when, and how many requests
//! were waiting for an answer at once (a client that sends its next request
//! only after the last answer can never make that more than 1).
//!
//! It speaks just enough HTTP/1.1 for GET and HEAD: no request bodies, no
//! TLS.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the relay does with one request.
#[derive(Clone, Debug)]
pub enum Answer {
    /// Pass it to the registry and its answer back.
    Forward,
    /// Answer it here, with an empty body and these extra headers.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
    },
}

impl Answer {
    /// `429 Too Many Requests` with `Retry-After: value`.
    pub fn too_many(retry_after: &str) -> Answer {
        Answer::Respond {
            status: 429,
            headers: vec![("Retry-After".into(), retry_after.into())],
        }
    }
}

/// One request the relay answered.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub status: u16,
    /// When the request arrived.
    pub at: Instant,
}

type Rule = dyn Fn(&str, &str, usize) -> Answer + Send + Sync;

struct Shared {
    seen: Vec<Seen>,
    asked: HashMap<(String, String), usize>,
    waiting: usize,
    max_waiting: usize,
}

/// A running relay; stops accepting when dropped.
pub struct Relay {
    port: u16,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Relays to `upstream` (`127.0.0.1:PORT`). `rule(method, path, n)`
    /// decides; `n` counts earlier requests with the same method and path.
    /// Each request is held `hold` before it is answered, so requests a
    /// client sends at once overlap visibly.
    pub fn start(
        upstream: &str,
        hold: Duration,
        rule: impl Fn(&str, &str, usize) -> Answer + Send + Sync + 'static,
    ) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Mutex::new(Shared {
            seen: Vec::new(),
            asked: HashMap::new(),
            waiting: 0,
            max_waiting: 0,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let rule: Arc<Rule> = Arc::new(rule);
        let upstream = upstream.to_string();
        {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (shared, rule, upstream) = (shared.clone(), rule.clone(), upstream.clone());
                    std::thread::spawn(move || {
                        let _ = serve(conn, &upstream, hold, &*rule, &shared);
                    });
                }
            });
        }
        Relay { port, shared, stop }
    }

    /// `127.0.0.1:<port>`, to put in image references.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Every request answered so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        let mut v = self.shared.lock().unwrap().seen.clone();
        v.sort_by_key(|s| s.at);
        v
    }

    /// The most requests that were waiting for an answer at the same time.
    pub fn max_waiting(&self) -> usize {
        self.shared.lock().unwrap().max_waiting
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(
    mut client: TcpStream,
    upstream: &str,
    hold: Duration,
    rule: &Rule,
    shared: &Mutex<Shared>,
) -> std::io::Result<()> {
    let at = Instant::now();
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(()); // closed before a full request
        }
        let end = line == "\r\n" || line == "\n";
        head.push(line);
        if end {
            break;
        }
    }
    let mut first = head[0].split_whitespace();
    let method = first.next().unwrap_or_default().to_string();
    let path = first.next().unwrap_or_default().to_string();
    let answer = {
        let mut s = shared.lock().unwrap();
        s.waiting += 1;
        s.max_waiting = s.max_waiting.max(s.waiting);
        let n = s.asked.entry((method.clone(), path.clone())).or_insert(0);
        let nth = *n;
        *n += 1;
        rule(&method, &path, nth)
    };
    std::thread::sleep(hold);
    let done = |status: u16| {
        let mut s = shared.lock().unwrap();
        s.waiting -= 1;
        s.seen.push(Seen {
            method: method.clone(),
            path: path.clone(),
            status,
            at,
        });
    };
    match answer {
        Answer::Respond { status, headers } => {
            done(status);
            let mut out =
                format!("HTTP/1.1 {status} Relay\r\nContent-Length: 0\r\nConnection: close\r\n");
            for (k, v) in headers {
                out += &format!("{k}: {v}\r\n");
            }
            out += "\r\n";
            client.write_all(out.as_bytes())?;
        }
        Answer::Forward => {
            let mut up = TcpStream::connect(upstream)?;
            let mut req = String::new();
            for line in &head[..head.len() - 1] {
                if !line.to_ascii_lowercase().starts_with("connection:") {
                    req += line;
                }
            }
            req += "Connection: close\r\n\r\n";
            up.write_all(req.as_bytes())?;
            let mut up_reader = BufReader::new(up);
            let mut status_line = String::new();
            up_reader.read_line(&mut status_line)?;
            let status = status_line
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            done(status);
            client.write_all(status_line.as_bytes())?;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = up_reader.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                client.write_all(&buf[..n])?;
            }
        }
    }
    client.flush()?;
    let _ = client.shutdown(Shutdown::Both);
    Ok(())
}
