//! `uring-echo`: `echo-baseline` with its I/O written directly on the
//! `io-uring` crate, to measure the io_uring features monoio 0.2 does not
//! expose (issue 8; `bench/results/io-uring.md`).
//!
//! Same command line, pinning, framing (`FrameSplitter`), verification and
//! answers (`mcp_bench::echo::answer`) as `echo-baseline`; only the I/O
//! differs. Per shard, one thread with one ring:
//!
//! - **multishot accept** into **registered (fixed) files**: one SQE accepts
//!   every connection, each landing directly in the ring's file table, so
//!   receives and sends skip the per-call fd lookup (`--no-fixed`: plain fds);
//! - **multishot receive** with a **provided buffer ring**: one SQE per
//!   connection keeps receiving, the kernel picking a 16 KiB buffer (the
//!   broker's read chunk) per completion, where monoio submits one read per
//!   read buffer. Frames are verified and answered in place in that buffer;
//!   only a frame that spans two buffers is copied (into the connection's
//!   `BytesMut`);
//! - one **`Send`** per connection per loop turn carrying every response
//!   produced in that turn (`--zc`: `SendZc`, zero-copy send);
//! - `--defer-taskrun`: `IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN`, the
//!   completion mode made for one thread per ring (monoio sets neither).
//!
//! One `io_uring_enter` per loop turn submits everything queued and waits
//! for at least one completion.
//!
//! ```text
//! uring-echo [--listen 127.0.0.1:0] [--shards 1] [--cpus 1,2] [--zc] [--no-fixed] [--defer-taskrun]
//! ```
//! Prints `uring-echo ready frames=HOST:PORT shards=N` on stdout once every
//! shard's ring is set up; exits with status 3 when io_uring (or a feature
//! used here: buffer rings need Linux 5.19, multishot receive 6.0) is
//! unavailable.

use std::alloc::Layout;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, Ordering};

use bytes::{Bytes, BytesMut};
use io_uring::types::{BufRingEntry, Fd, Fixed};
use io_uring::{IoUring, cqueue, opcode, squeue};
use mcp_bench::echo::{answer, parse_args};
use mcp_schema::split::PREFIX_LEN;
use mcp_schema::{FrameError, FrameSplitter, ResponseEncoder};

// The broker runs on mimalloc; the baseline must pay the same allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Provided buffer size: the broker's (and echo-baseline's) read chunk.
const BUF_SIZE: usize = 16 * 1024;
/// Buffers in the ring (a power of two). A buffer goes back to the ring as
/// soon as its completion is handled, so this only needs to cover the
/// completions of one loop turn; 2 MiB per shard.
const BUF_COUNT: u16 = 128;
const BGID: u16 = 0;
/// Size of the sparse registered-file table: connections per shard.
const MAX_FIXED: u32 = 1024;
const RING_ENTRIES: u32 = 256;
/// Multishot operations can post many completions per submission.
const CQ_ENTRIES: u32 = 4096;

/// `user_data`: the operation in the high 32 bits, the connection (fixed
/// file index, or fd with `--no-fixed`) in the low 32.
const ACCEPT: u64 = 1;
const RECV: u64 = 2;
const SEND: u64 = 3;
const CLOSE: u64 = 4;
const CANCEL: u64 = 5;
/// `IORING_CQE_F_NOTIF` (not re-exported by io-uring 0.6): the completion
/// telling that a zero-copy send no longer uses its buffer.
const CQE_F_NOTIF: u32 = 1 << 3;

fn main() {
    let args = match parse_args("uring-echo", &["--zc", "--no-fixed", "--defer-taskrun"]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("uring-echo: {e}");
            std::process::exit(2);
        }
    };
    let opts = Opts {
        zc: args.extra.iter().any(|f| f == "--zc"),
        fixed: !args.extra.iter().any(|f| f == "--no-fixed"),
        defer_taskrun: args.extra.iter().any(|f| f == "--defer-taskrun"),
    };
    let (addr, listeners) = args.listeners().expect("bind");
    // Each ring is created on its own thread (SINGLE_ISSUER binds it to its
    // creator); the ready line waits until every shard reports its setup.
    let (tx, rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        let cpu = args.shard_cpu(index);
        let tx = tx.clone();
        handles.push(std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                monoio::utils::bind_to_cpu_set([cpu]).expect("pin shard");
            }
            match Shard::new(index, listener, opts) {
                Ok(mut s) => {
                    let _ = tx.send(Ok(()));
                    if let Err(e) = s.run() {
                        eprintln!("uring-echo: shard {index}: {e}");
                        std::process::exit(1);
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        }));
    }
    drop(tx);
    for _ in 0..args.shards {
        if let Ok(Err(e)) | Err(e) = rx.recv().map_err(io::Error::other) {
            eprintln!("uring-echo: io_uring unavailable: {e}");
            std::process::exit(3);
        }
    }
    println!("uring-echo ready frames={addr} shards={}", args.shards);
    for h in handles {
        let _ = h.join();
    }
}

