//! The crate's error type.

use std::io;
use std::net::SocketAddr;

/// Errors of port I/O.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// Creating or binding the socket failed.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address we tried to bind.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Configuring a bound socket failed.
    #[error("cannot configure socket {addr} ({what}): {source}")]
    Configure {
        /// The socket's address.
        addr: SocketAddr,
        /// What we were setting.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An address is already taken on a [`MemNetwork`](crate::MemNetwork).
    #[error("address {0} already in use on the in-memory network")]
    AddrInUse(SocketAddr),
    /// Receiving failed.
    #[error("receive failed: {source}")]
    Recv {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Sending failed after `sent` datagrams of the batch had been sent.
    #[error("send failed after {sent} datagrams: {source}")]
    Send {
        /// Datagrams of the batch sent before the failure.
        sent: usize,
        /// The OS error (for a refused datagram, the first refusal).
        #[source]
        source: io::Error,
    },
}

impl IoError {
    /// The underlying OS error, if any.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            IoError::Bind { source, .. }
            | IoError::Configure { source, .. }
            | IoError::Recv { source }
            | IoError::Send { source, .. } => Some(source),
            IoError::AddrInUse(_) => None,
        }
    }
}
