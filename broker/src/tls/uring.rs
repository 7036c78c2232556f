//! TLS on a shard: a rustls handshake over a monoio TCP stream, then the
//! record layer of [`super::record`], split into a read half and a write
//! half like the plaintext stream, so that the frame edge's reader and
//! writer tasks work unchanged over it. hyper's I/O (`edge/rt.rs`, the
//! HTTP and gRPC edges) uses the read half's [`TlsReadHalf::ready`] and
//! the write half's [`Sealer`] instead, so that its bytes are copied once
//! in user space, as in plaintext, and not through a buffer of its own.
//!
//! # Design
//! - [`accept`] drives rustls's unbuffered server connection through the
//!   handshake, then takes the traffic keys out of it
//!   (`dangerous_into_kernel_connection`, rustls's API for kTLS). From
//!   then on each half seals or opens its own direction's records in its
//!   own buffer: no lock, no allocation, no copy but the plaintext's
//!   (`record.rs` says why).
//! - The halves share only what rare events need ([`Control`]): rustls's
//!   kernel connection, which derives the next keys on a TLS 1.3
//!   KeyUpdate; the peer's request that we update ours too; and the alert
//!   the write half sends when the read half failed the stream.
//! - The read half opens records in place in its ciphertext buffer and
//!   copies their plaintext into the caller's buffer; what does not fit
//!   stays for the next read.
//! - The write half's [`Sealer`] stages plaintext into an open record at
//!   the end of the caller's buffer and seals it there in place
//!   ([`record::Keys::begin`], [`record::Keys::finish`]).
//! - [`TlsReadHalf`] is a [`CancelableAsyncReadRent`] like the TCP half it
//!   wraps: the cancel handle goes to its TCP read, and a cancelled read
//!   gives back the caller's buffer as it was. Ciphertext already read
//!   stays in the half, so nothing is lost.
//! - A read whose future is *dropped* while its TCP read is out takes the
//!   ciphertext buffer with it (monoio keeps it until the kernel lets go).
//!   If that buffer held the start of a record, the stream cannot go on:
//!   the next read fails instead of misreading what follows. The edges
//!   drop a read only with the whole connection.
//! - Once a record is refused (it does not authenticate, bytes that are no
//!   record, a message with no place after the handshake), the plaintext
//!   of the records before it is still handed out, then every read fails;
//!   the write half's shutdown sends the alert that says why.
//! - A TLS 1.3 KeyUpdate from the peer switches the read half to the next
//!   keys; if it asks for ours to change too, the write half sends its own
//!   KeyUpdate before its next record. The write half also renews its keys
//!   before the cipher's confidentiality limit (2^24 records for AES-GCM);
//!   a TLS 1.2 connection, which cannot, fails its writes there instead.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::sync::Arc;

use monoio::BufResult;
use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut, RawBuf, SliceMut};
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, CancelHandle, CancelableAsyncReadRent,
    OwnedReadHalf, OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;
use rustls::ServerConfig;
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError};

use super::record::{self, AlertMeaning, Fault, Keys, Version};

/// The read buffer: one largest record and then some, so that after the
/// start of a record moves to the front there is room for all of it.
const CIPHER_CHUNK: usize = record::MAX_RECORD + 2048;
/// Handshake messages larger than this (a client certificate chain) are
/// refused rather than buffered without end.
const MAX_HANDSHAKE_BUFFER: usize = 256 * 1024;
/// Plaintext one `write` seals: four full records. A larger write returns
/// a short count (the caller's `write_all` comes back for the rest), so the
/// write buffer stays small.
const MAX_WRITE: usize = 4 * record::MAX_PLAIN;

/// What both halves of one connection share; touched only on key updates
/// and failures.
struct Control {
    /// rustls's side of the connection after the handshake: derives the
    /// next traffic keys on a TLS 1.3 KeyUpdate.
    kernel: RefCell<KernelConnection<ServerConnectionData>>,
    /// The peer asked us to update our keys: the write half sends its
    /// KeyUpdate before its next record.
    update_tx: Cell<bool>,
    /// The alert the write half's shutdown sends instead of close_notify:
    /// the read half refused a record.
    alert: Cell<Option<u8>>,
}

/// The reading half of a TLS connection.
pub struct TlsReadHalf {
    tcp: OwnedReadHalf<TcpStream>,
    keys: Keys,
    version: Version,
    ctl: Rc<Control>,
    /// Plaintext rustls decrypted during the handshake (a request sent
    /// with the client's Finished): handed out first.
    head: Vec<u8>,
    /// Ciphertext from the socket; `pos..` is not yet opened.
    cipher: Vec<u8>,
    pos: usize,
    /// The opened record's plaintext not yet handed out, as a range of
    /// `cipher`.
    plain: (usize, usize),
    /// Bytes of a record's start that the last read's buffer held; if that
    /// buffer is gone (the read was dropped), the stream is lost.
    held: usize,
    /// The peer closed its side of the TCP connection.
    eof: bool,
    /// The peer sent close_notify: every later read is an end.
    closed: bool,
    /// Why the stream failed: every later read fails with it too, instead
    /// of waiting on a peer that will not fix it.
    broken: Option<String>,
}

/// The writing half of a TLS connection: a [`Sealer`] and the socket.
pub struct TlsWriteHalf {
    tcp: OwnedWriteHalf<TcpStream>,
    sealer: Sealer,
    /// Sealed records for the socket (kept between writes for its capacity).
    out: Vec<u8>,
}

/// Seals what a connection sends into records, in the caller's buffer.
///
/// [`TlsWriteHalf`] seals each write and sends it. hyper's I/O
/// (`edge/rt.rs`) holds a sealer of its own ([`TlsWriteHalf::into_parts`])
/// and seals hyper's bytes straight into the buffer its send takes: the
/// plaintext is copied once, as in plaintext, not first into a buffer and
/// then into a record.
pub struct Sealer {
    keys: Keys,
    version: Version,
    ctl: Rc<Control>,
    /// Records to renew the keys at (TLS 1.3) or to stop at (TLS 1.2):
    /// the suite's confidentiality limit, less a margin.
    limit: u64,
    /// Where the record being filled starts in the caller's buffer.
    open: Option<usize>,
    /// close_notify (or the alert) is sealed: nothing more is.
    shut: bool,
}

