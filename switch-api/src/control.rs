//! The control endpoint's protocol: one JSON object per line each way, and a blocking client.
//!
//! ```text
//! > {"op":"add_job","job":{"job":1,"slot_base":0,"slot_count":64,"elems_per_packet":256,"workers":["127.0.0.1:5000"]}}
//! < {"ok":true,"job":{"job":1,"epoch":40321,...}}
//! > {"op":"remove_job","job":1}
//! > {"op":"jobs"}
//! > {"op":"stats"}
//! ```
//!
//! An endpoint bound beyond loopback requires an access token: the first line of every
//! connection is then `{"op":"auth","token":"..."}` ([`ControlClient::connect_with_token`]).

use crate::job::JobSpec;
use crate::stats::SwitchStats;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A control request, one JSON object per line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Presents the access token; must come first where one is required.
    Auth {
        token: String,
    },
    AddJob {
        job: JobSpec,
    },
    RemoveJob {
        job: u16,
    },
    Jobs,
    Stats,
    Ping,
}

/// The answer to a request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub job: Option<JobSpec>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub jobs: Option<Vec<JobSpec>>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stats: Option<SwitchStats>,
}

impl Response {
    /// A success without content.
    pub fn ok() -> Response {
        Response {
            ok: true,
            error: None,
            job: None,
            jobs: None,
            stats: None,
        }
    }

    /// A failure, saying why.
    pub fn err(e: impl ToString) -> Response {
        Response {
            ok: false,
            error: Some(e.to_string()),
            ..Response::ok()
        }
    }
}

/// Whether a presented access token is the expected one, in time that depends on neither's
/// content nor length: both are hashed to 32 bytes, and the digests compared in constant time.
pub fn tokens_match(given: &[u8], expected: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    let (a, b) = (Sha256::digest(given), Sha256::digest(expected));
    a.as_slice().ct_eq(b.as_slice()).into()
}

/// A client of the control endpoint.
#[derive(Debug)]
pub struct ControlClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl ControlClient {
    /// Connects to a control endpoint.
    pub fn connect(addr: SocketAddr) -> std::io::Result<ControlClient> {
        ControlClient::connect_within(addr, Duration::from_secs(5), Duration::from_secs(10))
    }

    /// Connects within `connect` and waits at most `io` for each answer.
    pub fn connect_within(
        addr: SocketAddr,
        connect: Duration,
        io: Duration,
    ) -> std::io::Result<ControlClient> {
        let s = TcpStream::connect_timeout(&addr, connect)?;
        s.set_read_timeout(Some(io))?;
        s.set_write_timeout(Some(io))?;
        Ok(ControlClient {
            writer: s.try_clone()?,
            reader: BufReader::new(s),
        })
    }

    /// Connects and presents `token` (if any) as the first request.
    pub fn connect_with_token(
        addr: SocketAddr,
        token: Option<&str>,
    ) -> std::io::Result<ControlClient> {
        ControlClient::connect_with_token_within(
            addr,
            token,
            Duration::from_secs(5),
            Duration::from_secs(10),
        )
    }

    /// [`connect_with_token`](Self::connect_with_token) within the given times (see
    /// [`connect_within`](Self::connect_within)).
    pub fn connect_with_token_within(
        addr: SocketAddr,
        token: Option<&str>,
        connect: Duration,
        io: Duration,
    ) -> std::io::Result<ControlClient> {
        let mut c = ControlClient::connect_within(addr, connect, io)?;
        if let Some(t) = token {
            let r = c.call(&Request::Auth {
                token: t.to_string(),
            })?;
            if !r.ok {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    r.error.unwrap_or_else(|| "token refused".into()),
                ));
            }
        }
        Ok(c)
    }

    /// Sends one request and reads the answer.
    pub fn call(&mut self, req: &Request) -> std::io::Result<Response> {
        let line = serde_json::to_string(req).map_err(std::io::Error::other)?;
        writeln!(self.writer, "{line}")?;
        let mut answer = String::new();
        self.reader.read_line(&mut answer)?;
        serde_json::from_str(&answer).map_err(std::io::Error::other)
    }
}
