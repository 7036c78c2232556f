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
    /// `HOST:PORT` as given (for the report).
    pub authority: String,
    pub addr: SocketAddr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Size-prefixed FlatBuffers `Request`/`Response` frames over TCP.
    Frames,
    /// `turbomcp.mcp.v1.McpService` over HTTP/2.
    Grpc,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Frames => "frames",
            Scheme::Grpc => "grpc",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.authority)
    }
}

impl Target {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (scheme, rest) = s.split_once("://").ok_or_else(|| {
            format!("bad target `{s}`: expected frames://HOST:PORT or grpc://HOST:PORT")
        })?;
        let scheme = match scheme {
            "frames" => Scheme::Frames,
            "grpc" => Scheme::Grpc,
            other => {
                return Err(format!(
                    "bad target `{s}`: unknown scheme `{other}` (expected `frames` or `grpc`)"
                ));
            }
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(format!(
                "bad target `{s}`: expected {}://HOST:PORT with no path",
                scheme.as_str()
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
        Ok(Self {
            scheme,
            authority: authority.to_owned(),
            addr,
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
    fn bad_targets_say_what_is_wrong() {
        for (t, needle) in [
            ("127.0.0.1:7400", "expected frames://"),
            ("http://127.0.0.1:7400", "unknown scheme `http`"),
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
