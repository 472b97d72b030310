//! The controller's API against clients that do not behave: a request cannot name a file for
//! the controller to write or a namespace for it to enter, a client that sends its request
//! slowly is cut off, connections beyond the limit are closed, and a controller started
//! without a token keeps one that only its user can read.
#![allow(clippy::unwrap_used)]

mod common;

use common::RunningController;

use ina_controller::alloc::Policy;
use ina_controller::server::ServerConfig;
use ina_controller::service::{drivers_with, Controller, LocalDrivers};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// The access token of the controllers started here.
const TOKEN: &str = "security-test-token-0123456789";

/// A controller requiring `config`'s token, or [`TOKEN`] if it has none.
fn start(tofino_dir: &Path, mut config: ServerConfig) -> RunningController {
    if config.token.is_empty() {
        config.token = TOKEN.to_string();
    }
    let local = LocalDrivers {
        tofino_dir: tofino_dir.to_path_buf(),
        ..LocalDrivers::default()
    };
    let ctl = Controller::open(Policy::FairShare, None, drivers_with(local)).unwrap();
    RunningController::serve(ctl, "127.0.0.1:0", config)
}

/// Sends `request` whole and returns the answer (until the server closes).
fn http(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// `GET /v1/health`, with the token, as one request.
fn health() -> String {
    format!("GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n")
}

fn post(addr: SocketAddr, path: &str, body: &str) -> String {
    http(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// A Tofino switch as a request describes it, with `extra` fields in its `p4`.
fn tofino_switch(extra: &str) -> String {
    format!(
        r#"{{"name":"t1","kind":"tofino","control":"127.0.0.1:50052","data":"198.18.0.100:18766","slots":1024,"elems_per_slot":64,
            "p4":{{"switch":{{"mac":"02:00:00:00:00:64","ip":"198.18.0.100","ports":[0,1],
              "l2":[{{"mac":"02:00:00:00:01:00","port":0}},{{"mac":"02:00:00:00:01:01","port":1}}],"flood_mgrp":65535}},
              "hosts":[{{"ip":"198.18.1.1","mac":"02:00:00:00:01:00"}},{{"ip":"198.18.1.2","mac":"02:00:00:00:01:01"}}]{extra}}}}}"#
    )
}

#[test]
fn a_request_names_no_file_or_namespace_for_the_controller() {
    let dir = std::env::temp_dir().join(format!("ina-ctl-sec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim");
    let ctl = start(&dir.join("tofino"), ServerConfig::default());
    for extra in [
        format!(r#","bfrt_file":"{}""#, victim.display()),
        r#","netns":"someone-elses""#.to_string(),
    ] {
        let answer = post(ctl.addr, "/v1/switches", &tofino_switch(&extra));
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("unknown field"), "{answer}");
    }
    assert!(!victim.exists());
    // Without them the switch is taken, and its document goes where the controller says.
    let answer = post(ctl.addr, "/v1/switches", &tofino_switch(""));
    assert!(answer.starts_with("HTTP/1.1 2"), "{answer}");
    assert!(dir.join("tofino").join("t1.json").is_file());
    drop(ctl);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_slow_client_is_cut_off_and_connections_are_bounded() {
    let dir = std::env::temp_dir().join(format!("ina-ctl-slow-{}", std::process::id()));
    let ctl = start(
        &dir,
        ServerConfig {
            max_connections: 2,
            header_timeout: Duration::from_millis(500),
            ..ServerConfig::default()
        },
    );
    // A client sending its request head a byte at a time is cut off at the head's deadline.
    let mut slow = TcpStream::connect(ctl.addr).unwrap();
    let started = Instant::now();
    let mut cut_off_after = None;
    for b in b"GET /v1/health HTTP/1.1\r\nX-Slow: "
        .iter()
        .cycle()
        .take(60)
    {
        std::thread::sleep(Duration::from_millis(100));
        if slow.write_all(&[*b]).is_err() {
            cut_off_after = Some(started.elapsed());
            break;
        }
    }
    let after = cut_off_after.expect("a client trickling its head for 6 s was never cut off");
    assert!(
        after < Duration::from_secs(3),
        "cut off only after {after:?}"
    );
    // Two silent connections take both places: a third is closed without an answer ...
    let silent: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(ctl.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let answer = http(ctl.addr, &health());
    assert!(!answer.contains("200 OK"), "{answer}");
    // ... until their heads' deadline frees the places.
    drop(silent);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = http(ctl.addr, &health());
        if answer.contains("200 OK") {
            break;
        }
        assert!(Instant::now() < deadline, "never served again: {answer}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_controller_without_a_token_keeps_one_only_its_user_can_read() {
    use ina_controller::token::{self, TokenError};
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("ina-ctl-token-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let loopback: SocketAddr = "127.0.0.1:7070".parse().unwrap();
    // Made on the first start, in the state directory, for this user only.
    let (made, file) = token::resolve(loopback, None, &dir).unwrap();
    let file = file.unwrap();
    assert_eq!(file, dir.join("token"));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(made.len(), 64);
    assert!(made.bytes().all(|b| b.is_ascii_hexdigit()), "{made}");
    assert_eq!(token::read(&file).unwrap(), made);
    // Kept across restarts (the workers of running jobs keep theirs), and never the same
    // in two directories.
    assert_eq!(token::resolve(loopback, None, &dir).unwrap().0, made);
    let other = dir.join("other");
    assert_ne!(token::resolve(loopback, None, &other).unwrap().0, made);
    // A given token is used as it is, and checked; beyond loopback one must be given.
    let given = "a-given-token-0123456789".to_string();
    assert_eq!(
        token::resolve(loopback, Some(given.clone()), &dir).unwrap(),
        (given, None)
    );
    assert!(matches!(
        token::resolve(loopback, Some("short".into()), &dir),
        Err(TokenError::Bad)
    ));
    let everywhere: SocketAddr = "0.0.0.0:7070".parse().unwrap();
    let e = token::resolve(everywhere, None, &dir).unwrap_err();
    assert!(e.to_string().contains("needs an access token"), "{e}");
    // A file other users may read is refused, not used.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = token::resolve(loopback, None, &dir).unwrap_err();
    assert!(matches!(e, TokenError::Exposed { .. }), "{e}");
    // The made token opens the API, and nothing else does.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = ServerConfig {
        token: token::read(&file).unwrap(),
        ..ServerConfig::default()
    };
    let ctl = start(&dir.join("tofino"), config);
    let ask = |auth: &str| {
        http(
            ctl.addr,
            &format!("GET /v1/health HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"),
        )
    };
    let answer = ask(&format!("Authorization: Bearer {made}\r\n"));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    for auth in [String::new(), format!("Authorization: Bearer {TOKEN}\r\n")] {
        let answer = ask(&auth);
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    }
    drop(ctl);
    let _ = std::fs::remove_dir_all(&dir);
}
