//! Packet formats of `ina`, the in-network aggregation protocol.
//!
//! This crate is the one place where the bytes of every `ina` packet are defined: the software
//! switch, the worker library, the simulator and the P4 programs all follow it. It offers, in the
//! smoltcp style, zero-copy views over byte buffers ([`AggPacket`]) and plain representations
//! that parse from and emit into those views ([`AggRepr`]), plus the Ethernet/IPv4/UDP
//! encapsulation used by raw-Ethernet ports ([`frame`]).
//!
//! What it must not do: any I/O, any allocation on the parse or emit path, or any panic on bytes
//! that came from the network. Every accessor of a view is only called after
//! [`AggPacket::new_checked`] (or [`AggPacket::check_len`]) proved the buffer long enough; bad
//! input comes back as a typed [`Error`].
#![forbid(unsafe_code)]

pub mod agg;
pub mod checksum;
pub mod ether;
pub mod frame;
pub mod mac;
pub mod payload;

pub use agg::{
    AggPacket, AggRepr, MessageType, PendingInfo, QueryAsk, RejectReason, HEADER_LEN,
    PROTOCOL_VERSION, UDP_PORT,
};
pub use mac::{MacAddr, MacParseError};

/// Why a buffer is not a valid `ina` packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Shorter than the fixed header.
    #[error("truncated: {len} bytes, the header alone needs {HEADER_LEN}")]
    Truncated { len: usize },
    /// The payload length disagrees with the element count in the header.
    #[error("length mismatch: header announces {count} elements ({expected} bytes), buffer has {actual}")]
    LengthMismatch {
        count: u16,
        expected: usize,
        actual: usize,
    },
    /// A protocol version this build does not speak.
    #[error("unsupported protocol version {0}")]
    Version(u8),
    /// An unknown message type.
    #[error("unknown message type {0}")]
    MessageType(u8),
    /// An unknown reject reason.
    #[error("unknown reject reason {0}")]
    RejectReason(u8),
    /// The caller's buffer is too small to emit into.
    #[error("buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall { need: usize, have: usize },
    /// A payload of more elements than the 16-bit count field can announce.
    #[error("payload of {0} elements exceeds the 65535-element limit")]
    PayloadTooLong(usize),
    /// The frame is not Ethernet/IPv4/UDP, or its headers are malformed.
    #[error("not an Ethernet/IPv4/UDP frame: {0}")]
    Frame(&'static str),
}

/// Result type of this crate.
pub type Result<T> = core::result::Result<T, Error>;
