//! [`UdpPort`]: a [`Port`] over a UDP socket.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
#[cfg(unix)]
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::{Counters, IoError, Port, RecvBatch, SendBatch};

/// Options of a [`UdpPort`]; [`Default`] gives sensible values.
///
/// ```
/// let port = ina_io::UdpConfig::default()
///     .gso(false)
///     .max_batch(32)
///     .bind("127.0.0.1:0".parse().unwrap())
///     .unwrap();
/// assert!(!port.features().gso);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpConfig {
    /// Requested `SO_RCVBUF` in bytes (`SO_RCVBUFFORCE` is tried first, so
    /// as root the request can exceed `net.core.rmem_max`); `None` keeps the
    /// system default. Default: 4 MiB.
    pub recv_buffer: Option<usize>,
    /// Requested `SO_SNDBUF` (likewise `SO_SNDBUFFORCE`). Default: 4 MiB.
    pub send_buffer: Option<usize>,
    /// Use UDP GSO for runs of equal-size datagrams to one destination, if
    /// the kernel supports it. Default: `true`.
    pub gso: bool,
    /// Enable UDP GRO on receive, if the kernel supports it. Default:
    /// `true`.
    pub gro: bool,
    /// Messages per `recvmmsg`/`sendmmsg` call, clamped to `1..=1024`.
    /// Default: 64.
    pub max_batch: usize,
    /// GRO staging buffers (64 KiB each, i.e. messages per receive call when
    /// GRO is on), clamped to `1..=1024`. Default: 32.
    pub gro_buffers: usize,
    /// Set `SO_REUSEPORT` before binding, so that several ports (one per
    /// thread) can share one address. Default: `false`.
    pub reuse_port: bool,
}

impl Default for UdpConfig {
    fn default() -> Self {
        Self {
            recv_buffer: Some(4 << 20),
            send_buffer: Some(4 << 20),
            gso: true,
            gro: true,
            max_batch: 64,
            gro_buffers: 32,
            reuse_port: false,
        }
    }
}

impl UdpConfig {
    /// Sets [`recv_buffer`](Self::recv_buffer).
    pub fn recv_buffer(mut self, bytes: Option<usize>) -> Self {
        self.recv_buffer = bytes;
        self
    }

    /// Sets [`send_buffer`](Self::send_buffer).
    pub fn send_buffer(mut self, bytes: Option<usize>) -> Self {
        self.send_buffer = bytes;
        self
    }

    /// Sets [`gso`](Self::gso).
    pub fn gso(mut self, on: bool) -> Self {
        self.gso = on;
        self
    }

    /// Sets [`gro`](Self::gro).
    pub fn gro(mut self, on: bool) -> Self {
        self.gro = on;
        self
    }

    /// Sets [`max_batch`](Self::max_batch).
    pub fn max_batch(mut self, messages: usize) -> Self {
        self.max_batch = messages;
        self
    }

    /// Sets [`gro_buffers`](Self::gro_buffers).
    pub fn gro_buffers(mut self, buffers: usize) -> Self {
        self.gro_buffers = buffers;
        self
    }

    /// Opens a [`UdpPort`] bound to `addr` with these options.
    pub fn bind(&self, addr: SocketAddr) -> Result<UdpPort, IoError> {
        UdpPort::bind_with(addr, self)
    }

    fn clamped(&self) -> Self {
        Self {
            max_batch: self.max_batch.clamp(1, 1024),
            gro_buffers: self.gro_buffers.clamp(1, 1024),
            ..self.clone()
        }
    }
}

/// The kernel features a [`UdpPort`] uses (probed when it is opened).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdpFeatures {
    /// Several datagrams per system call (`recvmmsg`/`sendmmsg`).
    pub mmsg: bool,
    /// UDP GSO on send (`UDP_SEGMENT`). Can switch off at run time if the
    /// kernel refuses GSO buffers for lack of device support.
    pub gso: bool,
    /// UDP GRO on receive (`UDP_GRO`).
    pub gro: bool,
}