#[derive(Clone, Copy)]
struct Opts {
    zc: bool,
    fixed: bool,
    defer_taskrun: bool,
}

/// The provided buffer ring: `BUF_COUNT` entries shared with the kernel,
/// pointing into one block of `BUF_COUNT * BUF_SIZE` bytes.
struct BufRing {
    entries: *mut BufRingEntry,
    bufs: *mut u8,
    /// Our tail; the kernel sees it once `publish`ed.
    tail: u16,
}

impl BufRing {
    fn new(ring: &IoUring) -> io::Result<Self> {
        // Both blocks are leaked: the kernel holds their addresses for the
        // ring's life, which is the shard thread's, which is the process's.
        // The entries must be page-aligned.
        let layout = Layout::from_size_align(BUF_COUNT as usize * size_of::<BufRingEntry>(), 4096)
            .expect("layout");
        // SAFETY: non-zero size.
        let entries = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<BufRingEntry>();
        assert!(!entries.is_null(), "out of memory");
        let bufs = Box::leak(vec![0u8; BUF_COUNT as usize * BUF_SIZE].into_boxed_slice());
        // SAFETY: `entries` holds BUF_COUNT entries and is never freed.
        unsafe {
            ring.submitter()
                .register_buf_ring(entries as u64, BUF_COUNT, BGID)?
        };
        let mut r = Self {
            entries,
            bufs: bufs.as_mut_ptr(),
            tail: 0,
        };
        for bid in 0..BUF_COUNT {
            r.push(bid);
        }
        r.publish();
        Ok(r)
    }

    /// Hands buffer `bid` back to the kernel (visible after `publish`).
    fn push(&mut self, bid: u16) {
        // SAFETY: the index is masked into the ring; the kernel reads an
        // entry only between the published tail and its head, and this one
        // is past the published tail.
        let e = unsafe { &mut *self.entries.add((self.tail & (BUF_COUNT - 1)) as usize) };
        e.set_addr(self.bufs as u64 + u64::from(bid) * BUF_SIZE as u64);
        e.set_len(BUF_SIZE as u32);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// One release store per loop turn publishes every buffer pushed in it.
    fn publish(&self) {
        // SAFETY: the tail field lives in entry 0 of the registered ring;
        // the kernel reads it concurrently, hence the atomic store.
        unsafe {
            let tail = BufRingEntry::tail(self.entries).cast::<AtomicU16>();
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    /// The `len` bytes the kernel received into buffer `bid`.
    ///
    /// # Safety
    /// Valid until `bid` is pushed back: the slice and everything borrowed
    /// from it must be gone by then (the block itself is never freed, hence
    /// `'static`, which lets frames be `Bytes::from_static` without a copy).
    unsafe fn data(&self, bid: u16, len: usize) -> &'static [u8] {
        // SAFETY: bid < BUF_COUNT and len <= BUF_SIZE (the kernel's result).
        unsafe { std::slice::from_raw_parts(self.bufs.add(bid as usize * BUF_SIZE), len) }
    }
}

#[derive(Default)]
struct Conn {
    /// The start of a frame whose rest is in a later buffer; empty otherwise.
    tail: BytesMut,
    /// Responses not yet handed to the kernel.
    out: Vec<u8>,
    /// Responses the kernel is sending: must not move until `pending` is 0.
    inflight: Vec<u8>,
    sent: usize,
    /// Send completions still to come (the result, and with `--zc` the
    /// notification that the kernel is done with the buffer).
    pending: u32,
    recv_armed: bool,
    /// In the shard's `dirty` list (has output to flush this turn).
    dirty: bool,
    closing: bool,
    /// The receive's cancellation is submitted.
    cancelled: bool,
}

struct Shard {
    ring: IoUring,
    bufs: BufRing,
    listener: std::net::TcpListener,
    opts: Opts,
    /// Indexed by fixed-file slot (or fd).
    conns: Vec<Option<Conn>>,
    dirty: Vec<u32>,
    splitter: FrameSplitter,
    /// One encoder and JSON scratch per shard (echo-baseline: per
    /// connection); the answers are identical.
    enc: ResponseEncoder,
    json: Vec<u8>,
}

impl Shard {
    fn new(index: usize, listener: std::net::TcpListener, opts: Opts) -> io::Result<Self> {
        let mut b = IoUring::builder();
        b.setup_cqsize(CQ_ENTRIES);
        if opts.defer_taskrun {
            b.setup_single_issuer().setup_defer_taskrun();
        }
        let ring = b.build(RING_ENTRIES)?;
        if opts.fixed {
            ring.submitter().register_files_sparse(MAX_FIXED)?;
        }
        let bufs = BufRing::new(&ring)?;
        let mut s = Self {
            ring,
            bufs,
            listener,
            opts,
            conns: Vec::new(),
            dirty: Vec::new(),
            splitter: FrameSplitter::default(),
            enc: ResponseEncoder::new(index as u64),
            json: Vec::with_capacity(1024),
        };
        s.arm_accept();
        // Submit now so that a kernel without multishot accept or fixed
        // files fails here, before the ready line, not at the first client.
        s.ring.submit()?;
        Ok(s)
    }

    fn run(&mut self) -> io::Result<()> {
        let mut cqes: Vec<(u64, i32, u32)> = Vec::with_capacity(CQ_ENTRIES as usize);
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                // EBUSY: completions overflowed; reaping them below clears it.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => return Err(e),
            }
            cqes.clear();
            cqes.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            for &(ud, res, flags) in &cqes {
                let idx = ud as u32;
                match ud >> 32 {
                    ACCEPT => self.on_accept(res, flags),
                    RECV => self.on_recv(idx, res, flags),
                    SEND => self.on_send(idx, res, flags),
                    CLOSE | CANCEL => {}
                    _ => unreachable!("unknown user_data {ud:#x}"),
                }
            }
            // Buffers consumed this turn go back before the next submit, so
            // a receive re-armed after ENOBUFS finds them.
            self.bufs.publish();
            // One send per connection per turn, with every response of it.
            for idx in std::mem::take(&mut self.dirty) {
                let Some(c) = self.conn(idx) else { continue };
                c.dirty = false;
                if !c.closing && c.pending == 0 && c.inflight.is_empty() && !c.out.is_empty() {
                    std::mem::swap(&mut c.out, &mut c.inflight);
                    self.submit_send(idx);
                }
            }
        }
    }

