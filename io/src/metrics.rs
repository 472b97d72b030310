//! A Prometheus text endpoint: `GET /metrics` over HTTP/1.x, answered with what a closure
//! renders ([`Exposition`] writes the text format). One thread serves one connection at a time
//! with short timeouts, so a slow or hostile client costs a bounded amount and no thread per
//! connection; the endpoint is for a scraper or a person with curl, not for load.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Why the endpoint cannot start.
#[derive(Debug, thiserror::Error)]
#[error("metrics endpoint {addr}: {source}")]
pub struct MetricsError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// Builds a Prometheus text exposition.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.text, "{k}=\"{v}\"");
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A counter without labels.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> &mut Self {
        self.family(name, "counter", help);
        self.sample(name, &[], value as f64);
        self
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) -> &mut Self {
        self.family(name, "gauge", help);
        self.sample(name, &[], value);
        self
    }

    /// A counter with one label, one sample per `(label value, count)`.
    pub fn counters_by<'a>(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        values: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> &mut Self {
        self.family(name, "counter", help);
        for (v, n) in values {
            self.sample(name, &[(label, v)], n as f64);
        }
        self
    }

    /// The text.
    pub fn finish(self) -> String {
        self.text
    }
}

/// A running endpoint.
#[derive(Debug)]
pub struct MetricsServer {
    /// The address it listens on.
    pub local_addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl MetricsServer {
    /// Listens on `addr` and serves `render()` until `stop` is set or the server is dropped.
    pub fn spawn(
        addr: SocketAddr,
        render: impl Fn() -> String + Send + 'static,
        stop: Arc<AtomicBool>,
    ) -> Result<MetricsServer, MetricsError> {
        let err = |source| MetricsError { addr, source };
        let listener = TcpListener::bind(addr).map_err(err)?;
        listener.set_nonblocking(true).map_err(err)?;
        let local_addr = listener.local_addr().map_err(err)?;
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => serve(stream, &render),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Err(e) => {
                            tracing::debug!("metrics accept: {e}");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
            .map_err(err)?;
        Ok(MetricsServer {
            local_addr,
            thread: Some(thread),
            stop,
        })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The longest a client may take to send its whole request head.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);

/// Answers one request: `GET /metrics` gets the exposition, anything else 404 or 400.
fn serve(mut stream: TcpStream, render: &dyn Fn() -> String) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    // The request head, at most 4 KiB, within REQUEST_DEADLINE from the connection's accept
    // (each read waits only what is left of it: a client trickling a byte at a time cannot
    // hold the thread longer).
    let deadline = std::time::Instant::now() + REQUEST_DEADLINE;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while head.len() < 4096 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (status, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => ("200 OK", render()),
        (Some("GET"), Some(_)) => ("404 Not Found", "only /metrics is served\n".into()),
        _ => ("400 Bad Request", "GET /metrics\n".into()),
    };
    let reply = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(reply.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(request.as_bytes()).expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out
    }

    #[test]
    fn serves_the_exposition_and_refuses_other_paths() {
        let stop = Arc::new(AtomicBool::new(false));
        let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c = counter.clone();
        let server = MetricsServer::spawn(
            "127.0.0.1:0".parse().expect("addr"),
            move || {
                let mut e = Exposition::new();
                e.counter(
                    "ina_test_total",
                    "Scrapes so far.",
                    c.fetch_add(1, Ordering::Relaxed) + 1,
                )
                .counters_by(
                    "ina_drops_total",
                    "Drops by reason.",
                    "reason",
                    [("stale \"seq\"", 3u64), ("malformed", 0)],
                )
                .gauge("ina_rtt_seconds", "Smoothed round trip.", 0.25);
                e.finish()
            },
            stop,
        )
        .expect("spawn");
        let a = server.local_addr;
        let first = get(a, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(first.starts_with("HTTP/1.0 200 OK"), "{first}");
        assert!(first.contains("# TYPE ina_test_total counter\nina_test_total 1\n"));
        assert!(first.contains("ina_drops_total{reason=\"stale \\\"seq\\\"\"} 3\n"));
        assert!(first.contains("ina_rtt_seconds 0.25\n"));
        assert!(get(a, "GET /metrics HTTP/1.0\r\n\r\n").contains("ina_test_total 2\n"));
        assert!(get(a, "GET / HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 404"));
        assert!(get(a, "nonsense\r\n\r\n").starts_with("HTTP/1.0 400"));
        // A client that trickles its request a byte at a time, each within a second, is cut
        // off at the request's deadline, not served for as long as it keeps trickling.
        let mut slow = TcpStream::connect(a).expect("connect");
        let started = std::time::Instant::now();
        let mut cut_off_after = None;
        for b in b"GET /metrics HTTP/1.0\r\nX-Slow: ".iter().cycle().take(40) {
            std::thread::sleep(Duration::from_millis(300));
            if slow.write_all(&[*b]).is_err() {
                cut_off_after = Some(started.elapsed());
                break;
            }
        }
        // (40 bytes take 12 s to trickle in; the server closes at its deadline, and a write
        // or two later the client sees it.)
        let after = cut_off_after.expect("a trickling client was never cut off");
        assert!(after < REQUEST_DEADLINE * 3, "cut off only after {after:?}");
        // A client that says nothing is given up on; the next one is served.
        let silent = TcpStream::connect(a).expect("connect");
        assert!(get(a, "GET /metrics HTTP/1.0\r\n\r\n").contains("ina_test_total"));
        drop(silent);
        drop(server);
        assert!(TcpStream::connect(a).is_err(), "still listening after drop");
    }
}
