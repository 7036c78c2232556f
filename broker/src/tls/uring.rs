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
        self.pos = 0;
        let (res, buf) = match c {
            Some(c) => self.tcp.cancelable_read(buf, c.clone()).await,
            None => self.tcp.read(buf).await,
        };
        self.cipher = buf;
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
                Ok(None) => {}
                Err(e) => return (Err(e), buf),
            }
            if self.pos < self.cipher.len() {
                let before = self.pos;
                if let Err(e) = self.feed() {
                    return (Err(e), buf);
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

    /// A CA and a `localhost` server certificate it signed, made by
    /// `scripts/dev-certs` for the test (nothing is checked in). Returns
    /// the CA's PEM and the server's files.
    fn cert_and_key(dir: &std::path::Path) -> (Vec<u8>, std::path::PathBuf, std::path::PathBuf) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/dev-certs");
        let ok = std::process::Command::new("bash")
            .arg(script)
            .arg(dir)
            .status()
            .expect("bash scripts/dev-certs")
            .success();
        assert!(ok, "scripts/dev-certs failed");
        (
            std::fs::read(dir.join("ca.pem")).unwrap(),
            dir.join("server.pem"),
            dir.join("server.key"),
        )
    }

    fn on_runtime<F: std::future::Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("monoio runtime")
            .block_on(f)
    }

    /// A blocking rustls client on its own thread: writes `send`, reads
    /// until the server closes, returns what it read.
    fn client(
        addr: std::net::SocketAddr,
        ca_pem: Vec<u8>,
        send: Vec<u8>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            use rustls_pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pki_types::CertificateDer::pem_slice_iter(&ca_pem) {
                roots.add(c.unwrap()).unwrap();
            }
            let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
            let tcp = std::net::TcpStream::connect(addr).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            tls.write_all(&send).unwrap();
            tls.flush().unwrap();
            let mut got = Vec::new();
            let _ = tls.read_to_end(&mut got);
            got
        })
    }

    #[test]
    fn echoes_large_messages_and_gives_back_a_cancelled_reads_buffer() {
        let dir = std::env::temp_dir().join(format!("mcp-tls-uring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, cert, key) = cert_and_key(&dir);
        let section = crate::config::TlsSection {
            cert_file: cert,
            key_file: key,
            client_ca_file: None,
            handshake_timeout: std::time::Duration::from_secs(5),
            watch_interval: std::time::Duration::ZERO,
        };
        let configs = crate::tls::ServerConfigs::load(&section).expect("configs");
        let config = configs.get(crate::tls::Edge::Frames).clone();
        // Several records' worth, so reads and writes each take many turns.
        let message: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let got = on_runtime(async move {
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = client(addr, ca, message.clone());
            let (stream, _) = listener.accept().await.unwrap();
            let (mut r, mut w, negotiated) = accept(stream, config).await.expect("handshake");
            assert_eq!(negotiated.version, Some(rustls::ProtocolVersion::TLSv1_3));
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
        assert_eq!(got.len(), 200_000);
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