impl fmt::Display for UdpFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (on, name) in [(self.mmsg, "mmsg"), (self.gso, "gso"), (self.gro, "gro")] {
            if on {
                if !first {
                    f.write_str("+")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// A [`Port`] over a UDP socket.
///
/// On Linux, receives use `recvmmsg` (directly into the caller's
/// [`RecvBatch`] slots, or through 64 KiB staging buffers split by segment
/// size when UDP GRO is on) and sends use `sendmmsg`, grouping runs of
/// equal-size datagrams to one destination into single UDP GSO buffers
/// (see [`segment::gso_run`](crate::segment::gso_run)). GSO and GRO are
/// probed at open time, can be disabled in [`UdpConfig`], and are reported
/// by [`features`](Self::features). Elsewhere it falls back to one datagram
/// per system call.
///
/// The socket is non-blocking; waits are done with `ppoll`.
pub struct UdpPort {
    socket: Socket,
    local: SocketAddr,
    config: UdpConfig,
    features: UdpFeatures,
    counters: Counters,
    imp: imp::State,
    /// A second socket, receiving a multicast group (see [`UdpPort::join_group`]).
    group: Option<Box<GroupSocket>>,
}

/// With a group joined, the port's own socket is read before the group's once in this many
/// receives (otherwise only when the group's has nothing).
const OWN_FIRST_EVERY: u32 = 8;

/// The socket of a joined multicast group and its receive state.
struct GroupSocket {
    socket: Socket,
    imp: imp::State,
    addr: SocketAddrV4,
    /// Receives since the port's own socket was last read first: the group's socket goes
    /// first (it carries the bulk), the port's own every `OWN_FIRST_EVERY` receives, so that
    /// neither starves.
    since_own_first: u32,
}

impl fmt::Debug for UdpPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpPort")
            .field("local", &self.local)
            .field("features", &self.features)
            .field("counters", &self.counters)
            .field("group", &self.group.as_ref().map(|g| g.addr))
            .finish_non_exhaustive()
    }
}

impl UdpPort {
    /// Opens a port bound to `addr` with default options.
    pub fn bind(addr: SocketAddr) -> Result<Self, IoError> {
        Self::bind_with(addr, &UdpConfig::default())
    }

    /// Opens a port bound to `addr` with `config`.
    pub fn bind_with(addr: SocketAddr, config: &UdpConfig) -> Result<Self, IoError> {
        let config = config.clamped();
        let bind_err = |source| IoError::Bind { addr, source };
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
            .map_err(bind_err)?;
        #[cfg(unix)]
        if config.reuse_port {
            socket.set_reuse_port(true).map_err(bind_err)?;
        }
        socket.bind(&addr.into()).map_err(bind_err)?;
        let local = socket
            .local_addr()
            .map_err(bind_err)?
            .as_socket()
            .ok_or_else(|| bind_err(io::Error::other("bound address is not an IP address")))?;
        let cfg_err = |what| {
            move |source| IoError::Configure {
                addr: local,
                what,
                source,
            }
        };
        socket
            .set_nonblocking(true)
            .map_err(cfg_err("non-blocking"))?;
        if let Some(bytes) = config.recv_buffer {
            imp::set_recv_buffer(&socket, bytes).map_err(cfg_err("receive buffer size"))?;
        }
        if let Some(bytes) = config.send_buffer {
            imp::set_send_buffer(&socket, bytes).map_err(cfg_err("send buffer size"))?;
        }
        let (imp, features) = imp::State::open(&socket, &config);
        tracing::debug!(
            %local,
            %features,
            recv_buffer = socket.recv_buffer_size().unwrap_or(0),
            send_buffer = socket.send_buffer_size().unwrap_or(0),
            "udp port open"
        );
        Ok(Self {
            socket,
            local,
            config,
            features,
            counters: Counters::default(),
            imp,
            group: None,
        })
    }