    fn conn(&mut self, idx: u32) -> Option<&mut Conn> {
        self.conns.get_mut(idx as usize).and_then(Option::as_mut)
    }

    fn push(&mut self, e: squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry points at (the send buffer of a
            // connection, the buffer ring) stays put until its completion.
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                return;
            }
            // Queue full: hand what is queued to the kernel and retry.
            self.ring.submit().expect("io_uring_enter");
        }
    }

    fn arm_accept(&mut self) {
        let fd = Fd(self.listener.as_raw_fd());
        let e = opcode::AcceptMulti::new(fd)
            .allocate_file_index(self.opts.fixed)
            .build();
        self.push(e.user_data(ACCEPT << 32));
    }

    fn on_accept(&mut self, res: i32, flags: u32) {
        if res >= 0 {
            let idx = res as u32;
            if self.conns.len() <= idx as usize {
                self.conns.resize_with(idx as usize + 1, || None);
            }
            self.conns[idx as usize] = Some(Conn::default());
            self.arm_recv(idx);
        } else if -res != libc::ECONNABORTED {
            eprintln!("uring-echo: accept: {}", io::Error::from_raw_os_error(-res));
        }
        if !cqueue::more(flags) {
            self.arm_accept();
        }
    }

    fn arm_recv(&mut self, idx: u32) {
        let e = if self.opts.fixed {
            opcode::RecvMulti::new(Fixed(idx), BGID)
        } else {
            opcode::RecvMulti::new(Fd(idx as i32), BGID)
        }
        .build();
        self.push(e.user_data(RECV << 32 | u64::from(idx)));
        self.conn(idx).expect("conn").recv_armed = true;
    }

    fn on_recv(&mut self, idx: u32, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        let bid = cqueue::buffer_select(flags);
        let Self {
            conns,
            bufs,
            splitter,
            enc,
            json,
            dirty,
            ..
        } = self;
        let c = conns[idx as usize].as_mut().expect("recv on a closed slot");
        c.recv_armed = more;
        if res > 0 && !c.closing {
            let bid = bid.expect("multishot receive without a buffer");
            // SAFETY: `on_data` keeps nothing borrowed from the buffer
            // (answers are copied into `out`, a spanning frame into `tail`),
            // and the buffer is recycled only after it returns.
            let data = unsafe { bufs.data(bid, res as usize) };
            match on_data(c, data, splitter, enc, json) {
                Ok(()) if !c.out.is_empty() && !c.dirty => {
                    c.dirty = true;
                    dirty.push(idx);
                }
                Ok(()) => {}
                Err(_) => c.closing = true,
            }
        }
        if let Some(bid) = bid {
            bufs.push(bid);
        }
        let rearm = match res {
            // Data, and the kernel ended the multishot receive anyway (it
            // may, e.g. when the completion queue overflows).
            1.. => !more,
            // Ring empty: every buffer was in use this turn. They are back
            // once this turn is published, before the re-armed receive is
            // submitted.
            _ if res == -libc::ENOBUFS => true,
            // 0 is the peer's FIN, negative a reset or our cancel.
            _ => {
                c.closing = true;
                false
            }
        };
        if rearm && !c.closing {
            self.arm_recv(idx);
        } else {
            self.maybe_close(idx);
        }
    }

    fn submit_send(&mut self, idx: u32) {
        let (fixed, zc) = (self.opts.fixed, self.opts.zc);
        let c = self.conn(idx).expect("conn");
        let (ptr, len) = (
            c.inflight[c.sent..].as_ptr(),
            (c.inflight.len() - c.sent) as u32,
        );
        c.pending += 1;
        let e = match (fixed, zc) {
            (true, false) => opcode::Send::new(Fixed(idx), ptr, len)
                .flags(libc::MSG_NOSIGNAL)
                .build(),
            (false, false) => opcode::Send::new(Fd(idx as i32), ptr, len)
                .flags(libc::MSG_NOSIGNAL)
                .build(),
            (true, true) => opcode::SendZc::new(Fixed(idx), ptr, len)
                .flags(libc::MSG_NOSIGNAL)
                .build(),
            (false, true) => opcode::SendZc::new(Fd(idx as i32), ptr, len)
                .flags(libc::MSG_NOSIGNAL)
                .build(),
        };
        self.push(e.user_data(SEND << 32 | u64::from(idx)));
    }

    fn on_send(&mut self, idx: u32, res: i32, flags: u32) {
        let Some(c) = self.conn(idx) else { return };
        c.pending -= 1;
        if flags & CQE_F_NOTIF == 0 {
            // The result. With `--zc`, MORE announces the notification.
            if cqueue::more(flags) {
                c.pending += 1;
            }
            if res < 0 {
                c.closing = true;
            } else {
                c.sent += res as usize;
            }
        }
        if c.pending == 0 && !c.closing {
            if c.sent < c.inflight.len() {
                // Short send: the rest of the same buffer.
                self.submit_send(idx);
            } else {
                c.inflight.clear();
                c.sent = 0;
                if !c.out.is_empty() && !c.dirty {
                    c.dirty = true;
                    self.dirty.push(idx);
                }
            }
        }
        self.maybe_close(idx);
    }

    /// Tears a closing connection down once the kernel holds nothing of it:
    /// cancels its receive first, waits for its sends, then closes the file
    /// (which frees the fixed slot for a later accept).
    fn maybe_close(&mut self, idx: u32) {
        let Some(c) = self.conn(idx) else { return };
        if !c.closing {
            return;
        }
        if c.recv_armed {
            if !c.cancelled {
                c.cancelled = true;
                let e = opcode::AsyncCancel::new(RECV << 32 | u64::from(idx)).build();
                self.push(e.user_data(CANCEL << 32 | u64::from(idx)));
            }
            // The receive's last completion (no MORE) comes back here.
            return;
        }
        if c.pending > 0 {
            return;
        }
        self.conns[idx as usize] = None;
        let e = if self.opts.fixed {
            opcode::Close::new(Fixed(idx)).build()
        } else {
            opcode::Close::new(Fd(idx as i32)).build()
        };
        self.push(e.user_data(CLOSE << 32 | u64::from(idx)));
    }
}

