//! TLS for `frames+tls://`, `https://` and `grpcs://`: one rustls client
//! configuration per run (TLS 1.3 and 1.2, the ring provider), and the
//! connections of the monoio drivers (frames, HTTP), plain or TLS.
//!
//! The monoio drivers drive a `rustls::ClientConnection` themselves over
//! monoio's TCP halves rather than through `monoio-rustls`: the frame driver
//! reads and writes one connection from two tasks, and monoio-rustls's split
//! stream writes from its read path when a read fails (to send the alert),
//! which panics when the writer task has a write in flight. Here the read
//! half never writes: the two halves share the rustls state through a
//! `RefCell` that is never borrowed across an await, and each owns its own
//! TCP half and buffer.
//!
//! `grpcs://` uses tonic's own rustls client (`ClientTlsConfig`), built from
//! the same files and name.
//!
//! # Invariants
//! - The handshake completes in `Connector::connect`, before the start line:
//!   it is connection setup, never request latency.
//! - Ciphertext read from the socket is kept until rustls has taken all of
//!   it; plaintext is handed out before more ciphertext is read.
//! - A read cancelled by dropping its future loses its buffer (as a plain
//!   TCP read does); the drivers only cancel a read when the connection is
//!   never read again, and a later read says so instead of panicking.

use std::cell::RefCell;
use std::fmt;
use std::io::{self, BufRead, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use monoio::BufResult;
use monoio::buf::IoBufMut;
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

use crate::target::{Scheme, Target};

/// Ciphertext read buffer of a TLS connection: a few full records.
const CIPHER_BUF: usize = 64 * 1024;

/// The TLS flags, as given.
#[derive(Clone, Debug, Default)]
pub struct TlsFlags {
    pub ca: Option<PathBuf>,
    pub server_name: Option<String>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl TlsFlags {
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.server_name.is_some() || self.cert.is_some() || self.key.is_some()
    }
}

/// Everything a run needs to open TLS connections, built once.
#[derive(Clone)]
pub struct TlsClient {
    /// The name the server's certificate must carry (sent as SNI unless it
    /// is an IP address, which is verified as an IP SAN).
    pub server_name: ServerName<'static>,
    /// For the monoio drivers.
    pub config: Arc<ClientConfig>,
    /// For `grpcs://` (tonic builds its own rustls config from it).
    pub tonic: tonic::transport::ClientTlsConfig,
    /// Whether `--tls-ca` was given (else the webpki roots): for the hint a
    /// failed verification gets.
    pub custom_ca: bool,
}

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsClient")
            .field("server_name", &self.server_name)
            .field("alpn", &self.config.alpn_protocols)
            .field("custom_ca", &self.custom_ca)
            .field(
                "client_cert",
                &self.config.client_auth_cert_resolver.has_certs(),
            )
            .finish()
    }
}

fn read(what: &str, p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("{what} {}: {e}", p.display()))
}

/// The generator's crypto: ring's provider with its classic key exchange
/// groups in the order rustls shipped them before 0.23.48: X25519, P-256,
/// P-384. rustls 0.23.48 put P-384 first, and a rustls server follows the
/// client's order, so every handshake would have become a P-384 one, dearer
/// than X25519 and unlike what most clients offer. No post-quantum hybrid:
/// the generator's handshakes stay those of a classic client.
#[expect(
    deprecated,
    reason = "ring's provider, with its groups ordered here; no hybrid wanted"
)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::kx_group;
    Arc::new(rustls::crypto::CryptoProvider {
        kx_groups: vec![kx_group::X25519, kx_group::SECP256R1, kx_group::SECP384R1],
        ..rustls::crypto::ring::default_provider()
    })
}