/// What a finished handshake agreed.
#[derive(Debug, Clone)]
pub struct Negotiated {
    pub version: Option<rustls::ProtocolVersion>,
    pub alpn: Option<Vec<u8>>,
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// Runs the server side of a TLS handshake on `stream`. The caller bounds
/// it in time (`tls.handshake_timeout`): dropping the future drops the
/// connection. `config` must have `enable_secret_extraction` set (every
/// configuration [`super::ServerConfigs`] builds has).
pub async fn accept(
    stream: TcpStream,
    config: Arc<ServerConfig>,
) -> io::Result<(TlsReadHalf, TlsWriteHalf, Negotiated)> {
    let mut conn = UnbufferedServerConnection::new(config).map_err(io::Error::other)?;
    let (mut rd, mut wr) = stream.into_split();
    // Ciphertext not yet taken by rustls, and what it sends.
    let mut inbuf: Vec<u8> = Vec::with_capacity(CIPHER_CHUNK);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let mut head = Vec::new();
    let mut peer_closed = false;
    // The failure, once rustls reports one. rustls queues its alert with
    // the error and hands it out (EncodeTlsData) on the next call, before
    // it looks at the records again; a third call would meet the bad
    // record anew, so the call after a failure is the last.
    let mut failed: Option<rustls::Error> = None;
    loop {
        let after_failure = failed.is_some();
        let status = conn.process_tls_records(&mut inbuf);
        let discard = status.discard;
        let mut transmit = false;
        let mut need_more = false;
        let mut ready = false;
        match status.state {
            Ok(ConnectionState::EncodeTlsData(mut e)) => loop {
                let at = out.len();
                out.resize(out.capacity().max(at + 4096), 0);
                match e.encode(&mut out[at..]) {
                    Ok(n) => {
                        out.truncate(at + n);
                        break;
                    }
                    Err(EncodeError::InsufficientSize(s)) => {
                        out.truncate(at);
                        out.reserve(s.required_size);
                    }
                    Err(e) => return Err(io::Error::other(e.to_string())),
                }
            },
            Ok(ConnectionState::TransmitTlsData(t)) => {
                t.done();
                transmit = true;
            }
            Ok(ConnectionState::BlockedHandshake) => need_more = true,
            Ok(ConnectionState::ReadTraffic(mut r)) => {
                // Records after the client's Finished, in the same read.
                while let Some(rec) = r.next_record() {
                    let rec = rec.map_err(|e| invalid(e.to_string()))?;
                    head.extend_from_slice(rec.payload);
                }
            }
            Ok(ConnectionState::PeerClosed) => peer_closed = true,
            // A TLS 1.3 server may send (0.5-RTT) before the client's
            // Finished: the handshake is over only when rustls says so.
            Ok(ConnectionState::WriteTraffic(_)) | Ok(ConnectionState::Closed) => ready = true,
            Ok(_) => return Err(invalid("TLS: an unexpected handshake state (early data?)")),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
        if after_failure {
            // The alert, if rustls had one, is in `out`.
            let _ = send(&mut wr, &mut out).await;
            let e = failed.expect("set before this call");
            return Err(invalid(e.to_string()));
        }
        inbuf.drain(..discard);
        if ready {
            if !conn.is_handshaking() {
                break;
            }
            need_more = true;
        }
        if transmit {
            send(&mut wr, &mut out).await?;
        }
        if failed.is_some() {
            continue;
        }
        if need_more {
            if peer_closed {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the TLS handshake",
                ));
            }
            if inbuf.len() == inbuf.capacity() {
                if inbuf.capacity() >= MAX_HANDSHAKE_BUFFER {
                    return Err(invalid("TLS handshake messages larger than 256 KiB"));
                }
                inbuf.reserve(inbuf.capacity());
            }
            let len = inbuf.len();
            let cap = inbuf.capacity();
            let (res, slice) = rd.read(inbuf.slice_mut(len..cap)).await;
            inbuf = slice.into_inner();
            if res? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the TLS handshake",
                ));
            }
        }
    }
    send(&mut wr, &mut out).await?;
    let negotiated = Negotiated {
        version: conn.protocol_version(),
        alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
    };
    let (secrets, kernel) = conn
        .dangerous_into_kernel_connection()
        .map_err(|e| io::Error::other(format!("TLS: taking the traffic keys: {e}")))?;
    let version = match kernel.protocol_version() {
        rustls::ProtocolVersion::TLSv1_3 => Version::Tls13,
        rustls::ProtocolVersion::TLSv1_2 => Version::Tls12,
        v => return Err(invalid(format!("TLS: no record layer for {v:?}"))),
    };
    let limit = match kernel.negotiated_cipher_suite() {
        rustls::SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
        rustls::SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
    };
    // Renew (or stop) well before the limit: the peer counts too.
    let limit = limit.saturating_sub(limit / 16);
    let tx = Keys::new(version, secrets.tx).map_err(io::Error::other)?;
    let rx = Keys::new(version, secrets.rx).map_err(io::Error::other)?;
    let ctl = Rc::new(Control {
        kernel: RefCell::new(kernel),
        update_tx: Cell::new(false),
        alert: Cell::new(None),
    });
    if inbuf.capacity() < CIPHER_CHUNK {
        inbuf.reserve(CIPHER_CHUNK - inbuf.len());
    }
    let r = TlsReadHalf {
        tcp: rd,
        keys: rx,
        version,
        ctl: ctl.clone(),
        head,
        cipher: inbuf,
        pos: 0,
        plain: (0, 0),
        held: 0,
        eof: false,
        closed: peer_closed,
        broken: None,
    };
    out.clear();
    let w = TlsWriteHalf {
        tcp: wr,
        sealer: Sealer {
            keys: tx,
            version,
            ctl,
            limit,
            open: None,
            shut: false,
        },
        out,
    };
    Ok((r, w, negotiated))
}

/// Writes all of `out` to the socket and empties it.
async fn send(wr: &mut OwnedWriteHalf<TcpStream>, out: &mut Vec<u8>) -> io::Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    let (res, mut buf) = wr.write_all(std::mem::take(out)).await;
    buf.clear();
    *out = buf;
    res.map(|_| ())
}

