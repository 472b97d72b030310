//! Raw bindings to the installed DPDK (22.11 and later), generated at build time from its
//! headers, and a C shim (`shim/`) for the static-inline fast path: receive and transmit a
//! burst per call, allocate and free mbufs in bulk. Everything here is `unsafe`; the safe
//! layer is `ina_io::dpdk`.
//!
//! What it must not do: wrap anything (that is the safe layer's job) or be built without
//! DPDK installed: its build script stops with the package to install.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