    /// Also receives the datagrams sent to the multicast `group` on the interface of the
    /// port's own address (any interface, the kernel's choice, when the port is bound to
    /// every address or to IPv6): for example a software switch's results, sent once for
    /// every worker of a host. A second socket, bound to the group's address and port (shared with
    /// other members on this host), joins the group; [`Port::recv_batch`] then delivers
    /// datagrams from both sockets and waits on both. Sending is unchanged. Replaces a group
    /// joined before.
    pub fn join_group(&mut self, group: SocketAddrV4) -> Result<(), IoError> {
        let interface = self.interface();
        let addr = SocketAddr::V4(group);
        let bind_err = |source| IoError::Bind { addr, source };
        if !group.ip().is_multicast() {
            return Err(bind_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a multicast address",
            )));
        }
        let socket =
            Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(bind_err)?;
        socket.set_reuse_address(true).map_err(bind_err)?;
        #[cfg(unix)]
        socket.set_reuse_port(true).map_err(bind_err)?;
        socket.bind(&addr.into()).map_err(bind_err)?;
        let cfg_err = |what| move |source| IoError::Configure { addr, what, source };
        socket
            .join_multicast_v4(group.ip(), &interface)
            .map_err(cfg_err("multicast membership"))?;
        socket
            .set_nonblocking(true)
            .map_err(cfg_err("non-blocking"))?;
        if let Some(bytes) = self.config.recv_buffer {
            imp::set_recv_buffer(&socket, bytes).map_err(cfg_err("receive buffer size"))?;
        }
        let (imp, _) = imp::State::open(&socket, &self.config);
        tracing::debug!(local = %self.local, %group, %interface, "joined multicast group");
        self.group = Some(Box::new(GroupSocket {
            socket,
            imp,
            addr: group,
            since_own_first: 0,
        }));
        Ok(())
    }

    /// The multicast group joined with [`join_group`](Self::join_group), if any.
    pub fn group(&self) -> Option<SocketAddrV4> {
        self.group.as_ref().map(|g| g.addr)
    }

    /// The IPv4 interface address for multicast: the port's own address, or unspecified
    /// (the kernel's choice) when the port is bound to every address or to IPv6.
    fn interface(&self) -> Ipv4Addr {
        match self.local {
            SocketAddr::V4(a) => *a.ip(),
            SocketAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
        }
    }

    /// Sends datagrams addressed to multicast groups out of the interface of the port's own
    /// address (as [`join_group`](Self::join_group) picks it), and loops them back to members
    /// on this host.
    pub fn set_multicast_interface(&self) -> Result<(), IoError> {
        let interface = self.interface();
        let cfg_err = |source| IoError::Configure {
            addr: self.local,
            what: "multicast interface",
            source,
        };
        self.socket
            .set_multicast_if_v4(&interface)
            .map_err(cfg_err)?;
        self.socket.set_multicast_loop_v4(true).map_err(cfg_err)
    }

    /// The kernel features in use.
    pub fn features(&self) -> UdpFeatures {
        self.features
    }

    /// The options the port was opened with (after clamping).
    pub fn config(&self) -> &UdpConfig {
        &self.config
    }

    /// The socket's actual receive buffer size (as the kernel reports it,
    /// i.e. including its bookkeeping overhead).
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        self.socket.recv_buffer_size()
    }

    /// Asks for a receive buffer of at least `bytes` (the kernel's own accounting, which
    /// counts about twice the payload) if the socket has less; never shrinks it. Beyond
    /// `net.core.rmem_max` this needs `CAP_NET_ADMIN`; without it the kernel caps the request.
    /// Returns the size the kernel reports afterwards.
    pub fn grow_recv_buffer(&self, bytes: usize) -> io::Result<usize> {
        let now = self.socket.recv_buffer_size()?;
        if now < bytes {
            // The kernel doubles what it is given, for its bookkeeping.
            imp::set_recv_buffer(&self.socket, bytes.div_ceil(2))?;
        }
        self.socket.recv_buffer_size()
    }

    /// The socket's actual send buffer size.
    pub fn send_buffer_size(&self) -> io::Result<usize> {
        self.socket.send_buffer_size()
    }

    /// A second handle on the same socket (e.g. for a sending thread), with
    /// its own scratch buffers and counters.
    pub fn try_clone(&self) -> Result<Self, IoError> {
        let socket = self
            .socket
            .try_clone()
            .map_err(|source| IoError::Configure {
                addr: self.local,
                what: "clone",
                source,
            })?;
        let imp = imp::State::clone_for(&socket, &self.config, &self.features);
        Ok(Self {
            socket,
            local: self.local,
            config: self.config.clone(),
            features: self.features,
            counters: Counters::default(),
            imp,
            group: None,
        })
    }
}

impl UdpPort {
    /// [`Port::recv_batch`] with a joined group: each call delivers from one of the two
    /// sockets. Undelivered datagrams of a socket's last receive go first (the batch holds
    /// their buffer); otherwise the group's socket is read first, except every
    /// `OWN_FIRST_EVERY`-th receive, and when neither has anything the call waits on both.
    fn recv_with_group(
        &mut self,
        batch: &mut RecvBatch,
        timeout: Option<Duration>,
    ) -> Result<usize, IoError> {
        batch.clear();
        let Some(group) = self.group.as_deref_mut() else {
            return Ok(0);
        };
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            let group_first = if group.imp.has_pending() {
                true
            } else if self.imp.has_pending() {
                false
            } else {
                group.since_own_first += 1;
                group.since_own_first < OWN_FIRST_EVERY
            };
            if !group_first {
                group.since_own_first = 0;
            }
            for from_group in [group_first, !group_first] {
                let (socket, state) = if from_group {
                    (&group.socket, &mut group.imp)
                } else {
                    (&self.socket, &mut self.imp)
                };
                loop {
                    match state.recv_once(socket, &mut self.counters, batch) {
                        Ok(true) if !batch.is_full() => continue,
                        Ok(_) => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if batch.is_empty() => return Err(IoError::Recv { source: e }),
                        Err(_) => break,
                    }
                }
                if !batch.is_empty() {
                    return Ok(batch.len());
                }
            }
            let Some(remaining) = wait_budget(timeout, &mut deadline) else {
                return Ok(0);
            };
            self.counters.rx_syscalls += 1;
            match imp::wait_readable_either(&self.socket, &group.socket, remaining) {
                Ok(false) if remaining.is_some() => return Ok(0),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(IoError::Recv { source: e }),
            }
        }
    }
}