impl TlsClient {
    /// Reads and checks the files of `flags` for `target` (a TLS target).
    /// Every problem is reported as one message.
    pub fn new(target: &Target, flags: &TlsFlags) -> Result<Self, String> {
        let name = flags.server_name.as_deref().unwrap_or(&target.host);
        let name = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(name);
        let server_name = ServerName::try_from(name.to_owned()).map_err(|_| {
            format!(
                "--tls-server-name: `{name}` is neither a DNS name nor an IP address{}",
                if flags.server_name.is_none() {
                    " (it is the target's host; pass --tls-server-name NAME)"
                } else {
                    ""
                }
            )
        })?;
        let provider = provider();
        // tonic's `grpcs://` client takes the process's default provider
        // when one is installed (else ring's defaults): the same groups, in
        // the same order, on every edge. Err: one is installed already,
        // by an earlier `Connector` of this process (tests), and it is this.
        let _ = rustls::crypto::CryptoProvider::install_default((*provider).clone());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| format!("TLS setup: {e}"))?;
        let mut roots = RootCertStore::empty();
        let mut tonic = tonic::transport::ClientTlsConfig::new().domain_name(name);
        match &flags.ca {
            Some(p) => {
                let pem = read("--tls-ca", p)?;
                for c in CertificateDer::pem_slice_iter(&pem) {
                    let c = c.map_err(|e| format!("--tls-ca {}: {e}", p.display()))?;
                    roots
                        .add(c)
                        .map_err(|e| format!("--tls-ca {}: {e}", p.display()))?;
                }
                if roots.is_empty() {
                    return Err(format!(
                        "--tls-ca {}: no PEM certificate in it",
                        p.display()
                    ));
                }
                tonic = tonic.ca_certificate(tonic::transport::Certificate::from_pem(pem));
            }
            None => {
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                tonic = tonic.trust_anchors(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            }
        }
        let builder = builder.with_root_certificates(roots);
        let mut config = match (&flags.cert, &flags.key) {
            (Some(c), Some(k)) => {
                let cert_pem = read("--tls-cert", c)?;
                let key_pem = read("--tls-key", k)?;
                let chain = CertificateDer::pem_slice_iter(&cert_pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("--tls-cert {}: {e}", c.display()))?;
                if chain.is_empty() {
                    return Err(format!(
                        "--tls-cert {}: no PEM certificate in it",
                        c.display()
                    ));
                }
                let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
                    rustls::pki_types::pem::Error::NoItemsFound => {
                        format!("--tls-key {}: no PEM private key in it", k.display())
                    }
                    e => format!("--tls-key {}: {e}", k.display()),
                })?;
                tonic = tonic.identity(tonic::transport::Identity::from_pem(cert_pem, key_pem));
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    format!(
                        "--tls-cert {} / --tls-key {}: {e}",
                        c.display(),
                        k.display()
                    )
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(
                    "--tls-cert and --tls-key go together: give both (mTLS) or neither".into(),
                );
            }
        };
        // HTTP/1.1 is what the HTTP driver speaks; a frame connection
        // offers no protocol (tonic offers h2 itself).
        if target.scheme == Scheme::Http {
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
        }
        Ok(Self {
            server_name,
            config: Arc::new(config),
            tonic,
            custom_ca: flags.ca.is_some(),
        })
    }

    /// A failed handshake, said so that it can be acted on.
    pub fn explain(&self, e: &io::Error) -> String {
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(r) => self.explain_rustls(r),
            None => format!("TLS handshake failed: {e}"),
        }
    }

    /// The first rustls error in `e`'s source chain, explained (tonic
    /// reports a failed handshake as a transport error caused by it).
    pub fn explain_chain(&self, e: &(dyn std::error::Error + 'static)) -> Option<String> {
        let mut cur = Some(e);
        while let Some(c) = cur {
            if let Some(r) = c.downcast_ref::<rustls::Error>() {
                return Some(self.explain_rustls(r));
            }
            if let Some(r) = c
                .downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|i| i.downcast_ref::<rustls::Error>())
            {
                return Some(self.explain_rustls(r));
            }
            cur = c.source();
        }
        None
    }

    fn explain_rustls(&self, e: &rustls::Error) -> String {
        let mut s = format!("TLS handshake failed: {e}");
        let cert = match e {
            rustls::Error::InvalidCertificate(c) => Some(c),
            _ => None,
        };
        match cert {
            Some(rustls::CertificateError::UnknownIssuer) if !self.custom_ca => s.push_str(
                " (no --tls-ca was given, so the server's certificate was checked against \
                 the public web roots: pass --tls-ca FILE with the CA that signed it)",
            ),
            Some(rustls::CertificateError::UnknownIssuer) => {
                s.push_str(" (the server's certificate is not signed by --tls-ca)")
            }
            Some(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            ) => s.push_str(&format!(
                " (verified as `{}`; --tls-server-name sets the name to verify)",
                self.server_name.to_str()
            )),
            _ => {}
        }
        s
    }
}

