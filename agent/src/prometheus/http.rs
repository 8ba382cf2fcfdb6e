//! [`HttpServer`]: the minimal HTTP/1.1 server `/metrics` needs, on one agent thread.
//!
//! Why not an HTTP library: the agent's threads run inside
//! [`unpublished`](allocview_alloc::global::unpublished) (see [`crate::agent_thread`]) so that
//! their heap traffic is not published as the process's, and `tiny_http` (the library this
//! replaced) reads and parses requests on threads it starts itself, which cannot be marked: every
//! scrape published its allocations as host events. Here one thread started by
//! [`agent_thread::spawn`](crate::agent_thread::spawn) accepts, reads, answers and closes each
//! connection in turn, so a scrape publishes nothing.
//!
//! What it speaks (RFC 9112, the part a scraper uses): a request line `METHOD TARGET
//! HTTP/1.x` and header fields up to a blank line, at most [`MAX_REQUEST_HEAD`] bytes, read
//! within [`REQUEST_TIMEOUT`]; a body announced by `Content-Length` is read and dropped (up to
//! [`MAX_DISCARDED_BODY`]) so that closing the connection does not reset it before the client
//! reads the answer. Every response carries `Content-Length` and `Connection: close`; a `HEAD`
//! response has the `GET` headers and no body. A malformed request gets `400 Bad Request`, an
//! oversize head `431 Request Header Fields Too Large`; a client that stays silent is dropped
//! after [`REQUEST_TIMEOUT`]. Connections are served one at a time: a silent one holds the next
//! scrape back by [`REQUEST_TIMEOUT`] at most, well within Prometheus's default scrape timeout
//! (10 s).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest request line and header fields read (a scraper's are a few hundred bytes).
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// Largest request body read and dropped before answering; a larger one is not read (the
/// connection is answered and closed regardless).
pub const MAX_DISCARDED_BODY: usize = 64 * 1024;

/// How long a client has to send its whole request (head and announced body).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How long writing the response may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 1024;

/// A request's method and target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// `GET`, `HEAD`, `POST`, ... as sent (methods are case-sensitive).
    pub method: String,
    /// The request target, e.g. `/metrics?x=1`.
    pub target: String,
}

impl Request {
    /// The target's path, without its query.
    pub(crate) fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// A response: status, extra header fields and body (sent without the body for `HEAD`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Response {
    /// Status code.
    pub status: u16,
    /// Header fields besides `Content-Length` and `Connection`.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: String,
}

impl Response {
    /// A `text/plain` response.
    pub(crate) fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", "text/plain; charset=utf-8".into())],
            body: body.into(),
        }
    }

    /// The response as bytes, without the body for a `HEAD` request.
    fn encode(&self, head_only: bool) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (name, value) in &self.headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        if !head_only {
            out.push_str(&self.body);
        }
        out.into_bytes()
    }
}

/// The reason phrase of the status codes this server sends.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Why a request could not be read.
#[derive(Debug)]
enum ReadError {
    /// Not HTTP/1.x: answered with 400.
    Malformed(&'static str),
    /// The head exceeds [`MAX_REQUEST_HEAD`]: answered with 431.
    TooLarge,
    /// The connection closed or timed out: nothing to answer.
    Gone,
}

/// A running server; dropping it (or [`stop`](Self::stop)) stops it and joins its thread.
pub(crate) struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `addr` and serves every request with `handle` on one agent thread named `name`.
    ///
    /// # Errors
    /// The address cannot be bound, or the thread cannot start.
    pub(crate) fn start(
        addr: SocketAddr,
        name: &str,
        handle: impl Fn(&Request) -> Response + Send + 'static,
    ) -> io::Result<HttpServer> {
        let listener = TcpListener::bind(addr)?;
        let bound = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = crate::agent_thread::spawn(name, move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::Acquire) {
                    return;
                }
                match conn {
                    Ok(c) => serve(c, &handle),
                    Err(e) => tracing::debug!(error = %e, "metrics accept failed"),
                }
            }
        })?;
        Ok(HttpServer {
            addr: bound,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (a port of 0 resolved to the real one).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and joins the thread (after the connection being served, if any).
    pub(crate) fn stop(&mut self) {
        if self.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the blocking accept with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, REQUEST_TIMEOUT);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads one request from `conn`, answers it and closes the connection.
fn serve(mut conn: TcpStream, handle: &impl Fn(&Request) -> Response) {
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut unread = false;
    let (response, head_only) = match read_request(&mut conn) {
        Ok(req) => (handle(&req), req.method == "HEAD"),
        Err(ReadError::Malformed(why)) => {
            (Response::text(400, format!("bad request: {why}\n")), false)
        }
        Err(ReadError::TooLarge) => {
            unread = true;
            (
                Response::text(431, format!("request head over {MAX_REQUEST_HEAD} bytes\n")),
                false,
            )
        }
        Err(ReadError::Gone) => return,
    };
    if let Err(e) = conn
        .write_all(&response.encode(head_only))
        .and_then(|()| conn.flush())
    {
        tracing::debug!(error = %e, "metrics client went away");
    }
    let _ = conn.shutdown(Shutdown::Write);
    if unread {
        // The rest of an oversize head: read and dropped (a bounded amount, for a bounded
        // time) until the client closes, so that closing does not reset the connection
        // before the client has read the 431.
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let (mut rest, mut dropped) = (Vec::new(), 0);
        while dropped < MAX_DISCARDED_BODY {
            rest.clear();
            match read_some(&mut conn, &mut rest, deadline) {
                Ok(n) if n > 0 => dropped += n,
                _ => break,
            }
        }
    }
}

/// Reads the request head (and drops an announced body), within [`REQUEST_TIMEOUT`].
fn read_request(conn: &mut TcpStream) -> Result<Request, ReadError> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let head_end = loop {
        if let Some(end) = find_head_end(&buf) {
            break end;
        }
        if buf.len() >= MAX_REQUEST_HEAD {
            return Err(ReadError::TooLarge);
        }
        if read_some(conn, &mut buf, deadline)? == 0 {
            return Err(if buf.is_empty() {
                ReadError::Gone
            } else {
                ReadError::Malformed("the request ends inside its head")
            });
        }
    };
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| ReadError::Malformed("the request head is not text"))?;
    let (request, body_len) = parse_head(head)?;
    // Read (and drop) an announced body, so that closing does not reset the connection
    // before the client has read the response.
    if body_len <= MAX_DISCARDED_BODY {
        let mut have = buf.len() - head_end;
        while have < body_len {
            match read_some(conn, &mut buf, deadline) {
                Ok(0) | Err(_) => break,
                Ok(n) => have += n,
            }
        }
    }
    Ok(request)
}