#[cfg(unix)]
impl AsFd for UdpPort {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl Port for UdpPort {
    type Addr = SocketAddr;

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn recv_batch(
        &mut self,
        batch: &mut RecvBatch,
        timeout: Option<Duration>,
    ) -> Result<usize, IoError> {
        if self.group.is_some() {
            return self.recv_with_group(batch, timeout);
        }
        batch.clear();
        // Set at the first wait; `Some(None)`: too far away to represent.
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            if batch.is_full() {
                break;
            }
            match self.imp.recv_once(&self.socket, &mut self.counters, batch) {
                Ok(true) => continue,
                Ok(false) if !batch.is_empty() => break,
                Ok(false) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !batch.is_empty() {
                        break;
                    }
                }
                Err(e) => {
                    if !batch.is_empty() {
                        // Deliver what we have; the error will come back.
                        break;
                    }
                    return Err(IoError::Recv { source: e });
                }
            }
            // Nothing received: wait for the first datagram.
            let Some(remaining) = wait_budget(timeout, &mut deadline) else {
                break;
            };
            self.counters.rx_syscalls += 1;
            match self.imp.wait_readable(&self.socket, remaining) {
                // Timed out: the deadline has passed.
                Ok(false) if remaining.is_some() => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(IoError::Recv { source: e }),
            }
        }
        Ok(batch.len())
    }

    fn send_batch(&mut self, batch: &SendBatch) -> Result<usize, IoError> {
        self.imp.send(
            &self.socket,
            self.local,
            &mut self.features,
            &mut self.counters,
            batch,
        )
    }

    fn counters(&self) -> Counters {
        self.counters
    }

    /// Grows the kernel receive buffer (both sockets, with a group), as
    /// [`UdpPort::grow_recv_buffer`] does.
    fn reserve_recv(&mut self, bytes: usize) {
        // The kernel charges about twice the payload.
        let want = bytes.saturating_mul(2);
        if let Err(e) = self.grow_recv_buffer(want) {
            tracing::debug!(local = %self.local, error = %e, "cannot grow the receive buffer");
        }
        if let Some(g) = &self.group {
            let now = g.socket.recv_buffer_size().unwrap_or(0);
            if now < want {
                let _ = imp::set_recv_buffer(&g.socket, want.div_ceil(2));
            }
        }
    }
}

/// How long the next wait of a receive with `timeout` may last: `Some(None)` without limit,
/// `Some(Some(left))`, or `None` when it must not wait (a zero timeout, or the time is up).
/// `deadline` is set at the first call of a receive (`Some(None)`: too far away to
/// represent).
fn wait_budget(
    timeout: Option<Duration>,
    deadline: &mut Option<Option<Instant>>,
) -> Option<Option<Duration>> {
    match timeout {
        None => Some(None),
        Some(t) if t.is_zero() => None,
        Some(t) => {
            let now = Instant::now();
            match *deadline.get_or_insert_with(|| now.checked_add(t)) {
                None => Some(None),
                Some(end) => {
                    let left = end.saturating_duration_since(now);
                    (!left.is_zero()).then_some(Some(left))
                }
            }
        }
    }
}

/// Whether an error refers to one datagram (skip it) rather than to the
/// socket (give up).
fn is_per_datagram_error(e: &io::Error) -> bool {
    #[cfg(unix)]
    if let Some(code) = e.raw_os_error() {
        return !matches!(
            code,
            libc::EBADF | libc::ENOTSOCK | libc::EFAULT | libc::ENOMEM
        );
    }
    !matches!(
        e.kind(),
        io::ErrorKind::NotConnected | io::ErrorKind::OutOfMemory | io::ErrorKind::Unsupported
    )
}

#[cfg(target_os = "linux")]
mod imp {
    //! Linux: `recvmmsg`/`sendmmsg`, UDP GSO and GRO.

    use std::io;
    use std::net::SocketAddr;
    use std::os::fd::AsFd;
    use std::time::Duration;

    use socket2::Socket;

    use super::{is_per_datagram_error, UdpConfig, UdpFeatures};
    use crate::segment::{gro_split, gso_run, GsoLimits};
    use crate::sys::{self, MsgScratch};
    use crate::{Counters, IoError, RecvBatch, SendBatch};

    /// Size of one GRO staging buffer: the largest coalesced buffer (and
    /// the largest UDP datagram) fits.
    const GRO_STAGE: usize = 65_536;

    /// GSO is switched off after this many refused GSO buffers in a row.
    const MAX_GSO_REFUSALS: u32 = 16;

    /// Waits until `a` or `b` is readable; `Ok(false)` on timeout.
    pub(super) fn wait_readable_either(
        a: &Socket,
        b: &Socket,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        sys::wait_any(&[a.as_fd(), b.as_fd()], libc::POLLIN, timeout)
    }