/// Opens the connections of a monoio driver: TCP, then TLS when the target
/// asks for it.
#[derive(Clone, Debug, Default)]
pub struct Connector {
    pub tls: Option<Arc<TlsClient>>,
}

impl Connector {
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<Conn> {
        let s = TcpStream::connect_addr(addr).await?;
        // Requests are latency-measured one by one: never let Nagle hold
        // one back waiting for more.
        s.set_nodelay(true)?;
        let (r, w) = s.into_split();
        let Some(tls) = &self.tls else {
            return Ok(Conn {
                r: ReadHalf::Plain(r),
                w: WriteHalf::Plain(w),
            });
        };
        let mut conn = ClientConnection::new(Arc::clone(&tls.config), tls.server_name.clone())
            .map_err(|e| io::Error::other(format!("TLS setup: {e}")))?;
        // A write takes all of its plaintext at once (the drivers bound
        // what they write by their window).
        conn.set_buffer_limit(None);
        let conn = Rc::new(RefCell::new(conn));
        let mut r = TlsRead {
            tcp: r,
            conn: Rc::clone(&conn),
            buf: Some(Vec::with_capacity(CIPHER_BUF)),
            pos: 0,
            eof: false,
        };
        let mut w = TlsWrite {
            tcp: w,
            conn,
            out: Some(Vec::with_capacity(CIPHER_BUF)),
        };
        handshake(&mut r, &mut w)
            .await
            .map_err(|e| io::Error::new(e.kind(), tls.explain(&e)))?;
        Ok(Conn {
            r: ReadHalf::Tls(r),
            w: WriteHalf::Tls(w),
        })
    }
}

async fn handshake(r: &mut TlsRead, w: &mut TlsWrite) -> io::Result<()> {
    loop {
        w.flush_tls().await?;
        if !r.conn.borrow().is_handshaking() {
            return Ok(());
        }
        if r.eof {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection during the TLS handshake",
            ));
        }
        if let Err(e) = r.pull().await {
            // Tell the server why (the alert rustls queued), best effort.
            let _ = w.flush_tls().await;
            return Err(e);
        }
    }
}

/// One connection of a monoio driver, plain or TLS, as its two halves.
pub struct Conn {
    pub r: ReadHalf,
    pub w: WriteHalf,
}

pub enum ReadHalf {
    Plain(OwnedReadHalf<TcpStream>),
    Tls(TlsRead),
}

pub enum WriteHalf {
    Plain(OwnedWriteHalf<TcpStream>),
    Tls(TlsWrite),
}

impl ReadHalf {
    /// Reads into `buf` (from its start, as monoio does): `Ok(0)` is the
    /// end of the stream (a TLS `close_notify`; an end without it is an
    /// `UnexpectedEof` error).
    pub async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ReadHalf::Plain(r) => r.read(buf).await,
            ReadHalf::Tls(r) => r.read(buf).await,
        }
    }
}

impl WriteHalf {
    /// Writes all of `buf`.
    pub async fn write_all(&mut self, buf: Vec<u8>) -> BufResult<usize, Vec<u8>> {
        match self {
            WriteHalf::Plain(w) => w.write_all(buf).await,
            WriteHalf::Tls(w) => w.write_all(buf).await,
        }
    }

