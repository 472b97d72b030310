//! The control endpoint under clients that do not behave: tokens compared without leaking
//! their content or length, and connections that never authenticate kept apart from the
//! operator's, with a deadline for their first request.
#![allow(clippy::unwrap_used)]

use ina_switch::control::tokens_match;
use ina_switch::{ControlClient, ControlLimits, ControlServer, Request, Switch, SwitchConfig};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn tokens_match_only_when_equal_whatever_their_lengths() {
    let t = b"a-token-of-twenty-chars";
    assert!(tokens_match(t, t));
    assert!(!tokens_match(b"a-token-of-twenty-charz", t));
    assert!(!tokens_match(b"a-token", t));
    assert!(!tokens_match(b"", t));
    assert!(!tokens_match(b"a-token-of-twenty-chars-and-more", t));
}

/// A switch with a control endpoint of `limits` on loopback; stops when the flag is dropped.
struct Endpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn endpoint(limits: ControlLimits) -> Endpoint {
    let sw = Switch::bind(SwitchConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
    let handle = sw.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let server =
        ControlServer::bind_with("127.0.0.1:0".parse().unwrap(), handle.clone(), limits).unwrap();
    let addr = server.local_addr().unwrap();
    let s = stop.clone();
    std::thread::spawn(move || sw.run(s));
    server.spawn(stop.clone()).unwrap();
    assert!(handle.wait_running(Duration::from_secs(10)));
    Endpoint { addr, stop }
}

fn answer(s: &TcpStream) -> Option<String> {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line),
    }
}

/// Polls `f` every 20 ms until it holds or `limit` passes.
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn clients_that_never_authenticate_cannot_lock_the_operator_out() {
    let token = "a-token-of-twenty-chars";
    let ep = endpoint(ControlLimits {
        token: Some(token.into()),
        max_connections: 4,
        max_unadmitted: 3,
        first_request: Duration::from_millis(800),
        ..Default::default()
    });
    // The operator is in before the flood.
    let mut operator = ControlClient::connect_with_token(ep.addr, Some(token)).unwrap();
    // Silent clients take every place for connections awaiting their first request ...
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(ep.addr).unwrap())
        .collect();
    // ... so the next one is told so and closed ...
    let refused = eventually(Duration::from_secs(5), || {
        let s = TcpStream::connect(ep.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        answer(&s).is_some_and(|a| a.contains("awaiting their first request"))
    });
    assert!(refused, "a fourth silent client was not refused");
    // ... while the operator, admitted, is served throughout.
    assert!(operator.call(&Request::Ping).unwrap().ok);
    // Silent past the first request's deadline: closed, their places free again.
    for s in &silent {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert!(answer(s).unwrap().contains("no request in time"));
    }
    let mut second = None;
    assert!(eventually(Duration::from_secs(5), || {
        second = ControlClient::connect_with_token(ep.addr, Some(token)).ok();
        second.is_some()
    }));
    assert!(second.unwrap().call(&Request::Ping).unwrap().ok);
    assert!(operator.call(&Request::Ping).unwrap().ok);
}

#[test]
fn admitted_connections_are_bounded_apart_from_waiting_ones() {
    let ep = endpoint(ControlLimits {
        max_connections: 2,
        max_unadmitted: 2,
        ..Default::default()
    });
    let a = ControlClient::connect(ep.addr).unwrap();
    let b = ControlClient::connect(ep.addr).unwrap();
    let (mut a, mut b) = (a, b);
    assert!(a.call(&Request::Ping).unwrap().ok);
    assert!(b.call(&Request::Ping).unwrap().ok);
    // A third is accepted, but its first request finds the admitted places taken.
    let s = TcpStream::connect(ep.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    writeln!(&s, "{{\"op\":\"ping\"}}").unwrap();
    assert!(answer(&s).unwrap().contains("too many control connections"));
    drop(a);
    assert!(eventually(Duration::from_secs(5), || {
        ControlClient::connect(ep.addr)
            .and_then(|mut c| c.call(&Request::Ping))
            .is_ok_and(|r| r.ok)
    }));
    assert!(b.call(&Request::Ping).unwrap().ok);
}