    pub(super) fn set_recv_buffer(socket: &Socket, bytes: usize) -> io::Result<()> {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        match sys::set_int_opt(socket.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, v) {
            Ok(()) => Ok(()),
            Err(_) => socket.set_recv_buffer_size(bytes),
        }
    }

    pub(super) fn set_send_buffer(socket: &Socket, bytes: usize) -> io::Result<()> {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        match sys::set_int_opt(socket.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v) {
            Ok(()) => Ok(()),
            Err(_) => socket.set_send_buffer_size(bytes),
        }
    }

    /// One received message held in a GRO staging buffer.
    #[derive(Debug, Clone, Copy)]
    struct Staged {
        addr: SocketAddr,
        len: usize,
        segment: usize,
        truncated: bool,
    }

    /// GRO receive buffers and the messages of the last receive not yet
    /// delivered.
    ///
    /// `recvmmsg` fills `buf`, which is then exchanged for the batch's
    /// buffer: the datagrams are delivered where the kernel wrote them, and
    /// the batch's old buffer receives next time. Messages left over when
    /// the batch is full stay in the buffer the batch now holds, under
    /// `lease`, and are delivered by the next call if the batch still holds
    /// it.
    struct Gro {
        buf: Vec<u8>,
        msgs: Vec<Staged>,
        /// Next message to deliver.
        next: usize,
        /// Byte offset of its next segment.
        offset: usize,
        /// Lease number of the batch buffer holding `msgs`.
        lease: u64,
    }

    pub(super) struct State {
        recv: MsgScratch,
        send: MsgScratch,
        /// Datagrams per message of the `sendmmsg` being built.
        run_lens: Vec<usize>,
        gro: Option<Gro>,
        v6: bool,
        /// GSO buffers refused since the last one accepted.
        gso_refusals: u32,
    }