impl TlsReadHalf {
    /// Reads more ciphertext from the socket after what is there.
    /// `c`: the caller's cancel handle.
    async fn fill(&mut self, c: Option<&CancelHandle>) -> io::Result<()> {
        if self.cipher.capacity() == 0 && self.held > 0 {
            // A dropped read took the buffer with the start of a record.
            return Err(invalid(
                "TLS: a read was abandoned in the middle of a record; the stream cannot go on",
            ));
        }
        // What is left is the start of a record: move it to the front so
        // that the whole record fits.
        if self.pos > 0 {
            self.cipher.drain(..self.pos);
            self.pos = 0;
        }
        if self.cipher.capacity() < CIPHER_CHUNK {
            self.cipher.reserve(CIPHER_CHUNK - self.cipher.len());
        }
        self.held = self.cipher.len();
        self.plain = (0, 0);
        let buf = std::mem::take(&mut self.cipher);
        let (len, cap) = (buf.len(), buf.capacity());
        let slice: SliceMut<Vec<u8>> = buf.slice_mut(len..cap);
        let (res, slice) = match c {
            Some(c) => self.tcp.cancelable_read(slice, c.clone()).await,
            None => self.tcp.read(slice).await,
        };
        self.cipher = slice.into_inner();
        crate::idle_poll::note_activity();
        if res? == 0 {
            self.eof = true;
        }
        Ok(())
    }

    /// Opens the next whole record in the buffer, if there is one: `true`
    /// when one was taken (its plaintext, if any, is in `plain`).
    fn open_next(&mut self) -> Result<bool, Fault> {
        let at = self.pos;
        let Some(len) = record::record_len(&self.cipher[at..], self.version)? else {
            return Ok(false);
        };
        if self.cipher.len() - at < len {
            return Ok(false);
        }
        self.pos += len;
        let rec = &mut self.cipher[at..at + len];
        let opened = self.keys.open(rec)?;
        let payload = &rec[opened.start..opened.end];
        match opened.typ {
            record::APPLICATION_DATA => {
                self.plain = (at + opened.start, at + opened.end);
            }
            record::ALERT => match record::alert(payload, self.version)? {
                AlertMeaning::Closed => self.closed = true,
                AlertMeaning::Ignore => {}
                AlertMeaning::Fatal(desc) => {
                    // No alert answers an alert.
                    self.broken = Some(format!("TLS: the peer sent fatal alert {desc}"));
                }
            },
            record::HANDSHAKE if self.version == Version::Tls13 => {
                let request = record::read_key_update(payload)?;
                let next = self
                    .ctl
                    .kernel
                    .borrow_mut()
                    .update_rx_secret()
                    .map_err(|_| Fault::UnexpectedMessage)?;
                self.keys = Keys::new(self.version, next).map_err(|_| Fault::UnexpectedMessage)?;
                if request {
                    self.ctl.update_tx.set(true);
                }
            }
            // A TLS 1.2 renegotiation, a ChangeCipherSpec, an empty type.
            _ => return Err(Fault::UnexpectedMessage),
        }
        Ok(true)
    }

    /// Plaintext ready without reading the socket, as
    /// `BufRead::fill_buf`: `Some(Ok(bytes))`, empty at the stream's end;
    /// `Some(Err)` once the stream failed; `None` when nothing is ready
    /// until [`TlsReadHalf::fill_more`] reads more. Take bytes with
    /// [`TlsReadHalf::consume`].
    pub fn ready(&mut self) -> Option<io::Result<&[u8]>> {
        while self.head.is_empty() && self.plain.0 == self.plain.1 {
            // Plaintext before a close or a failure is handed out first.
            if self.closed {
                return Some(Ok(&[]));
            }
            if let Some(why) = &self.broken {
                return Some(Err(invalid(why.clone())));
            }
            match self.open_next() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(fault) => {
                    self.ctl.alert.set(Some(fault.alert()));
                    self.broken = Some(format!("TLS: {fault}"));
                    continue;
                }
            }
            // The peer closed the TCP connection without close_notify
            // (perhaps within a record): for the edges' framing (length
            // prefixes, HTTP messages) that is an ordinary end, as it is
            // in plaintext.
            return self.eof.then_some(Ok(&[]));
        }
        Some(Ok(if !self.head.is_empty() {
            &self.head
        } else {
            &self.cipher[self.plain.0..self.plain.1]
        }))
    }

    /// Takes `n` bytes of what [`TlsReadHalf::ready`] gave.
    pub fn consume(&mut self, n: usize) {
        if !self.head.is_empty() {
            self.head.drain(..n);
        } else {
            self.plain.0 += n;
        }
    }

    /// Reads more ciphertext from the socket (hyper's I/O, `edge/rt.rs`,
    /// calls this when [`TlsReadHalf::ready`] gives nothing).
    pub async fn fill_more(&mut self) -> io::Result<()> {
        self.fill(None).await
    }

    async fn read_inner<T: IoBufMut>(
        &mut self,
        mut buf: T,
        c: Option<&CancelHandle>,
    ) -> BufResult<usize, T> {
        loop {
            if buf.bytes_total() == 0 {
                return (Ok(0), buf);
            }
            match self.ready() {
                Some(Ok(src)) => {
                    let n = src.len().min(buf.bytes_total());
                    // SAFETY: `write_ptr` is valid for `bytes_total` bytes,
                    // and `n` is at most that; the source is this half's
                    // buffer, which cannot overlap the caller's.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), buf.write_ptr(), n);
                        buf.set_init(n);
                    }
                    self.consume(n);
                    return (Ok(n), buf);
                }
                Some(Err(e)) => return (Err(e), buf),
                None => {}
            }
            if let Err(e) = self.fill(c).await {
                return (Err(e), buf);
            }
        }
    }
}

impl AsyncReadRent for TlsReadHalf {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        self.read_inner(buf, None).await
    }

    async fn readv<T: IoVecBufMut>(&mut self, mut buf: T) -> BufResult<usize, T> {
        // SAFETY: the raw buffer points into `buf`, which outlives the read.
        let n = match unsafe { RawBuf::new_from_iovec_mut(&mut buf) } {
            Some(raw) => self.read_inner(raw, None).await.0,
            None => Ok(0),
        };
        if let Ok(n) = n {
            // SAFETY: `n` bytes were written into the first iovec.
            unsafe { buf.set_init(n) };
        }
        (n, buf)
    }
}

impl CancelableAsyncReadRent for TlsReadHalf {
    async fn cancelable_read<T: IoBufMut>(
        &mut self,
        buf: T,
        c: CancelHandle,
    ) -> BufResult<usize, T> {
        self.read_inner(buf, Some(&c)).await
    }

    async fn cancelable_readv<T: IoVecBufMut>(
        &mut self,
        mut buf: T,
        c: CancelHandle,
    ) -> BufResult<usize, T> {
        // SAFETY: as in `readv`.
        let n = match unsafe { RawBuf::new_from_iovec_mut(&mut buf) } {
            Some(raw) => self.read_inner(raw, Some(&c)).await.0,
            None => Ok(0),
        };
        if let Ok(n) = n {
            // SAFETY: as in `readv`.
            unsafe { buf.set_init(n) };
        }
        (n, buf)
    }
}

