//! placeholder
pub mod ring;