    impl State {
        pub(super) fn open(socket: &Socket, config: &UdpConfig) -> (Self, UdpFeatures) {
            let fd = socket.as_fd();
            // Setting a zero default segment size changes nothing but fails
            // on kernels without UDP GSO (before 4.18).
            let gso =
                config.gso && sys::set_int_opt(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok();
            // UDP GRO on sockets arrived in 5.0.
            let gro = config.gro && sys::set_int_opt(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
            if config.gro && !gro {
                tracing::debug!("UDP GRO not supported by this kernel");
            }
            if config.gso && !gso {
                tracing::debug!("UDP GSO not supported by this kernel");
            }
            let features = UdpFeatures {
                mmsg: true,
                gso,
                gro,
            };
            (Self::clone_for(socket, config, &features), features)
        }

        pub(super) fn clone_for(
            socket: &Socket,
            config: &UdpConfig,
            features: &UdpFeatures,
        ) -> Self {
            let v6 = socket.local_addr().ok().is_some_and(|a| a.is_ipv6());
            let gro = features.gro.then(|| Gro {
                buf: vec![0; config.gro_buffers * GRO_STAGE],
                msgs: Vec::with_capacity(config.gro_buffers),
                next: 0,
                offset: 0,
                lease: 0,
            });
            Self {
                recv: MsgScratch::new(if features.gro {
                    config.gro_buffers
                } else {
                    config.max_batch
                }),
                send: MsgScratch::new(config.max_batch),
                run_lens: Vec::with_capacity(config.max_batch),
                gro,
                v6,
                gso_refusals: 0,
            }
        }

        pub(super) fn wait_readable(
            &self,
            socket: &Socket,
            timeout: Option<Duration>,
        ) -> io::Result<bool> {
            sys::wait(socket.as_fd(), libc::POLLIN, timeout)
        }

        /// Datagrams of the last receive are still undelivered.
        pub(super) fn has_pending(&self) -> bool {
            self.gro.as_ref().is_some_and(|g| g.next < g.msgs.len())
        }

        /// Adds to `batch` what is immediately available: pending GRO
        /// segments first, then one `recvmmsg`. Returns whether another
        /// call might find more (the last system call filled all it asked
        /// for); `WouldBlock` if nothing was there.
        pub(super) fn recv_once(
            &mut self,
            socket: &Socket,
            counters: &mut Counters,
            batch: &mut RecvBatch,
        ) -> io::Result<bool> {
            match &mut self.gro {
                Some(gro) => {
                    // The datagrams of one receive live in one buffer, which
                    // the batch holds: one receive per filling of the batch.
                    if !batch.is_empty() {
                        return Ok(false);
                    }
                    if gro.next < gro.msgs.len() {
                        if batch.lease() == gro.lease {
                            gro.drain(batch, counters);
                            return Ok(false);
                        }
                        // The batch's buffer was replaced or written since:
                        // the rest of the last receive is gone.
                        counters.rx_abandoned += gro.abandon();
                    }
                    let want = self.recv.capacity();
                    if gro.buf.len() < want * GRO_STAGE {
                        gro.buf.resize(want * GRO_STAGE, 0);
                    }
                    counters.rx_syscalls += 1;
                    let n = self
                        .recv
                        .recv(socket.as_fd(), &mut gro.buf, GRO_STAGE, want, true)?;
                    gro.msgs.clear();
                    gro.next = 0;
                    gro.offset = 0;
                    for i in 0..n {
                        let real = self.recv.msg_len(i);
                        gro.msgs.push(Staged {
                            addr: peer(&self.recv, i),
                            len: real.min(GRO_STAGE),
                            segment: self.recv.msg_gro_size(i).unwrap_or(0),
                            truncated: self.recv.msg_truncated(i) || real > GRO_STAGE,
                        });
                    }
                    // Cannot fail: the batch is empty.
                    gro.lease = batch.exchange(&mut gro.buf).unwrap_or(0);
                    gro.drain(batch, counters);
                    Ok(false)
                }
                None => {
                    let slot = batch.slot_size();
                    let (region, free) = batch.free_region();
                    let want = free.min(self.recv.capacity());
                    counters.rx_syscalls += 1;
                    let n = self.recv.recv(socket.as_fd(), region, slot, want, false)?;
                    for i in 0..n {
                        let real = self.recv.msg_len(i);
                        let truncated = self.recv.msg_truncated(i) || real > slot;
                        batch.commit(peer(&self.recv, i), real, truncated);
                        counters.rx_datagrams += 1;
                        counters.rx_bytes += real.min(slot) as u64;
                        counters.rx_truncated += u64::from(truncated);
                    }
                    Ok(n == want)
                }
            }
        }

        pub(super) fn send(
            &mut self,
            socket: &Socket,
            local: SocketAddr,
            features: &mut UdpFeatures,
            counters: &mut Counters,
            batch: &SendBatch,
        ) -> Result<usize, IoError> {
            let fd = socket.as_fd();
            let mut i = 0;
            let mut sent = 0;
            let mut first_err: Option<io::Error> = None;
            // Datagrams before this index are not sent with GSO (after the
            // kernel refused a GSO buffer covering them).
            let mut no_gso_until = 0;
            while i < batch.len() {
                self.run_lens.clear();
                let mut msgs = self.send.send_msgs();
                let mut j = i;
                while j < batch.len() && !msgs.is_full() {
                    let run = if features.gso && j >= no_gso_until {
                        gso_run(batch, j, GsoLimits::LINUX)
                    } else {
                        1
                    };
                    let (Some(dest), Some(seg)) = (batch.addr(j), batch.datagram_len(j)) else {
                        break;
                    };
                    let gso = if run > 1 {
                        u16::try_from(seg).ok()
                    } else {
                        None
                    };
                    let run = if gso.is_some() { run } else { 1 };
                    msgs.push(batch.contiguous(j, run), &dest, self.v6, gso);
                    self.run_lens.push(run);
                    j += run;
                }
                counters.tx_syscalls += 1;
                match msgs.send(fd) {
                    Ok(k) if k > 0 => {
                        for &run in &self.run_lens[..k] {
                            counters.tx_datagrams += run as u64;
                            counters.tx_bytes += batch.contiguous(i, run).len() as u64;
                            if run > 1 {
                                counters.gso_batches += 1;
                                counters.gso_segments += run as u64;
                                self.gso_refusals = 0;
                            }
                            sent += run;
                            i += run;
                        }
                    }
                    Ok(_) => {
                        wait_writable(fd, counters, sent)?;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        wait_writable(fd, counters, sent)?;
                    }
                    Err(e) if !is_per_datagram_error(&e) => {
                        return Err(IoError::Send { sent, source: e });
                    }
                    Err(e) => {
                        let run = self.run_lens.first().copied().unwrap_or(1);
                        if run > 1 {
                            // The kernel refused the GSO buffer (no device
                            // checksum offload, segment above the path MTU,
                            // ...): send these datagrams one by one.
                            counters.gso_fallbacks += 1;
                            no_gso_until = i + run;
                            self.gso_refusals += 1;
                            if e.raw_os_error() == Some(libc::EIO)
                                || self.gso_refusals >= MAX_GSO_REFUSALS
                            {
                                tracing::warn!(%local, error = %e, "UDP GSO keeps being refused; disabling GSO");
                                features.gso = false;
                            } else {
                                tracing::debug!(%local, error = %e, "UDP GSO buffer refused; sending one by one");
                            }
                        } else if e.raw_os_error() == Some(libc::EPERM) {
                            // A firewall of this host (netfilter) dropped the datagram on
                            // its way out: for the sender, a loss like one on the wire,
                            // which the protocol repairs.
                            tracing::trace!(%local, dest = ?batch.addr(i), "datagram dropped by a firewall");
                            counters.tx_errors += 1;
                            sent += 1;
                            i += 1;
                        } else {
                            tracing::debug!(%local, dest = ?batch.addr(i), error = %e, "datagram refused");
                            counters.tx_errors += 1;
                            first_err.get_or_insert(e);
                            i += 1;
                        }
                    }
                }
            }
            match first_err {
                Some(e) if sent == 0 => Err(IoError::Send { sent, source: e }),
                _ => Ok(sent),
            }
        }
    }

    fn wait_writable(
        fd: std::os::fd::BorrowedFd<'_>,
        counters: &mut Counters,
        sent: usize,
    ) -> Result<(), IoError> {
        counters.tx_syscalls += 1;
        match sys::wait(fd, libc::POLLOUT, None) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(IoError::Send { sent, source: e }),
        }
    }