impl Sealer {
    /// Before a record under the current keys: a KeyUpdate the peer asked
    /// for, or one the confidentiality limit calls for (TLS 1.3); a TLS 1.2
    /// connection at its limit stops.
    fn renew_keys(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        let due = self.keys.seq() >= self.limit;
        let asked = self.ctl.update_tx.get();
        if !due && !asked {
            return Ok(());
        }
        if self.version == Version::Tls12 {
            return Err(io::Error::other(
                "TLS 1.2: the connection reached its cipher's record limit; reconnect",
            ));
        }
        self.ctl.update_tx.set(false);
        // Sent under the old keys, then every record under the new ones.
        self.keys
            .seal(record::HANDSHAKE, &record::key_update(false), out)
            .map_err(|f| io::Error::other(f.to_string()))?;
        let next = self
            .ctl
            .kernel
            .borrow_mut()
            .update_tx_secret()
            .map_err(io::Error::other)?;
        self.keys = Keys::new(self.version, next).map_err(io::Error::other)?;
        Ok(())
    }

    /// Appends `src` to `out` as application data: into the record being
    /// filled, sealing each as it reaches the largest plaintext a record
    /// carries. `out` takes nothing else until [`Sealer::seal`].
    pub fn stage(&mut self, out: &mut Vec<u8>, mut src: &[u8]) -> io::Result<()> {
        if self.shut {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS: write after shutdown",
            ));
        }
        while !src.is_empty() {
            let start = match self.open {
                Some(start) => start,
                None => {
                    self.renew_keys(out)?;
                    let start = self.keys.begin(out);
                    self.open = Some(start);
                    start
                }
            };
            let room = record::MAX_PLAIN - self.keys.staged(out, start);
            let n = room.min(src.len());
            out.extend_from_slice(&src[..n]);
            src = &src[n..];
            if n == room {
                self.seal(out)?;
            }
        }
        Ok(())
    }

    /// Seals the record being filled, if any: `out` is then whole records,
    /// ready for the socket.
    pub fn seal(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        match self.open.take() {
            Some(start) => self
                .keys
                .finish(record::APPLICATION_DATA, out, start)
                .map_err(|f| io::Error::other(f.to_string())),
            None => Ok(()),
        }
    }

    /// Seals what is staged, then close_notify (or, when the read half
    /// refused a record, the alert that says why), once.
    pub fn close(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        self.seal(out)?;
        if self.shut {
            return Ok(());
        }
        self.shut = true;
        let desc = self.ctl.alert.get().unwrap_or(record::CLOSE_NOTIFY);
        self.keys
            .seal(record::ALERT, &record::alert_payload(desc), out)
            .map_err(|f| io::Error::other(f.to_string()))
    }

    #[cfg(test)]
    fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }
}

impl TlsWriteHalf {
    /// The sealer and the socket, for a writer that keeps its own buffer
    /// (hyper's I/O, `edge/rt.rs`).
    pub fn into_parts(self) -> (Sealer, OwnedWriteHalf<TcpStream>) {
        (self.sealer, self.tcp)
    }

    async fn write_inner(&mut self, src: &[u8]) -> io::Result<usize> {
        let src = &src[..src.len().min(MAX_WRITE)];
        self.out.clear();
        self.sealer.stage(&mut self.out, src)?;
        self.sealer.seal(&mut self.out)?;
        send(&mut self.tcp, &mut self.out).await?;
        Ok(src.len())
    }

    #[cfg(test)]
    fn set_limit(&mut self, limit: u64) {
        self.sealer.set_limit(limit);
    }
}