/// Reads what is there (up to [`READ_CHUNK`] bytes) onto `buf`, waiting at most until
/// `deadline`; the count read, 0 at the end of the stream.
fn read_some(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<usize, ReadError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ReadError::Gone);
    }
    conn.set_read_timeout(Some(left))
        .map_err(|_| ReadError::Gone)?;
    let mut chunk = [0u8; READ_CHUNK];
    loop {
        match conn.read(&mut chunk) {
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(ReadError::Gone),
        }
    }
}

/// Where the head ends (after its blank line: CRLF CRLF, or bare LF LF as RFC 9112 allows
/// recipients to accept).
fn find_head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The request line and the body's announced length (0 without `Content-Length`).
fn parse_head(head: &str) -> Result<(Request, usize), ReadError> {
    let mut lines = head.lines();
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Malformed("expected METHOD TARGET HTTP/1.1"));
    };
    if method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_alphabetic())
        || !target.starts_with('/')
        || !version.starts_with("HTTP/1.")
    {
        return Err(ReadError::Malformed("expected METHOD TARGET HTTP/1.1"));
    }
    let mut body_len = 0;
    for field in lines.take_while(|l| !l.is_empty()) {
        let Some((name, value)) = field.split_once(':') else {
            return Err(ReadError::Malformed("a header field without ':'"));
        };
        if name.trim().eq_ignore_ascii_case("content-length") {
            body_len = value
                .trim()
                .parse()
                .map_err(|_| ReadError::Malformed("Content-Length is not a number"))?;
        }
    }
    Ok((
        Request {
            method: method.to_string(),
            target: target.to_string(),
        },
        body_len,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_head_gives_its_method_path_and_body_length() {
        let (r, len) =
            parse_head("POST /metrics?x=1 HTTP/1.1\r\nHost: x\r\ncontent-length: 12\r\n\r\n")
                .unwrap();
        assert_eq!((r.method.as_str(), r.path(), len), ("POST", "/metrics", 12));
        let (r, len) = parse_head("GET / HTTP/1.0\n\n").unwrap();
        assert_eq!((r.method.as_str(), r.path(), len), ("GET", "/", 0));
    }

    #[test]
    fn malformed_heads_are_refused_with_a_reason() {
        for bad in [
            "GET\r\n\r\n",
            "GET /metrics\r\n\r\n",
            "GET /metrics HTTP/2\r\n\r\n",
            "GET metrics HTTP/1.1\r\n\r\n",
            "GET /metrics HTTP/1.1 extra\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nContent-Length: lots\r\n\r\n",
        ] {
            assert!(
                matches!(parse_head(bad), Err(ReadError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_head_ends_at_the_first_blank_line() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\n\nbody"), Some(16));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }

    #[test]
    fn a_head_response_has_the_get_headers_without_the_body() {
        let r = Response::text(200, "abc");
        let get = String::from_utf8(r.encode(false)).unwrap();
        let head = String::from_utf8(r.encode(true)).unwrap();
        assert!(get.starts_with("HTTP/1.1 200 OK\r\n"), "{get}");
        assert!(get.contains("Content-Length: 3\r\n") && get.ends_with("\r\n\r\nabc"));
        assert_eq!(head, get.trim_end_matches("abc"));
    }
}