    fn peer(scratch: &MsgScratch, i: usize) -> SocketAddr {
        scratch.msg_peer(i).unwrap_or_else(|| {
            tracing::debug!("datagram with a non-IP source address");
            SocketAddr::from(([0, 0, 0, 0], 0))
        })
    }

    impl Gro {
        /// Forgets the undelivered rest of the last receive and returns how
        /// many datagrams it held.
        fn abandon(&mut self) -> u64 {
            let mut lost = 0;
            for (k, m) in self.msgs.iter().enumerate().skip(self.next) {
                let base = if k == self.next { self.offset } else { 0 };
                let coalesced = m.segment > 0 && m.len > m.segment;
                let segment = if coalesced { m.segment } else { 0 };
                lost += gro_split(m.len.saturating_sub(base), segment).count() as u64;
            }
            self.msgs.clear();
            self.next = 0;
            self.offset = 0;
            lost
        }

        /// Records the received datagrams, which lie in the buffer `batch`
        /// holds, until the batch is full or all are delivered; a coalesced
        /// message is cut at its segment size and can be left half
        /// delivered for the next call.
        fn drain(&mut self, batch: &mut RecvBatch, counters: &mut Counters) {
            let slot = batch.slot_size();
            while self.next < self.msgs.len() && !batch.is_full() {
                let m = self.msgs[self.next];
                let start = self.next * GRO_STAGE;
                let coalesced = m.segment > 0 && m.len > m.segment;
                if coalesced && self.offset == 0 {
                    counters.gro_batches += 1;
                }
                let base = self.offset;
                let segment = if coalesced { m.segment } else { 0 };
                for r in gro_split(m.len - base, segment) {
                    if batch.is_full() {
                        break;
                    }
                    let len = r.end - r.start;
                    let truncated = (base + r.end == m.len && m.truncated) || len > slot;
                    if !batch.commit_at(m.addr, start + base + r.start, len, truncated) {
                        // Cannot happen (the batch has room and holds this
                        // buffer, of `GRO_STAGE` bytes per message).
                        counters.rx_abandoned += 1;
                    } else {
                        counters.rx_datagrams += 1;
                        counters.rx_bytes += len.min(slot) as u64;
                    }
                    counters.rx_truncated += u64::from(truncated);
                    counters.gro_segments += u64::from(coalesced);
                    self.offset = base + r.end;
                }
                if self.offset >= m.len {
                    self.next += 1;
                    self.offset = 0;
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    //! Portable fallback: one datagram per system call through the
    //! standard socket API.

    use std::io;
    use std::net::{SocketAddr, UdpSocket};
    use std::time::Duration;

    use socket2::Socket;

    use super::{is_per_datagram_error, UdpConfig, UdpFeatures};
    use crate::{Counters, IoError, RecvBatch, SendBatch};

    pub(super) fn set_recv_buffer(socket: &Socket, bytes: usize) -> io::Result<()> {
        socket.set_recv_buffer_size(bytes)
    }

    pub(super) fn set_send_buffer(socket: &Socket, bytes: usize) -> io::Result<()> {
        socket.set_send_buffer_size(bytes)
    }

    /// Without a portable poll, naps briefly and reports readiness so the caller tries both
    /// sockets again.
    pub(super) fn wait_readable_either(
        _a: &Socket,
        _b: &Socket,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        std::thread::sleep(timeout.map_or(Duration::from_micros(200), |t| {
            t.min(Duration::from_micros(200))
        }));
        Ok(true)
    }

    pub(super) struct State {
        /// Receives land here first so that their real length is known.
        bounce: Vec<u8>,
        /// A std handle on the port's socket.
        udp: Option<UdpSocket>,
    }

    impl State {
        pub(super) fn open(socket: &Socket, config: &UdpConfig) -> (Self, UdpFeatures) {
            let features = UdpFeatures::default();
            (Self::clone_for(socket, config, &features), features)
        }

        pub(super) fn clone_for(
            socket: &Socket,
            _config: &UdpConfig,
            _features: &UdpFeatures,
        ) -> Self {
            Self {
                bounce: vec![0; 65_536],
                udp: socket.try_clone().ok().map(UdpSocket::from),
            }
        }

        fn udp(&self) -> io::Result<&UdpSocket> {
            self.udp
                .as_ref()
                .ok_or_else(|| io::Error::other("socket handle unavailable"))
        }

        /// Nothing is held back between receives here.
        pub(super) fn has_pending(&self) -> bool {
            false
        }

        /// Waits with a blocking one-byte peek bounded by a read timeout.
        pub(super) fn wait_readable(
            &self,
            _socket: &Socket,
            timeout: Option<Duration>,
        ) -> io::Result<bool> {
            let udp = self.udp()?;
            udp.set_nonblocking(false)?;
            let r = udp
                .set_read_timeout(timeout.filter(|t| !t.is_zero()))
                .and_then(|()| udp.peek_from(&mut [0u8; 1]));
            udp.set_nonblocking(true)?;
            match r {
                Ok(_) => Ok(true),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    Ok(false)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
                // Windows reports a datagram larger than the peek buffer as
                // an error: there is something to read.
                Err(_) => Ok(true),
            }
        }

        pub(super) fn recv_once(
            &mut self,
            _socket: &Socket,
            counters: &mut Counters,
            batch: &mut RecvBatch,
        ) -> io::Result<bool> {
            counters.rx_syscalls += 1;
            let udp = self
                .udp
                .as_ref()
                .ok_or_else(|| io::Error::other("socket handle unavailable"))?;
            let (n, addr) = udp.recv_from(&mut self.bounce)?;
            let slot = batch.slot_size();
            let truncated = n > slot;
            batch.push(addr, &self.bounce[..n]);
            counters.rx_datagrams += 1;
            counters.rx_bytes += n.min(slot) as u64;
            counters.rx_truncated += u64::from(truncated);
            Ok(true)
        }

        pub(super) fn send(
            &mut self,
            _socket: &Socket,
            local: SocketAddr,
            _features: &mut UdpFeatures,
            counters: &mut Counters,
            batch: &SendBatch,
        ) -> Result<usize, IoError> {
            let udp = self
                .udp()
                .map_err(|e| IoError::Send { sent: 0, source: e })?;
            let mut sent = 0;
            let mut first_err = None;
            let mut i = 0;
            while let Some((dest, data)) = batch.get(i) {
                counters.tx_syscalls += 1;
                match udp.send_to(data, dest) {
                    Ok(_) => {
                        counters.tx_datagrams += 1;
                        counters.tx_bytes += data.len() as u64;
                        sent += 1;
                        i += 1;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                    Err(e) if !is_per_datagram_error(&e) => {
                        return Err(IoError::Send { sent, source: e })
                    }
                    Err(e) => {
                        tracing::debug!(%local, %dest, error = %e, "datagram refused");
                        counters.tx_errors += 1;
                        first_err.get_or_insert(e);
                        i += 1;
                    }
                }
            }
            match first_err {
                Some(e) if sent == 0 => Err(IoError::Send { sent, source: e }),
                _ => Ok(sent),
            }
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn lo() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    /// With UDP checksums off (`SO_NO_CHECK`) the kernel refuses GSO
    /// buffers (EINVAL): the port must resend the run one by one, and stop
    /// trying GSO after repeated refusals.
    #[test]
    fn refused_gso_buffers_fall_back_to_single_datagrams() {
        let mut tx = UdpPort::bind(lo()).unwrap();
        if !tx.features().gso {
            eprintln!("no UDP GSO on this kernel; skipping");
            return;
        }
        crate::sys::set_int_opt(tx.as_fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, 1).unwrap();
        let mut rx = UdpConfig::default().gro(false).bind(lo()).unwrap();
        let mut out = SendBatch::new();
        for i in 0..20u8 {
            out.push(rx.local_addr(), &[i; 500]);
        }
        assert_eq!(tx.send_batch(&out).unwrap(), 20);
        let c = tx.counters();
        assert_eq!(c.gso_fallbacks, 1, "{c:?}");
        assert_eq!(c.gso_segments, 0);
        assert_eq!(c.tx_errors, 0);
        assert!(tx.features().gso, "one refusal does not disable GSO");
        let mut batch = RecvBatch::new(64, 1024);
        let mut got = Vec::new();
        while got.len() < 20 {
            assert!(
                rx.recv_batch(&mut batch, Some(Duration::from_secs(2)))
                    .unwrap()
                    > 0
            );
            got.extend(batch.iter().map(|d| d.data[0]));
        }
        got.sort_unstable();
        assert_eq!(got, (0..20).collect::<Vec<_>>());

        for _ in 0..MAX_REFUSALS_FOR_TEST {
            tx.send_batch(&out).unwrap();
        }
        assert!(!tx.features().gso, "repeated refusals disable GSO");
    }

    const MAX_REFUSALS_FOR_TEST: usize = 16;
}