    /// Ends the sending side (TLS: `close_notify` first).
    pub async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            WriteHalf::Plain(w) => w.shutdown().await,
            WriteHalf::Tls(w) => {
                w.conn.borrow_mut().send_close_notify();
                w.flush_tls().await?;
                w.tcp.shutdown().await
            }
        }
    }
}

/// The reading half of a TLS connection: never writes.
pub struct TlsRead {
    tcp: OwnedReadHalf<TcpStream>,
    conn: Rc<RefCell<ClientConnection>>,
    /// Ciphertext read and not yet all taken by rustls (`pos..`). `None`
    /// only while a socket read holds it (or after that read was
    /// cancelled).
    buf: Option<Vec<u8>>,
    pos: usize,
    eof: bool,
}

impl TlsRead {
    /// Gives rustls more ciphertext, from the buffer or else the socket,
    /// and processes it.
    async fn pull(&mut self) -> io::Result<()> {
        let mut buf = self.buf.take().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS connection read after a cancelled read",
            )
        })?;
        if self.pos == buf.len() && !self.eof {
            buf.clear();
            self.pos = 0;
            let (res, b) = self.tcp.read(buf).await;
            buf = b;
            match res {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) => {
                    self.buf = Some(buf);
                    return Err(e);
                }
            }
        }
        let mut conn = self.conn.borrow_mut();
        let res = if self.eof && self.pos == buf.len() {
            // Tells rustls the stream ended.
            conn.read_tls(&mut io::empty())
        } else {
            let mut rest = &buf[self.pos..];
            let res = conn.read_tls(&mut rest);
            if let Ok(n) = res {
                self.pos += n;
            }
            res
        };
        self.buf = Some(buf);
        res?;
        conn.process_new_packets()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(())
    }

    async fn read<T: IoBufMut>(&mut self, mut buf: T) -> BufResult<usize, T> {
        loop {
            let got = {
                let mut conn = self.conn.borrow_mut();
                let mut reader = conn.reader();
                match reader.fill_buf() {
                    Ok(plain) => {
                        let n = plain.len().min(buf.bytes_total());
                        // SAFETY: `n` bytes fit in `buf`'s writable part, and
                        // rustls's buffer does not overlap it.
                        unsafe {
                            std::ptr::copy_nonoverlapping(plain.as_ptr(), buf.write_ptr(), n);
                            buf.set_init(n);
                        }
                        reader.consume(n);
                        Some(Ok(n))
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
                    Err(e) => Some(Err(e)),
                }
            };
            if let Some(res) = got {
                return (res, buf);
            }
            if let Err(e) = self.pull().await {
                return (Err(e), buf);
            }
        }
    }
}

/// The writing half of a TLS connection.
pub struct TlsWrite {
    tcp: OwnedWriteHalf<TcpStream>,
    conn: Rc<RefCell<ClientConnection>>,
    /// Ciphertext to write (`None` while a socket write holds it).
    out: Option<Vec<u8>>,
}

impl TlsWrite {
    /// Writes out everything rustls has queued (records, alerts,
    /// handshake messages).
    async fn flush_tls(&mut self) -> io::Result<()> {
        loop {
            let mut out = self.out.take().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "TLS connection written after a cancelled write",
                )
            })?;
            out.clear();
            {
                let mut conn = self.conn.borrow_mut();
                while conn.wants_write() {
                    if let Err(e) = conn.write_tls(&mut out) {
                        self.out = Some(out);
                        return Err(e);
                    }
                }
            }
            if out.is_empty() {
                self.out = Some(out);
                return Ok(());
            }
            let (res, out) = self.tcp.write_all(out).await;
            self.out = Some(out);
            res?;
        }
    }

    async fn write_all(&mut self, buf: Vec<u8>) -> BufResult<usize, Vec<u8>> {
        let res = self.conn.borrow_mut().writer().write_all(&buf);
        if let Err(e) = res {
            return (Err(e), buf);
        }
        match self.flush_tls().await {
            Ok(()) => (Ok(buf.len()), buf),
            Err(e) => (Err(e), buf),
        }
    }
}
