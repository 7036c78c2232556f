//! What to load: a parsed `--target` URL.
//!
//! Each scheme has its own driver (see `engine::Driver`); the engine, the
//! schedule, the measurement and the report are shared by all of them.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

/// A `--target`: the scheme picks the driver, the address is resolved once
/// up front so that a typo fails before any thread starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub scheme: Scheme,
    /// Over TLS: `frames+tls://`, `grpcs://`, `https://`.
    pub tls: bool,
    /// `HOST:PORT` as given (for the report, and the HTTP `Host` header).
    pub authority: String,
    /// The host of `authority` (an IPv6 address without its brackets): the
    /// name a TLS server is verified as unless `--tls-server-name`.
    pub host: String,
    pub addr: SocketAddr,
    /// `http://` only: the MCP endpoint's path, `/mcp` when none is given.
    /// Empty for the other schemes, which take no path.
    pub path: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Size-prefixed FlatBuffers `Request`/`Response` frames over TCP.
    Frames,
    /// `turbomcp.mcp.v1.McpService` over HTTP/2.
    Grpc,
    /// MCP Streamable HTTP (JSON-RPC over HTTP/1.1 POST, JSON or SSE
    /// answers): any MCP server, not only the broker.
    Http,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Frames => "frames",
            Scheme::Grpc => "grpc",
            Scheme::Http => "http",
        }
    }

    /// The scheme's name over TLS.
    pub fn tls_str(self) -> &'static str {
        match self {
            Scheme::Frames => "frames+tls",
            Scheme::Grpc => "grpcs",
            Scheme::Http => "https",
        }
    }
}

impl Target {
    /// The scheme as given: `frames`, `frames+tls`, `grpcs`, `https`, …
    pub fn scheme_str(&self) -> &'static str {
        if self.tls {
            self.scheme.tls_str()
        } else {
            self.scheme.as_str()
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme_str(), self.authority, self.path)
    }
}