impl AsyncWriteRent for TlsWriteHalf {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: `read_ptr` is valid for `bytes_init` bytes while `buf`
        // is held, and it is held until this returns.
        let src = unsafe { std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init()) };
        let res = self.write_inner(src).await;
        (res, buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: the raw buffer points into `buf`, held until this returns.
        let n = match unsafe { RawBuf::new_from_iovec(&buf) } {
            Some(raw) => self.write(raw).await.0,
            None => Ok(0),
        };
        (n, buf)
    }

    /// Every write is on the socket when it returns: nothing to flush.
    async fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// Sends close_notify (or, when the read half refused a record, the
    /// alert that says why), then shuts the TCP stream down.
    async fn shutdown(&mut self) -> io::Result<()> {
        self.out.clear();
        let mut sent = self.sealer.close(&mut self.out);
        if sent.is_ok() {
            sent = send(&mut self.tcp, &mut self.out).await;
        }
        let shut = self.tcp.shutdown().await;
        sent.and(shut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};

    type Client = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

    /// A CA and a `localhost` server certificate it signed, made by
    /// `scripts/dev-certs` for the test (nothing is checked in), and the
    /// server configurations they give. Removes the files on drop.
    struct Certs {
        dir: std::path::PathBuf,
        ca: Vec<u8>,
        configs: crate::tls::ServerConfigs,
    }

    impl Certs {
        fn new(test: &str) -> Certs {
            let dir =
                std::env::temp_dir().join(format!("mcp-tls-uring-{test}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/dev-certs");
            let ok = std::process::Command::new("bash")
                .arg(script)
                .arg(&dir)
                .status()
                .expect("bash scripts/dev-certs")
                .success();
            assert!(ok, "scripts/dev-certs failed");
            let section = crate::config::TlsSection {
                cert_file: dir.join("server.pem"),
                key_file: dir.join("server.key"),
                client_ca_file: None,
                handshake_timeout: std::time::Duration::from_secs(5),
                watch_interval: std::time::Duration::ZERO,
            };
            let configs = crate::tls::ServerConfigs::load(&section).expect("configs");
            let ca = std::fs::read(dir.join("ca.pem")).unwrap();
            Certs { dir, ca, configs }
        }

        fn server(&self, edge: crate::tls::Edge) -> Arc<ServerConfig> {
            self.configs.get(edge).clone()
        }

        /// A client trusting the CA, offering `versions` and `alpn`.
        fn client(
            &self,
            versions: &[&'static rustls::SupportedProtocolVersion],
            alpn: &[&[u8]],
        ) -> Arc<rustls::ClientConfig> {
            self.client_with_suites(versions, alpn, None)
        }

        /// As [`Self::client`], offering only `suite` if given.
        fn client_with_suites(
            &self,
            versions: &[&'static rustls::SupportedProtocolVersion],
            alpn: &[&[u8]],
            suite: Option<rustls::SupportedCipherSuite>,
        ) -> Arc<rustls::ClientConfig> {
            use rustls_pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pki_types::CertificateDer::pem_slice_iter(&self.ca) {
                roots.add(c.unwrap()).unwrap();
            }
            let mut provider = crate::tls::ring_provider();
            if let Some(suite) = suite {
                provider.cipher_suites = vec![suite];
            }
            let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
                .with_protocol_versions(versions)
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Arc::new(cfg)
        }
    }

    impl Drop for Certs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    const TLS13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

    fn on_runtime<F: std::future::Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("monoio runtime")
            .block_on(f)
    }

    /// A blocking rustls client on its own thread, connected to `addr`,
    /// running `f`.
    fn client<R: Send + 'static>(
        addr: std::net::SocketAddr,
        cfg: Arc<rustls::ClientConfig>,
        f: impl FnOnce(Client) -> R + Send + 'static,
    ) -> std::thread::JoinHandle<R> {
        std::thread::spawn(move || {
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            let conn = rustls::ClientConnection::new(cfg, name).unwrap();
            let tcp = std::net::TcpStream::connect(addr).unwrap();
            f(rustls::StreamOwned::new(conn, tcp))
        })
    }

    /// Writes `send`, then reads until the server closes; returns that.
    fn send_then_read_to_end(send: Vec<u8>) -> impl FnOnce(Client) -> Vec<u8> + Send {
        move |mut tls| {
            tls.write_all(&send).unwrap();
            tls.flush().unwrap();
            let mut got = Vec::new();
            let _ = tls.read_to_end(&mut got);
            got
        }
    }

    /// Client side: three rounds of 30,000 bytes sent and their echo read
    /// back; after each, with `new_keys`, a KeyUpdate asking the server
    /// for one too (it must take the client's new keys and send its own
    /// KeyUpdate before its next record). Returns the echoes.
    fn echo_rounds(tls: &mut Client, new_keys: bool) -> Vec<u8> {
        let mut got = Vec::new();
        for round in 0..3u8 {
            let msg = vec![round; 30_000];
            tls.write_all(&msg).unwrap();
            tls.flush().unwrap();
            let mut back = vec![0; msg.len()];
            tls.read_exact(&mut back).unwrap();
            got.extend_from_slice(&back);
            if new_keys {
                tls.conn.refresh_traffic_keys().unwrap();
            }
        }
        got
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// Binds a loopback listener, starts a client on it running `f`, and
    /// accepts its connection with the handshake: the halves, what was
    /// agreed, and the client's thread.
    async fn connected<R: Send + 'static>(
        config: Arc<ServerConfig>,
        cfg: Arc<rustls::ClientConfig>,
        f: impl FnOnce(Client) -> R + Send + 'static,
    ) -> (
        TlsReadHalf,
        TlsWriteHalf,
        Negotiated,
        std::thread::JoinHandle<R>,
    ) {
        let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = client(addr, cfg, f);
        let (stream, _) = listener.accept().await.unwrap();
        let (r, w, negotiated) = accept(stream, config).await.expect("handshake");
        (r, w, negotiated, client)
    }

    /// Reads until the stream ends, with reads of `chunk` bytes, and
    /// writes each back if `echo`. Returns what it read.
    async fn drain(r: &mut TlsReadHalf, w: &mut TlsWriteHalf, chunk: usize, echo: bool) -> Vec<u8> {
        let mut all = Vec::new();
        let mut buf = Vec::with_capacity(chunk);
        loop {
            buf.clear();
            let (res, b) = r.read(buf).await;
            buf = b;
            let n = res.expect("read");
            assert!(n <= chunk, "read {n} into a buffer of {chunk}");
            if n == 0 {
                return all;
            }
            all.extend_from_slice(&buf);
            if echo {
                let (res, b) = w.write_all(buf).await;
                buf = b;
                res.expect("echo");
            }
        }
    }

    #[test]
    fn echoes_large_messages_and_gives_back_a_cancelled_reads_buffer() {
        let certs = Certs::new("echo");
        let config = certs.server(crate::tls::Edge::Frames);
        let cfg = certs.client(TLS13, &[]);
        // Several records' worth, so reads and writes each take many turns.
        let message = pattern(200_000);
        let got = on_runtime(async move {
            let (mut r, mut w, negotiated, client) =
                connected(config, cfg, send_then_read_to_end(message.clone())).await;
            assert_eq!(negotiated.version, Some(rustls::ProtocolVersion::TLSv1_3));
            assert_eq!(negotiated.alpn, None);
            // A read cancelled while it waits returns ECANCELED and the
            // buffer with what it held (nothing is due from the client
            // before it has sent its message, but the first records may
            // already be here: read those first).
            let mut echoed = 0;
            let mut buf = Vec::with_capacity(8192);
            while echoed < message.len() {
                buf.clear();
                let (res, b) = r.read(buf).await;
                buf = b;
                let n = res.unwrap();
                assert!(n > 0, "EOF after {echoed}");
                let (res, b) = w.write_all(buf).await;
                buf = b;
                res.unwrap();
                echoed += n;
            }
            let canceller = monoio::io::Canceller::new();
            let mut held = b"kept".to_vec();
            held.reserve(64);
            let read = r.cancelable_read(held.slice_mut(4..), canceller.handle());
            let mut read = std::pin::pin!(read);
            let waited = monoio::select! {
                _ = &mut read => false,
                _ = monoio::time::sleep(std::time::Duration::from_millis(50)) => true,
            };
            assert!(waited, "nothing to read yet");
            canceller.cancel();
            let (res, b) = read.await;
            assert_eq!(
                res.unwrap_err().raw_os_error(),
                Some(libc::ECANCELED),
                "cancelled"
            );
            assert_eq!(&b.into_inner()[..], b"kept");
            w.shutdown().await.unwrap();
            client.join().unwrap()
        });
        assert_eq!(got, pattern(200_000));
    }

    #[test]
    fn tls12_client_gets_its_alpn_and_its_echo() {
        let certs = Certs::new("tls12");
        let config = certs.server(crate::tls::Edge::Http);
        let cfg = certs.client(&[&rustls::version::TLS12], &[b"http/1.1"]);
        let message = pattern(40_000);
        let sent = message.clone();
        let got = on_runtime(async move {
            let (mut r, mut w, negotiated, client) = connected(config, cfg, move |mut tls| {
                tls.write_all(&sent).unwrap();
                tls.flush().unwrap();
                let mut got = vec![0; sent.len()];
                tls.read_exact(&mut got).unwrap();
                tls.conn.send_close_notify();
                tls.flush().unwrap();
                // Until the server closes too (its close_notify must not
                // meet a closed socket).
                let _ = tls.read_to_end(&mut Vec::new());
                got
            })
            .await;
            assert_eq!(negotiated.version, Some(rustls::ProtocolVersion::TLSv1_2));
            assert_eq!(negotiated.alpn.as_deref(), Some(&b"http/1.1"[..]));
            let read = drain(&mut r, &mut w, 8192, true).await;
            assert_eq!(read.len(), 40_000);
            w.shutdown().await.unwrap();
            client.join().unwrap()
        });
        assert_eq!(got, message);
    }

    #[test]
    fn a_read_into_a_tiny_buffer_keeps_the_rest_of_the_record() {
        let certs = Certs::new("tiny");
        let config = certs.server(crate::tls::Edge::Frames);
        let cfg = certs.client(TLS13, &[]);
        // Full 16 KiB records and a short last one.
        let message = pattern(40_000);
        let (read, reply) = on_runtime(async move {
            let sent = message.clone();
            let (mut r, mut w, _, client) = connected(config, cfg, move |mut tls| {
                tls.write_all(&sent).unwrap();
                tls.flush().unwrap();
                let mut got = [0; 2];
                tls.read_exact(&mut got).unwrap();
                tls.sock.shutdown(std::net::Shutdown::Write).unwrap();
                got
            })
            .await;
            let mut read = Vec::new();
            let mut buf = Vec::with_capacity(7);
            while read.len() < message.len() {
                buf.clear();
                let (res, b) = r.read(buf).await;
                buf = b;
                let n = res.unwrap();
                assert!((1..=7).contains(&n), "read {n} into 7 bytes");
                read.extend_from_slice(&buf);
            }
            let (res, _) = w.write_all(b"ok".to_vec()).await;
            res.unwrap();
            (read, client.join().unwrap())
        });
        assert_eq!(read, pattern(40_000));
        assert_eq!(&reply, b"ok");
    }

    #[test]
    fn close_notify_from_the_peer_ends_reads_and_writes_still_go_out() {
        let certs = Certs::new("close-notify");
        let config = certs.server(crate::tls::Edge::Frames);
        let cfg = certs.client(TLS13, &[]);
        let (read, got) = on_runtime(async move {
            let (mut r, mut w, _, client) = connected(config, cfg, |mut tls| {
                tls.write_all(b"ping").unwrap();
                tls.conn.send_close_notify();
                tls.flush().unwrap();
                let mut got = Vec::new();
                tls.read_to_end(&mut got)
                    .expect("a clean end after close_notify");
                got
            })
            .await;
            let read = drain(&mut r, &mut w, 64, false).await;
            // The end stays an end.
            let (res, _) = r.read(Vec::with_capacity(64)).await;
            assert_eq!(res.unwrap(), 0);
            let (res, _) = w.write_all(b"pong".to_vec()).await;
            res.unwrap();
            w.shutdown().await.unwrap();
            (read, client.join().unwrap())
        });
        assert_eq!(&read, b"ping");
        assert_eq!(&got, b"pong");
    }

    #[test]
    fn tcp_close_without_close_notify_ends_reads() {
        let certs = Certs::new("tcp-close");
        let config = certs.server(crate::tls::Edge::Frames);
        let cfg = certs.client(TLS13, &[]);
        let read = on_runtime(async move {
            let (mut r, mut w, _, client) = connected(config, cfg, |mut tls| {
                tls.write_all(b"bye").unwrap();
                tls.flush().unwrap();
                // A FIN, no close_notify; then wait for the server's end
                // (closing with its records unread would reset instead).
                tls.sock.shutdown(std::net::Shutdown::Write).unwrap();
                let _ = tls.sock.read_to_end(&mut Vec::new());
            })
            .await;
            let read = drain(&mut r, &mut w, 64, false).await;
            w.shutdown().await.unwrap();
            client.join().unwrap();
            read
        });
        assert_eq!(&read, b"bye");
    }

    #[test]
    fn key_update_from_the_peer_is_answered_and_the_stream_goes_on() {
        let certs = Certs::new("key-update");
        let config = certs.server(crate::tls::Edge::Frames);
        let cfg = certs.client(TLS13, &[]);
        let got = on_runtime(async move {
            let (mut r, mut w, _, client) = connected(config, cfg, |mut tls| {
                let got = echo_rounds(&mut tls, true);
                tls.conn.send_close_notify();
                tls.flush().unwrap();
                let _ = tls.read_to_end(&mut Vec::new());
                got
            })
            .await;
            let read = drain(&mut r, &mut w, 8192, true).await;
            assert_eq!(read.len(), 90_000);
            w.shutdown().await.unwrap();
            client.join().unwrap()
        });
        let want: Vec<u8> = (0..3u8).flat_map(|r| vec![r; 30_000]).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn hyper_io_opens_records_into_its_reads_seals_its_writes_and_closes_with_close_notify() {
        use hyper::rt::{Read as _, Write as _};
        use std::mem::MaybeUninit;
        use std::pin::Pin;
        let certs = Certs::new("hyper-io");
        for versions in [TLS13, &[&rustls::version::TLS12][..]] {
            let config = certs.server(crate::tls::Edge::Http);
            let cfg = certs.client(versions, &[]);
            let tls13 = versions == TLS13;
            let (got, clean) = on_runtime(async move {
                let (r, w, _, client) = connected(config, cfg, move |mut tls| {
                    let got = echo_rounds(&mut tls, tls13);
                    tls.conn.send_close_notify();
                    tls.flush().unwrap();
                    // Ok only if the server's close_notify came.
                    let clean = tls.read_to_end(&mut Vec::new()).is_ok();
                    (got, clean)
                })
                .await;
                let mut io = crate::edge::rt::tls_io(r, w);
                let mut storage = vec![MaybeUninit::<u8>::uninit(); 20_000];
                let mut echoed = 0;
                // Reads smaller and larger than a record; each echoed as
                // three slices, which one record (or several) carries.
                for room in [7, 1000, 16_384, 20_000].into_iter().cycle() {
                    let mut rb = hyper::rt::ReadBuf::uninit(&mut storage[..room]);
                    std::future::poll_fn(|cx| Pin::new(&mut io).poll_read(cx, rb.unfilled()))
                        .await
                        .expect("read");
                    let read = rb.filled().to_vec();
                    if read.is_empty() {
                        break;
                    }
                    let (a, rest) = read.split_at(read.len() / 3);
                    let (b, c) = rest.split_at(rest.len() / 2);
                    let slices = [
                        std::io::IoSlice::new(a),
                        std::io::IoSlice::new(b),
                        std::io::IoSlice::new(c),
                    ];
                    let n = std::future::poll_fn(|cx| {
                        Pin::new(&mut io).poll_write_vectored(cx, &slices)
                    })
                    .await
                    .expect("write");
                    assert_eq!(n, read.len());
                    std::future::poll_fn(|cx| Pin::new(&mut io).poll_flush(cx))
                        .await
                        .expect("flush");
                    echoed += n;
                }
                assert_eq!(echoed, 90_000);
                std::future::poll_fn(|cx| Pin::new(&mut io).poll_shutdown(cx))
                    .await
                    .expect("shutdown");
                client.join().unwrap()
            });
            let want: Vec<u8> = (0..3u8).flat_map(|r| vec![r; 30_000]).collect();
            assert!(got == want, "{versions:?}: the echo differs");
            assert!(clean, "{versions:?}: no close_notify before the close");
        }
    }

    #[test]
    fn a_read_dropped_while_it_waits_loses_nothing_when_nothing_was_pending() {
        let certs = Certs::new("dropped-read");
        let config = certs.server(crate::tls::Edge::Frames);
        let cfg = certs.client(TLS13, &[]);
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let read = on_runtime(async move {
            let (mut r, mut w, _, client) = connected(config, cfg, move |mut tls| {
                tls.write_all(b"a").unwrap();
                tls.flush().unwrap();
                wait.recv().unwrap();
                tls.write_all(b"b").unwrap();
                tls.conn.send_close_notify();
                tls.flush().unwrap();
                let _ = tls.read_to_end(&mut Vec::new());
            })
            .await;
            let (res, first) = r.read(Vec::with_capacity(64)).await;
            assert_eq!(res.unwrap(), 1);
            // The read's TCP read has `rx` (empty) when its future goes.
            {
                let pending = r.read(Vec::with_capacity(64));
                let timeout = std::time::Duration::from_millis(20);
                let gone = monoio::time::timeout(timeout, pending).await;
                assert!(gone.is_err(), "nothing was sent yet");
            }
            // Dropping the recv only queues its cancellation; one turn of
            // the runtime submits it, so "b" cannot land in the dropped
            // recv's buffer (which would lose it, as the module doc says).
            monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            go.send(()).unwrap();
            let mut read = first;
            read.extend_from_slice(&drain(&mut r, &mut w, 64, false).await);
            w.shutdown().await.unwrap();
            client.join().unwrap();
            read
        });
        assert_eq!(&read, b"ab");
    }

    #[test]
    fn garbage_after_the_handshake_is_an_error_not_a_hang() {
        let certs = Certs::new("garbage");
        let config = certs.server(crate::tls::Edge::Frames);
        let cfg = certs.client(TLS13, &[]);
        // A record that does not authenticate, and bytes that are no
        // record at all.
        let mut forged = vec![0x17, 0x03, 0x03, 0x00, 0x20];
        forged.extend_from_slice(&[0xab; 32]);
        for garbage in [forged, b"GET / HTTP/1.1\r\n\r\n".to_vec()] {
            let config = config.clone();
            let cfg = cfg.clone();
            on_runtime(async move {
                let (mut r, mut w, _, client) = connected(config, cfg, move |mut tls| {
                    tls.write_all(b"hi").unwrap();
                    tls.flush().unwrap();
                    tls.sock.write_all(&garbage).unwrap();
                    let mut rest = Vec::new();
                    tls.read_to_end(&mut rest)
                        .expect_err("the server's alert")
                        .to_string()
                })
                .await;
                let (res, buf) = r.read(Vec::with_capacity(64)).await;
                assert_eq!(res.unwrap(), 2);
                assert_eq!(&buf, b"hi");
                let read = r.read(Vec::with_capacity(64));
                let (res, _) = monoio::time::timeout(std::time::Duration::from_secs(5), read)
                    .await
                    .expect("an answer, not a hang");
                let err = res.expect_err("garbage is an error");
                assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
                // It stays broken; the shutdown sends rustls's alert.
                let (res, _) = r.read(Vec::with_capacity(64)).await;
                assert!(res.is_err());
                let _ = w.shutdown().await;
                let seen = client.join().unwrap();
                assert!(seen.contains("received fatal alert"), "client saw: {seen}");
            });
        }
    }

    /// Every suite the ring provider negotiates, in both versions: each
    /// direction's records, several of them full, round-trip through a
    /// stock rustls client.
    #[test]
    fn every_cipher_suite_of_both_versions_round_trips() {
        use rustls::crypto::ring::cipher_suite as cs;
        let certs = Certs::new("suites");
        let config = certs.server(crate::tls::Edge::Frames);
        let suites = [
            (cs::TLS13_AES_128_GCM_SHA256, &rustls::version::TLS13),
            (cs::TLS13_AES_256_GCM_SHA384, &rustls::version::TLS13),
            (cs::TLS13_CHACHA20_POLY1305_SHA256, &rustls::version::TLS13),
            // scripts/dev-certs makes ECDSA keys.
            (
                cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                &rustls::version::TLS12,
            ),
            (
                cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                &rustls::version::TLS12,
            ),
            (
                cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
                &rustls::version::TLS12,
            ),
        ];
        for (suite, version) in suites {
            let cfg = certs.client_with_suites(&[version], &[], Some(suite));
            let config = config.clone();
            let message = pattern(70_000);
            let sent = message.clone();
            let got = on_runtime(async move {
                let (mut r, mut w, _, client) = connected(config, cfg, move |mut tls| {
                    tls.write_all(&sent).unwrap();
                    tls.flush().unwrap();
                    let mut got = vec![0; sent.len()];
                    let read = tls.read_exact(&mut got).map(|_| got);
                    let suite = tls.conn.negotiated_cipher_suite();
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                    let _ = tls.read_to_end(&mut Vec::new());
                    (read, suite)
                })
                .await;
                let read = drain(&mut r, &mut w, 8192, true).await;
                assert_eq!(read.len(), 70_000);
                w.shutdown().await.unwrap();
                client.join().unwrap()
            });
            let (read, negotiated) = got;
            assert_eq!(negotiated, Some(suite), "{suite:?}");
            assert_eq!(read.expect("the echo"), message, "{suite:?}");
        }
    }

    /// Near the cipher's confidentiality limit a TLS 1.3 write half renews
    /// its keys with a KeyUpdate, and the client follows; a TLS 1.2 write
    /// half, which cannot, refuses to write.
    #[test]
    fn the_record_limit_renews_tls13_keys_and_stops_tls12_writes() {
        let certs = Certs::new("limit");
        let config = certs.server(crate::tls::Edge::Frames);
        let cfg = certs.client(TLS13, &[]);
        let got = on_runtime(async move {
            let (mut r, mut w, _, client) = connected(config, cfg, |mut tls| {
                tls.write_all(b"go").unwrap();
                tls.flush().unwrap();
                let mut got = vec![0; 10 * 3];
                tls.read_exact(&mut got).unwrap();
                got
            })
            .await;
            let (res, _) = r.read(Vec::with_capacity(8)).await;
            assert_eq!(res.unwrap(), 2);
            w.set_limit(2);
            for i in 0..10u8 {
                let (res, _) = w.write_all(vec![i; 3]).await;
                res.unwrap();
            }
            // Renewed every other record: the sequence number restarts.
            assert!(w.sealer.keys.seq() <= 2, "seq {}", w.sealer.keys.seq());
            client.join().unwrap()
        });
        let want: Vec<u8> = (0..10u8).flat_map(|i| [i; 3]).collect();
        assert_eq!(got, want);

        let cfg = certs.client(&[&rustls::version::TLS12], &[]);
        let config = certs.server(crate::tls::Edge::Frames);
        on_runtime(async move {
            let (_r, mut w, _, client) = connected(config, cfg, |mut tls| {
                let mut got = Vec::new();
                let _ = tls.read_to_end(&mut got);
                got
            })
            .await;
            let sealed = w.sealer.keys.seq();
            w.set_limit(sealed + 1);
            let (res, _) = w.write_all(b"one".to_vec()).await;
            res.unwrap();
            let (res, _) = w.write_all(b"two".to_vec()).await;
            let err = res.expect_err("past the limit");
            assert!(err.to_string().contains("record limit"), "{err}");
            w.shutdown().await.unwrap();
            assert_eq!(client.join().unwrap(), b"one");
        });
    }

    /// Bytes that are no ClientHello fail the handshake with rustls's
    /// alert, sent before the connection closes, and nothing panics (a
    /// second look at the same bytes would make rustls send a second
    /// fatal alert, which it asserts against).
    #[test]
    fn a_handshake_that_fails_sends_the_alert_once_and_returns_the_error() {
        let certs = Certs::new("bad-hello");
        let config = certs.server(crate::tls::Edge::Frames);
        on_runtime(async move {
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = std::thread::spawn(move || {
                let mut tcp = std::net::TcpStream::connect(addr).unwrap();
                tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                let mut got = Vec::new();
                let _ = tcp.read_to_end(&mut got);
                got
            });
            let (stream, _) = listener.accept().await.unwrap();
            let err = accept(stream, config).await.err().expect("not a handshake");
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
            let got = client.join().unwrap();
            // One plaintext alert record: type 21, two bytes of payload.
            assert_eq!(got.first(), Some(&21), "{got:?}");
            assert_eq!(got.len(), 7, "{got:?}");
        });
    }

    /// Moves what `from` has to send into `to` and processes it there.
    fn pump<A, B>(
        from: &mut rustls::ConnectionCommon<A>,
        to: &mut rustls::ConnectionCommon<B>,
        wire: &mut Vec<u8>,
    ) -> Result<(), rustls::Error> {
        wire.clear();
        while from.wants_write() {
            from.write_tls(wire).unwrap();
        }
        let mut src = &wire[..];
        while !src.is_empty() {
            to.read_tls(&mut src).unwrap();
            to.process_new_packets()?;
        }
        Ok(())
    }

    /// The broker's own client settings (upstream routers, JWKS) against a
    /// server that takes only the post-quantum hybrid, one that knows only
    /// X25519, and one with every classic group (P-384 first, as ring's
    /// defaults have it): all connect, and none with a retry round trip,
    /// since the client sends an X25519 share beside the hybrid one and
    /// ranks X25519 above the other classic groups.
    #[test]
    fn the_brokers_client_offers_the_hybrid_and_still_meets_classic_servers_at_once() {
        use rustls::NamedGroup;
        use rustls::crypto::aws_lc_rs::{default_provider as aws, kx_group as pq};
        use rustls::crypto::ring::kx_group as classic;
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let ring = crate::tls::ring_provider;
        let certs = Certs::new("client-pq");
        let chain: Vec<_> = CertificateDer::pem_file_iter(certs.dir.join("server.pem"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(certs.dir.join("server.key")).unwrap();
        let client = Arc::new(crate::tls::client_config(Some(&certs.dir.join("ca.pem"))).unwrap());
        let hybrid_only: &[&'static dyn rustls::crypto::SupportedKxGroup] = &[pq::X25519MLKEM768];
        let classic_only: &[&'static dyn rustls::crypto::SupportedKxGroup] = &[classic::X25519];
        // A stock ring server: every classic group, P-384 first since rustls
        // 0.23.48. It follows the client's order, so it takes X25519 only
        // if the client ranks X25519 above P-384 (`tls::KX_GROUPS`).
        let ring_groups = ring().kx_groups;
        for (server_kind, provider, groups, want) in [
            (
                "hybrid-only",
                aws(),
                hybrid_only,
                NamedGroup::X25519MLKEM768,
            ),
            ("classic-only", ring(), classic_only, NamedGroup::X25519),
            (
                "every classic group",
                ring(),
                &ring_groups[..],
                NamedGroup::X25519,
            ),
        ] {
            let provider = rustls::crypto::CryptoProvider {
                kx_groups: groups.to_vec(),
                ..provider
            };
            let server = ServerConfig::builder_with_provider(Arc::new(provider))
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(chain.clone(), key.clone_key())
                .unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            let mut c = rustls::ClientConnection::new(client.clone(), name).unwrap();
            let mut s = rustls::ServerConnection::new(Arc::new(server)).unwrap();
            let mut wire = Vec::new();
            for _ in 0..10 {
                if !c.is_handshaking() && !s.is_handshaking() {
                    break;
                }
                pump(&mut c, &mut s, &mut wire)
                    .unwrap_or_else(|e| panic!("{server_kind}: server: {e}"));
                pump(&mut s, &mut c, &mut wire)
                    .unwrap_or_else(|e| panic!("{server_kind}: client: {e}"));
            }
            assert!(
                !c.is_handshaking(),
                "{server_kind}: the handshake did not finish"
            );
            let got = c.negotiated_key_exchange_group().map(|g| g.name());
            assert_eq!(got, Some(want), "{server_kind}");
            assert_eq!(
                c.handshake_kind(),
                Some(rustls::HandshakeKind::Full),
                "{server_kind}: a HelloRetryRequest round trip"
            );
        }
    }
}
