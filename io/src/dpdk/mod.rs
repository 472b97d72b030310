//! DPDK ports (feature `dpdk`): the Environment Abstraction Layer, Ethernet devices with one
//! receive and one transmit queue each, and [`DpdkUdpPort`], the batched [`crate::Port`] of
//! UDP datagrams over such a device, framed as Ethernet/IPv4/UDP by `ina_wire::frame`.
//!
//! Every packet crosses into C once per burst ([`Device::recv`], [`Device::send_with`]), through
//! `dpdk-sys`'s shim; this module holds all of the crate's DPDK `unsafe` code.
//!
//! The devices are DPDK's: a PCI NIC bound to a DPDK driver, or a virtual device named in the
//! EAL arguments (`--vdev=net_memif0,...`, `net_af_packet`, `net_ring`, `net_null`).
#![allow(unsafe_code)]

mod udp;

pub use udp::{DpdkUdpConfig, DpdkUdpPort};

use dpdk_sys as sys;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Why DPDK could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DpdkError {
    /// `rte_eal_init` failed.
    #[error("the DPDK EAL refused its arguments {args:?}: {reason} (see `dpdk-testpmd --help` for the EAL options)")]
    Eal {
        /// The arguments given.
        args: Vec<String>,
        /// DPDK's reason.
        reason: String,
    },
    /// A second initialisation in one process.
    #[error(
        "the DPDK EAL can be initialised once per process, and this one already was (or failed)"
    )]
    EalTwice,
    /// An argument that cannot be passed to C.
    #[error("an EAL argument holds a NUL byte: {0:?}")]
    Argument(String),
    /// No device of that name.
    #[error(
        "no DPDK device named {name:?} (the EAL found {available}; name a --vdev or a PCI address)"
    )]
    NoDevice {
        /// The name asked for.
        name: String,
        /// Devices the EAL found.
        available: u16,
    },
    /// A device refused a step of its setup.
    #[error("DPDK device {name:?}: {what}: {reason}")]
    Device {
        /// The device.
        name: String,
        /// The step.
        what: &'static str,
        /// DPDK's reason.
        reason: String,
    },
    /// The mbuf pool could not be made.
    #[error(
        "no mbuf pool for {name:?}: {reason} (with --no-huge, give the EAL more memory: -m 512)"
    )]
    Pool {
        /// The device.
        name: String,
        /// DPDK's reason.
        reason: String,
    },
}

fn reason(code: i32) -> String {
    // SAFETY: rte_strerror returns a static or thread-local string for any code.
    let s = unsafe { CStr::from_ptr(sys::rte_strerror(code.abs())) };
    format!("{} ({code})", s.to_string_lossy())
}

static EAL_UP: AtomicBool = AtomicBool::new(false);

/// The initialised Environment Abstraction Layer of this process.
#[derive(Debug)]
pub struct Eal {
    _private: (),
}

impl Eal {
    /// Initialises the EAL with `args` (without a program name: `["--no-huge", "--no-pci",
    /// "--vdev=net_memif0,role=server"]`). Once per process: a second call, even after a
    /// failed first one, returns [`DpdkError::EalTwice`].
    pub fn init(args: &[String]) -> Result<Eal, DpdkError> {
        if EAL_UP.swap(true, Ordering::SeqCst) {
            return Err(DpdkError::EalTwice);
        }
        let mut argv_owned: Vec<CString> = vec![CString::new("ina").unwrap_or_default()];
        for a in args {
            argv_owned.push(CString::new(a.as_str()).map_err(|_| DpdkError::Argument(a.clone()))?);
        }
        let mut argv: Vec<*mut std::os::raw::c_char> =
            argv_owned.iter().map(|c| c.as_ptr() as *mut _).collect();
        // The EAL pins the calling thread to its main lcore's CPU, and every thread created
        // afterwards would inherit that one CPU. The application's threads are its own (no
        // EAL worker lcores are launched), so the thread's CPU set is restored afterwards.
        // SAFETY: a zeroed cpu_set_t is valid; the size is its own.
        let mut cpus: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 is the calling thread; the set is ours.
        let saved = unsafe {
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut cpus)
        } == 0;
        // SAFETY: argv points at NUL-terminated strings that outlive the call; the EAL may
        // permute the array, which is ours.
        let r = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
        if saved {
            // SAFETY: as above, with the set read before.
            let _ = unsafe {
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &cpus)
            };
        }
        if r < 0 {
            // SAFETY: reads the calling thread's rte_errno.
            let code = unsafe { sys::ina_errno() };
            // (DPDK's argument parser keeps state: a second attempt in this process would
            // not parse its arguments afresh, so there is none.)
            return Err(DpdkError::Eal {
                args: args.to_vec(),
                reason: reason(code),
            });
        }
        Ok(Eal { _private: () })
    }

    /// The DPDK version this was built against.
    pub fn version() -> String {
        // SAFETY: a static string.
        unsafe { CStr::from_ptr(sys::ina_version()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Devices the EAL found.
    pub fn devices(&self) -> u16 {
        // SAFETY: after rte_eal_init.
        unsafe { sys::rte_eth_dev_count_avail() }
    }
}

/// Sizes of a device's queues and mbuf pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Descriptors of the receive ring.
    pub rx_descriptors: u16,
    /// Descriptors of the transmit ring.
    pub tx_descriptors: u16,
    /// Mbufs in the device's pool (receive ring, transmit ring and bursts in flight).
    pub mbufs: u32,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            rx_descriptors: 1024,
            tx_descriptors: 1024,
            mbufs: 8191,
        }
    }
}