impl Target {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (scheme, rest) = s.split_once("://").ok_or_else(|| {
            format!(
                "bad target `{s}`: expected frames://HOST:PORT, grpc://HOST:PORT or \
                 http://HOST:PORT/PATH (frames+tls://, grpcs://, https:// over TLS)"
            )
        })?;
        let (scheme, tls) = match scheme {
            "frames" => (Scheme::Frames, false),
            "frames+tls" => (Scheme::Frames, true),
            "grpc" => (Scheme::Grpc, false),
            "grpcs" => (Scheme::Grpc, true),
            "http" => (Scheme::Http, false),
            "https" => (Scheme::Http, true),
            other => {
                return Err(format!(
                    "bad target `{s}`: unknown scheme `{other}` (expected `frames`, `grpc` or \
                     `http`, or over TLS `frames+tls`, `grpcs` or `https`)"
                ));
            }
        };
        let (authority, path) = match scheme {
            Scheme::Http => {
                let (a, p) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                // No path at all is the MCP convention's `/mcp`; a path
                // given, `/` included, is the server's, as any HTTP client
                // takes it.
                let p = if p.is_empty() { "/mcp" } else { p };
                // The path goes into the request line as is: it must not be
                // able to break the request out of its line.
                if p.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'#') {
                    return Err(format!(
                        "bad target `{s}`: the path must be printable ASCII without spaces or `#`"
                    ));
                }
                (a, p)
            }
            _ => (rest.trim_end_matches('/'), ""),
        };
        if authority.is_empty() || authority.contains('/') {
            return Err(format!(
                "bad target `{s}`: expected {}://HOST:PORT with no path",
                if tls {
                    scheme.tls_str()
                } else {
                    scheme.as_str()
                }
            ));
        }
        let Some((host, port)) = authority.rsplit_once(':') else {
            return Err(format!("bad target `{s}`: missing `:PORT`"));
        };
        if host.is_empty() {
            return Err(format!("bad target `{s}`: missing host"));
        }
        if port.parse::<u16>().is_err() {
            return Err(format!("bad target `{s}`: `{port}` is not a port number"));
        }
        let addr = authority
            .to_socket_addrs()
            .map_err(|e| format!("bad target `{s}`: cannot resolve `{authority}`: {e}"))?
            .next()
            .ok_or_else(|| format!("bad target `{s}`: `{authority}` resolves to no address"))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        Ok(Self {
            scheme,
            tls,
            authority: authority.to_owned(),
            host: host.to_owned(),
            addr,
            path: path.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_frames_and_grpc() {
        let t = Target::parse("frames://127.0.0.1:7400").unwrap();
        assert_eq!(t.scheme, Scheme::Frames);
        assert_eq!(t.addr, "127.0.0.1:7400".parse().unwrap());
        assert_eq!(t.to_string(), "frames://127.0.0.1:7400");
        assert_eq!(
            Target::parse("grpc://[::1]:7401/").unwrap().scheme,
            Scheme::Grpc
        );
    }

    #[test]
    fn http_targets_keep_their_path_and_default_to_mcp() {
        let t = Target::parse("http://127.0.0.1:8000/mcp/v1?x=1").unwrap();
        assert_eq!(t.scheme, Scheme::Http);
        assert_eq!(t.authority, "127.0.0.1:8000");
        assert_eq!(t.path, "/mcp/v1?x=1");
        assert_eq!(t.to_string(), "http://127.0.0.1:8000/mcp/v1?x=1");
        assert_eq!(Target::parse("http://127.0.0.1:8000").unwrap().path, "/mcp");
        // A server mounted at the root is reachable as written.
        let t = Target::parse("http://localhost:8000/").unwrap();
        assert_eq!(t.path, "/");
        assert_eq!(t.to_string(), "http://localhost:8000/");
        assert_eq!(Target::parse("grpc://127.0.0.1:1").unwrap().path, "");
    }

    #[test]
    fn tls_schemes_pick_the_same_drivers_and_print_as_given() {
        let t = Target::parse("https://127.0.0.1:7403").unwrap();
        assert_eq!((t.scheme, t.tls), (Scheme::Http, true));
        assert_eq!(t.path, "/mcp");
        assert_eq!(t.host, "127.0.0.1");
        assert_eq!(t.to_string(), "https://127.0.0.1:7403/mcp");
        let t = Target::parse("frames+tls://localhost:7400").unwrap();
        assert_eq!((t.scheme, t.tls), (Scheme::Frames, true));
        assert_eq!(t.host, "localhost");
        assert_eq!(t.to_string(), "frames+tls://localhost:7400");
        let t = Target::parse("grpcs://[::1]:7401").unwrap();
        assert_eq!((t.scheme, t.tls), (Scheme::Grpc, true));
        assert_eq!(t.host, "::1");
        assert_eq!(t.to_string(), "grpcs://[::1]:7401");
        let t = Target::parse("frames://127.0.0.1:7400").unwrap();
        assert!(!t.tls);
        assert_eq!(t.scheme_str(), "frames");
    }

    #[test]
    fn bad_targets_say_what_is_wrong() {
        for (t, needle) in [
            ("127.0.0.1:7400", "expected frames://"),
            ("tcp://127.0.0.1:7400", "unknown scheme `tcp`"),
            ("https://127.0.0.1:7400/a b", "printable ASCII"),
            ("grpcs://127.0.0.1:7401/x", "grpcs://HOST:PORT with no path"),
            ("frames+tls://127.0.0.1", "missing `:PORT`"),
            ("tls://127.0.0.1:7400", "unknown scheme `tls`"),
            ("http://127.0.0.1:7400/a b", "printable ASCII"),
            ("http://127.0.0.1/mcp", "missing `:PORT`"),
            ("frames://127.0.0.1", "missing `:PORT`"),
            ("frames://127.0.0.1:99999", "not a port number"),
            ("frames://:7400", "missing host"),
            ("frames://127.0.0.1:7400/x", "no path"),
        ] {
            let e = Target::parse(t).unwrap_err();
            assert!(e.contains(needle), "{t}: {e}");
        }
    }
}
