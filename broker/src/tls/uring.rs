//! TLS on a shard: a rustls server connection over a monoio TCP stream,
//! split into a read half and a write half like the plaintext stream, so
//! that the frame edge's reader and writer tasks and the HTTP edge's hyper
//! I/O work unchanged over it.
//!
//! # Design
//! - Both halves share the rustls connection (`Rc<RefCell<_>>`, one shard
//!   thread). A borrow never spans an `.await`: the halves encrypt or
//!   decrypt in memory, then do their I/O with owned buffers of their own.
//! - The read half owns the TCP read half and its ciphertext buffer; the
//!   write half owns the TCP write half and its ciphertext buffer.
//! - [`TlsReadHalf`] is a [`CancelableAsyncReadRent`] like the TCP half it
//!   wraps: the cancel handle goes to its TCP read, and a cancelled read
//!   gives back the caller's buffer as it was. Ciphertext already read
//!   stays in the half (fed to rustls), so nothing is lost.
//! - A read whose future is *dropped* while its TCP read is out takes the
//!   ciphertext buffer with it (monoio keeps it until the kernel lets go);
//!   what it held was already fed to rustls, so only bytes the kernel puts
//!   in before the cancellation lands are lost, as with a dropped read on a
//!   plain TCP half, and the next read gets a new buffer. The edges drop a
//!   read only with the whole connection.
//! - Once rustls fails the stream (a record that does not authenticate,
//!   bytes that are no record), the plaintext of the records before it is
//!   still handed out, then every read fails; rustls's alert goes out with
//!   the shutdown.
//! - Records the read side makes rustls want to send (an alert, a TLS 1.3
//!   key update's answer) go out with the write half's next write or its
//!   shutdown; the read side never writes.

use std::cell::RefCell;
use std::io::{self, BufRead, Write as _};
use std::rc::Rc;
use std::sync::Arc;

use monoio::BufResult;
use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut, RawBuf};
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, CancelHandle, CancelableAsyncReadRent,
    OwnedReadHalf, OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;
use rustls::{ServerConfig, ServerConnection};

/// Ciphertext one TCP read may bring in: one full TLS record and then some.
const CIPHER_CHUNK: usize = 18 * 1024;

type Shared = Rc<RefCell<ServerConnection>>;

/// The reading half of a TLS connection.
pub struct TlsReadHalf {
    tcp: OwnedReadHalf<TcpStream>,
    conn: Shared,
    /// Ciphertext read from the socket; `pos..` not yet taken by rustls.
    cipher: Vec<u8>,
    pos: usize,
    /// The peer closed its side of the TCP connection.
    eof: bool,
    /// Why rustls failed the stream (a record that did not authenticate,
    /// bytes that are no record): every later read fails with it too,
    /// instead of waiting on a peer that will not fix it.
    broken: Option<String>,
}

/// The writing half of a TLS connection.
pub struct TlsWriteHalf {
    tcp: OwnedWriteHalf<TcpStream>,
    conn: Shared,
    /// Ciphertext for the socket (kept between writes for its capacity).
    out: Vec<u8>,
}

/// What a finished handshake agreed.
#[derive(Debug, Clone)]
pub struct Negotiated {
    pub version: Option<rustls::ProtocolVersion>,
    pub alpn: Option<Vec<u8>>,
}

/// Runs the server side of a TLS handshake on `stream`. The caller bounds
/// it in time (`tls.handshake_timeout`): dropping the future drops the
/// connection.
pub async fn accept(
    stream: TcpStream,
    config: Arc<ServerConfig>,
) -> io::Result<(TlsReadHalf, TlsWriteHalf, Negotiated)> {
    let conn = ServerConnection::new(config).map_err(io::Error::other)?;
    let conn = Rc::new(RefCell::new(conn));
    let (rd, wr) = stream.into_split();
    let mut r = TlsReadHalf {
        tcp: rd,
        conn: conn.clone(),
        cipher: Vec::with_capacity(CIPHER_CHUNK),
        pos: 0,
        eof: false,
        broken: None,
    };
    let mut w = TlsWriteHalf {
        tcp: wr,
        conn,
        out: Vec::with_capacity(4096),
    };
    loop {
        w.send_pending().await?;
        if !r.conn.borrow().is_handshaking() {
            break;
        }
        if r.pos == r.cipher.len() {
            if r.eof {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the TLS handshake",
                ));
            }
            r.fill(None).await?;
        }
        if let Err(e) = r.feed() {
            // The alert rustls queued tells the peer why (e.g. a protocol
            // version it does not offer); a failure to send it changes
            // nothing.
            let _ = w.send_pending().await;
            return Err(e);
        }
    }
    let negotiated = {
        let c = r.conn.borrow();
        Negotiated {
            version: c.protocol_version(),
            alpn: c.alpn_protocol().map(<[u8]>::to_vec),
        }
    };
    Ok((r, w, negotiated))
}