/// Counters of a device, read from DPDK.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Frames received.
    pub rx_packets: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Frames the device dropped because its receive ring was full.
    pub rx_missed: u64,
    /// Erroneous frames received.
    pub rx_errors: u64,
    /// Frames that failed to go out.
    pub tx_errors: u64,
}

/// Most frames of one burst.
pub const BURST: usize = 64;

/// A started Ethernet device with one receive and one transmit queue, and its mbuf pool.
#[derive(Debug)]
pub struct Device {
    name: String,
    port: u16,
    pool: *mut sys::rte_mempool,
    mac: [u8; 6],
    data_room: u16,
    /// Frames received but not delivered: longer than one segment.
    pub rx_segmented: u64,
    rx: Box<RxArrays>,
}

/// What one receive burst fills in.
#[derive(Debug)]
struct RxArrays {
    mbufs: [*mut sys::rte_mbuf; BURST],
    data: [*const u8; BURST],
    len: [u16; BURST],
}

// SAFETY: a device is used by one thread at a time (`&mut self` on every burst); DPDK allows
// a queue to be used from any thread as long as no two use it at once.
unsafe impl Send for Device {}

static POOLS: Mutex<u32> = Mutex::new(0);

thread_local! {
    static REGISTERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes the calling thread an EAL thread once (an lcore id of its own), so that the mempools
/// keep a cache for it: without one every mbuf allocation and free goes to the pool's shared
/// ring. Best effort: when the EAL has no lcore id left, the thread runs without a cache.
fn register_thread() {
    REGISTERED.with(|r| {
        if !r.replace(true) {
            // SAFETY: after rte_eal_init (a Device exists); once per thread.
            let ok = unsafe { sys::rte_thread_register() } == 0;
            tracing::debug!(ok, "DPDK thread registration");
        }
    });
}

impl Device {
    /// Creates the virtual device `devargs` (`net_memif7,role=server,socket=/run/x.sock`: a
    /// name not used before in this process, and its arguments) and opens it.
    pub fn create(eal: &Eal, devargs: &str, cfg: DeviceConfig) -> Result<Device, DpdkError> {
        let c = CString::new(devargs).map_err(|_| DpdkError::Argument(devargs.into()))?;
        // SAFETY: after rte_eal_init; the string outlives the call.
        let r = unsafe { sys::rte_dev_probe(c.as_ptr()) };
        let name = devargs.split(',').next().unwrap_or(devargs);
        if r != 0 {
            return Err(DpdkError::Device {
                name: name.into(),
                what: "create",
                reason: reason(r),
            });
        }
        Device::open(eal, name, cfg)
    }

    /// Opens the device `name` (a `--vdev` name such as `net_memif0`, or a PCI address),
    /// configures one queue each way and starts it.
    pub fn open(_eal: &Eal, name: &str, cfg: DeviceConfig) -> Result<Device, DpdkError> {
        let cname = CString::new(name).map_err(|_| DpdkError::Argument(name.into()))?;
        let mut port = 0u16;
        // SAFETY: after rte_eal_init (the &Eal says so); the name outlives the call.
        let r = unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut port) };
        if r != 0 {
            return Err(DpdkError::NoDevice {
                name: name.into(),
                // SAFETY: as above.
                available: unsafe { sys::rte_eth_dev_count_avail() },
            });
        }
        let fail = |what: &'static str, code: i32| DpdkError::Device {
            name: name.into(),
            what,
            reason: reason(code),
        };
        // SAFETY: a valid port id.
        let socket = unsafe { sys::rte_eth_dev_socket_id(port) };
        let socket = if socket < 0 { 0 } else { socket };
        let pool_name = {
            let mut n = POOLS.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            CString::new(format!("ina_pool_{port}_{n}")).unwrap_or_default()
        };
        // SAFETY: a fresh pool name; sizes in range.
        let pool = unsafe {
            sys::rte_pktmbuf_pool_create(
                pool_name.as_ptr(),
                cfg.mbufs,
                256,
                0,
                sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
                socket,
            )
        };
        if pool.is_null() {
            // SAFETY: reads rte_errno.
            let code = unsafe { sys::ina_errno() };
            return Err(DpdkError::Pool {
                name: name.into(),
                reason: reason(code),
            });
        }
        let mut dev = Device {
            name: name.into(),
            port,
            pool,
            mac: [0; 6],
            // SAFETY: a valid pool.
            data_room: unsafe { sys::ina_pool_data_room(pool) }
                .saturating_sub(sys::RTE_PKTMBUF_HEADROOM as u16),
            rx_segmented: 0,
            rx: Box::new(RxArrays {
                mbufs: [std::ptr::null_mut(); BURST],
                data: [std::ptr::null(); BURST],
                len: [0; BURST],
            }),
        };
        let conf = sys::rte_eth_conf::default();
        // SAFETY: a valid port; conf is a zeroed configuration (no offloads, one queue).
        let r = unsafe { sys::rte_eth_dev_configure(port, 1, 1, &conf) };
        if r != 0 {
            return Err(fail("configure", r));
        }
        // SAFETY: the port is configured; the pool outlives the device (freed in Drop after
        // the device is closed).
        let r = unsafe {
            sys::rte_eth_rx_queue_setup(
                port,
                0,
                cfg.rx_descriptors,
                socket as u32,
                std::ptr::null(),
                pool,
            )
        };
        if r != 0 {
            return Err(fail("receive queue", r));
        }
        // SAFETY: as above.
        let r = unsafe {
            sys::rte_eth_tx_queue_setup(
                port,
                0,
                cfg.tx_descriptors,
                socket as u32,
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(fail("transmit queue", r));
        }
        // SAFETY: queues are set up.
        let r = unsafe { sys::rte_eth_dev_start(port) };
        if r != 0 {
            return Err(fail("start", r));
        }
        // Best effort: virtual devices may not support it, and unicast to our MAC works anyway.
        // SAFETY: a started port.
        let _ = unsafe { sys::rte_eth_promiscuous_enable(port) };
        let mut mac = sys::rte_ether_addr::default();
        // SAFETY: a valid port and a place for the address.
        let r = unsafe { sys::rte_eth_macaddr_get(port, &mut mac) };
        if r != 0 {
            return Err(fail("MAC address", r));
        }
        dev.mac = mac.addr_bytes;
        tracing::info!(device = name, port, mac = ?dev.mac, "DPDK device started");
        Ok(dev)
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The largest frame an mbuf holds.
    pub fn max_frame(&self) -> usize {
        usize::from(self.data_room)
    }

    /// Receives one burst of up to `max` frames (at most [`BURST`]) and hands each to `f`;
    /// returns how many. The frames are freed when `f` has seen them all.
    pub fn recv(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        register_thread();
        let n = max.min(BURST) as u16;
        let rx = &mut self.rx;
        // SAFETY: arrays of BURST entries, reused from call to call (a poll that finds nothing
        // costs no initialisation); n <= BURST.
        let got = unsafe {
            sys::ina_rx_burst(
                self.port,
                0,
                rx.mbufs.as_mut_ptr(),
                rx.data.as_mut_ptr(),
                rx.len.as_mut_ptr(),
                n,
            )
        } as usize;
        for i in 0..got {
            let (data, len) = (rx.data[i], rx.len[i]);
            if len == 0 || data.is_null() {
                self.rx_segmented += 1;
                continue;
            }
            // SAFETY: the shim gave this mbuf's data pointer and its single segment's length;
            // the mbuf lives until the bulk free below.
            let frame = unsafe { std::slice::from_raw_parts(data, usize::from(len)) };
            f(frame);
        }
        if got > 0 {
            // SAFETY: the mbufs rx_burst returned, freed once.
            unsafe { sys::ina_free_bulk(rx.mbufs.as_mut_ptr(), got as u32) };
        }
        got
    }

    /// Sends up to `n` frames (at most [`BURST`]) written straight into the device's buffers:
    /// `fill(i, buf)` writes frame `i` into `buf` and returns its length (0: no frame). Frames
    /// the transmit queue does not take at once are offered again for a while, then dropped;
    /// returns how many went.
    pub fn send_with(
        &mut self,
        n: usize,
        mut fill: impl FnMut(usize, &mut [u8]) -> usize,
    ) -> usize {
        register_thread();
        let n = n.min(BURST);
        if n == 0 {
            return 0;
        }
        let mut mbufs = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        let mut data = [std::ptr::null_mut::<u8>(); BURST];
        let mut room = [0u16; BURST];
        // SAFETY: arrays of BURST entries; n <= BURST; the pool is this device's.
        let r = unsafe {
            sys::ina_alloc_bulk(
                self.pool,
                mbufs.as_mut_ptr(),
                data.as_mut_ptr(),
                room.as_mut_ptr(),
                n as u32,
            )
        };
        if r != 0 {
            return 0;
        }
        let mut len = [0u16; BURST];
        let mut keep = 0;
        let mut empty = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        let mut dropped = 0;
        for i in 0..n {
            // SAFETY: the shim gave each fresh mbuf's data pointer and room; the buffer is
            // ours until it is transmitted or freed.
            let buf = unsafe { std::slice::from_raw_parts_mut(data[i], usize::from(room[i])) };
            let l = fill(i, buf).min(buf.len());
            if l == 0 {
                empty[dropped] = mbufs[i];
                dropped += 1;
            } else {
                mbufs[keep] = mbufs[i];
                len[keep] = l as u16;
                keep += 1;
            }
        }
        if dropped > 0 {
            // SAFETY: mbufs allocated above and not sent, freed once.
            unsafe { sys::ina_free_bulk(empty.as_mut_ptr(), dropped as u32) };
        }
        let mut done = 0;
        let mut stalls = 0;
        while done < keep && stalls < 10_000 {
            // SAFETY: mbufs[done..keep] are filled and ours; len matches them.
            let sent = unsafe {
                sys::ina_tx_filled(
                    self.port,
                    0,
                    mbufs.as_mut_ptr().add(done),
                    len.as_ptr().add(done),
                    (keep - done) as u16,
                )
            };
            done += usize::from(sent);
            if sent == 0 {
                stalls += 1;
                std::thread::yield_now();
            }
        }
        if done < keep {
            // SAFETY: the ones the queue never took, freed once.
            unsafe { sys::ina_free_bulk(mbufs.as_mut_ptr().add(done), (keep - done) as u32) };
        }
        done
    }

    /// Whether the device's link is up (a memif link is up once both ends are connected).
    pub fn link_up(&self) -> bool {
        let mut link = sys::rte_eth_link::default();
        // SAFETY: a valid port and a place for its link state.
        let r = unsafe { sys::rte_eth_link_get_nowait(self.port, &mut link) };
        r == 0 && link.link_status() != 0
    }

    /// Waits up to `timeout` for the link to come up; returns whether it did.
    pub fn wait_link(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while !self.link_up() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        true
    }

    /// The device's counters.
    pub fn stats(&self) -> DeviceStats {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: a valid port and a place for its counters.
        let _ = unsafe { sys::rte_eth_stats_get(self.port, &mut s) };
        DeviceStats {
            rx_packets: s.ipackets,
            tx_packets: s.opackets,
            rx_missed: s.imissed,
            rx_errors: s.ierrors,
            tx_errors: s.oerrors,
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the port was started by this device and is stopped and closed once; the
        // pool is freed after the port no longer refers to it.
        unsafe {
            let _ = sys::rte_eth_dev_stop(self.port);
            let _ = sys::rte_eth_dev_close(self.port);
            sys::rte_mempool_free(self.pool);
        }
    }
}