/// Answers every frame of one received buffer into `c.out`. Whole frames
/// are verified where the kernel put them; only a frame spanning buffers is
/// assembled in `c.tail`.
fn on_data(
    c: &mut Conn,
    mut data: &'static [u8],
    splitter: &FrameSplitter,
    enc: &mut ResponseEncoder,
    json: &mut Vec<u8>,
) -> Result<(), FrameError> {
    // Finish the frame begun in earlier buffers, copying only its missing
    // bytes (first the rest of the prefix, then the body).
    while !c.tail.is_empty() && !data.is_empty() {
        let take = splitter.missing(&c.tail)?.min(data.len());
        c.tail.extend_from_slice(&data[..take]);
        data = &data[take..];
        if let Some(frame) = splitter.next_frame(&mut c.tail)? {
            answer(frame, enc, json, &mut c.out);
        }
    }
    // Whole frames straight from the provided buffer: no copy, no
    // allocation (`answer` drops the frame before returning).
    while let Some(len) = splitter.peek_len(data)? {
        let total = PREFIX_LEN + len as usize;
        if data.len() < total {
            break;
        }
        let (frame, rest) = data.split_at(total);
        answer(Bytes::from_static(frame), enc, json, &mut c.out);
        data = rest;
    }
    // The start of a frame that continues in the next buffer.
    c.tail.extend_from_slice(data);
    Ok(())
}