impl TlsReadHalf {
    /// Reads more ciphertext from the socket (all of the previous read has
    /// been fed to rustls). `c`: the caller's cancel handle.
    async fn fill(&mut self, c: Option<&CancelHandle>) -> io::Result<()> {
        let mut buf = std::mem::take(&mut self.cipher);
        buf.clear();
        if buf.capacity() == 0 {
            // A read dropped while it waited took the buffer with it: a
            // read into no room would look like the peer's EOF.
            buf.reserve(CIPHER_CHUNK);
        }
        self.pos = 0;
        let (res, buf) = match c {
            Some(c) => self.tcp.cancelable_read(buf, c.clone()).await,
            None => self.tcp.read(buf).await,
        };
        self.cipher = buf;
        crate::idle_poll::note_activity();
        if res? == 0 {
            self.eof = true;
            // rustls learns of the end: its reader then reports a clean
            // close (after close_notify) or an unexpected EOF.
            let _ = self.conn.borrow_mut().read_tls(&mut io::empty());
        }
        Ok(())
    }

    /// Hands buffered ciphertext to rustls and processes the records.
    fn feed(&mut self) -> io::Result<()> {
        let mut conn = self.conn.borrow_mut();
        while self.pos < self.cipher.len() && conn.wants_read() {
            let mut src = &self.cipher[self.pos..];
            let n = conn.read_tls(&mut src)?;
            self.pos += n;
            conn.process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if n == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Copies decrypted bytes into `buf`: `Some(n)` when there were some,
    /// or when the stream ended (`n == 0`); `None` when more ciphertext is
    /// needed.
    fn take_plaintext<T: IoBufMut>(&mut self, buf: &mut T) -> io::Result<Option<usize>> {
        let mut conn = self.conn.borrow_mut();
        let mut reader = conn.reader();
        match reader.fill_buf() {
            Ok(chunk) => {
                let n = chunk.len().min(buf.bytes_total());
                // SAFETY: `write_ptr` is valid for `bytes_total` bytes, and
                // `n` is at most that; the source is rustls's buffer, which
                // cannot overlap the caller's.
                unsafe {
                    std::ptr::copy_nonoverlapping(chunk.as_ptr(), buf.write_ptr(), n);
                    buf.set_init(n);
                }
                reader.consume(n);
                Ok(Some(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            // The peer closed the TCP connection without close_notify: for
            // the edges' framing (length prefixes, HTTP messages) that is an
            // ordinary end, as it is in plaintext.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(Some(0)),
            Err(e) => Err(e),
        }
    }

    async fn read_inner<T: IoBufMut>(
        &mut self,
        mut buf: T,
        c: Option<&CancelHandle>,
    ) -> BufResult<usize, T> {
        loop {
            match self.take_plaintext(&mut buf) {
                Ok(Some(n)) => return (Ok(n), buf),
                Ok(None) => {
                    if let Some(why) = &self.broken {
                        return (
                            Err(io::Error::new(io::ErrorKind::InvalidData, why.clone())),
                            buf,
                        );
                    }
                }
                Err(e) => return (Err(e), buf),
            }
            if self.pos < self.cipher.len() {
                let before = self.pos;
                if let Err(e) = self.feed() {
                    // Records that authenticated before the bad one are
                    // the peer's data: hand them out first; the next read
                    // fails.
                    self.broken = Some(e.to_string());
                    return match self.take_plaintext(&mut buf) {
                        Ok(Some(n)) if n > 0 => (Ok(n), buf),
                        _ => (Err(e), buf),
                    };
                }
                if self.pos == before {
                    // rustls took nothing and had nothing to give: a state
                    // it cannot leave, so the stream is broken.
                    return match self.take_plaintext(&mut buf) {
                        Ok(Some(n)) => (Ok(n), buf),
                        Ok(None) => (
                            Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "TLS stream stalled: records rustls will not take",
                            )),
                            buf,
                        ),
                        Err(e) => (Err(e), buf),
                    };
                }
                continue;
            }
            if self.eof {
                // Fed the end above and rustls still wants data: only a
                // clean or unclean end can follow.
                return (Ok(0), buf);
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

impl TlsWriteHalf {
    /// Sends every record rustls holds for the peer.
    async fn send_pending(&mut self) -> io::Result<()> {
        loop {
            let mut out = std::mem::take(&mut self.out);
            out.clear();
            {
                let mut conn = self.conn.borrow_mut();
                while conn.wants_write() {
                    conn.write_tls(&mut out)?;
                }
            }
            if out.is_empty() {
                self.out = out;
                return Ok(());
            }
            let (res, out) = self.tcp.write_all(out).await;
            // A buffer one large answer grew is not kept.
            if out.capacity() <= 4 * CIPHER_CHUNK {
                self.out = out;
            }
            res?;
        }
    }
}

impl AsyncWriteRent for TlsWriteHalf {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // Room first: rustls takes plaintext only up to its buffer limit.
        if let Err(e) = self.send_pending().await {
            return (Err(e), buf);
        }
        // SAFETY: `read_ptr` is valid for `bytes_init` bytes while `buf`
        // is held, and it is held until this returns.
        let src = unsafe { std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init()) };
        let n = match self.conn.borrow_mut().writer().write(src) {
            Ok(n) => n,
            Err(e) => return (Err(e), buf),
        };
        if let Err(e) = self.send_pending().await {
            return (Err(e), buf);
        }
        (Ok(n), buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: the raw buffer points into `buf`, held until this returns.
        let n = match unsafe { RawBuf::new_from_iovec(&buf) } {
            Some(raw) => self.write(raw).await.0,
            None => Ok(0),
        };
        (n, buf)
    }

    async fn flush(&mut self) -> io::Result<()> {
        self.conn.borrow_mut().writer().flush()?;
        self.send_pending().await
    }

    /// Sends close_notify (and whatever else is pending), then shuts the
    /// TCP stream down.
    async fn shutdown(&mut self) -> io::Result<()> {
        self.conn.borrow_mut().send_close_notify();
        let sent = self.send_pending().await;
        let shut = self.tcp.shutdown().await;
        sent.and(shut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

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
            use rustls_pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pki_types::CertificateDer::pem_slice_iter(&self.ca) {
                roots.add(c.unwrap()).unwrap();
            }
            let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
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

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// Accepts one connection on `listener` and runs the handshake.
    async fn accept_one(
        listener: &monoio::net::TcpListener,
        config: Arc<ServerConfig>,
    ) -> (TlsReadHalf, TlsWriteHalf, Negotiated) {
        let (stream, _) = listener.accept().await.unwrap();
        accept(stream, config).await.expect("handshake")
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
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = client(addr, cfg, send_then_read_to_end(message.clone()));
            let (mut r, mut w, negotiated) = accept_one(&listener, config).await;
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
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = client(addr, cfg, move |mut tls| {
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
            });
            let (mut r, mut w, negotiated) = accept_one(&listener, config).await;
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
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let sent = message.clone();
            let client = client(addr, cfg, move |mut tls| {
                tls.write_all(&sent).unwrap();
                tls.flush().unwrap();
                let mut got = [0; 2];
                tls.read_exact(&mut got).unwrap();
                tls.sock.shutdown(std::net::Shutdown::Write).unwrap();
                got
            });
            let (mut r, mut w, _) = accept_one(&listener, config).await;
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
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = client(addr, cfg, |mut tls| {
                tls.write_all(b"ping").unwrap();
                tls.conn.send_close_notify();
                tls.flush().unwrap();
                let mut got = Vec::new();
                tls.read_to_end(&mut got)
                    .expect("a clean end after close_notify");
                got
            });
            let (mut r, mut w, _) = accept_one(&listener, config).await;
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
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = client(addr, cfg, |mut tls| {
                tls.write_all(b"bye").unwrap();
                tls.flush().unwrap();
                // A FIN, no close_notify; then wait for the server's end
                // (closing with its records unread would reset instead).
                tls.sock.shutdown(std::net::Shutdown::Write).unwrap();
                let _ = tls.sock.read_to_end(&mut Vec::new());
            });
            let (mut r, mut w, _) = accept_one(&listener, config).await;
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
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = client(addr, cfg, |mut tls| {
                let mut got = Vec::new();
                for round in 0..3u8 {
                    let msg = vec![round; 30_000];
                    tls.write_all(&msg).unwrap();
                    tls.flush().unwrap();
                    let mut back = vec![0; msg.len()];
                    tls.read_exact(&mut back).unwrap();
                    got.extend_from_slice(&back);
                    // New keys both ways: the server must take the
                    // client's and send its own before its next record.
                    tls.conn.refresh_traffic_keys().unwrap();
                }
                tls.conn.send_close_notify();
                tls.flush().unwrap();
                let _ = tls.read_to_end(&mut Vec::new());
                got
            });
            let (mut r, mut w, _) = accept_one(&listener, config).await;
            let read = drain(&mut r, &mut w, 8192, true).await;
            assert_eq!(read.len(), 90_000);
            w.shutdown().await.unwrap();
            client.join().unwrap()
        });
        let want: Vec<u8> = (0..3u8).flat_map(|r| vec![r; 30_000]).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_read_dropped_while_it_waits_loses_nothing_when_nothing_was_pending() {
        let certs = Certs::new("dropped-read");
        let config = certs.server(crate::tls::Edge::Frames);
        let cfg = certs.client(TLS13, &[]);
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let read = on_runtime(async move {
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = client(addr, cfg, move |mut tls| {
                tls.write_all(b"a").unwrap();
                tls.flush().unwrap();
                wait.recv().unwrap();
                tls.write_all(b"b").unwrap();
                tls.conn.send_close_notify();
                tls.flush().unwrap();
                let _ = tls.read_to_end(&mut Vec::new());
            });
            let (mut r, mut w, _) = accept_one(&listener, config).await;
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
                let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = listener.local_addr().unwrap();
                let client = client(addr, cfg, move |mut tls| {
                    tls.write_all(b"hi").unwrap();
                    tls.flush().unwrap();
                    tls.sock.write_all(&garbage).unwrap();
                    let mut rest = Vec::new();
                    tls.read_to_end(&mut rest)
                        .expect_err("the server's alert")
                        .to_string()
                });
                let (mut r, mut w, _) = accept_one(&listener, config).await;
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
}
