//! The `/metrics` listener: as much HTTP/1.1 (RFC 9112) as a scrape needs, and no more.
//!
//! A scrape is a `GET` (or `HEAD`) without a body, so the server reads request heads only:
//! the request line and headers, at most [`MAX_HEAD_BYTES`], within [`REQUEST_TIMEOUT`] in
//! all (a client trickling its head byte by byte runs out of time as one that sends nothing);
//! a request that declares a body (`Content-Length` above 0, or `Transfer-Encoding`) is
//! answered `413` and its connection closed, its body never read. Each connection has a
//! thread of its own, at most [`MAX_CONNECTIONS`] at once; one over that is answered `503`
//! at once and closed. Responses always carry `Content-Length` (never chunked), and
//! connections are kept alive between requests (HTTP/1.1's default) until the client closes,
//! asks to, or says nothing for [`REQUEST_TIMEOUT`].
//!
//! Why not an HTTP library: `tiny_http` 0.12, used before, drains an unread body on a buffer
//! of the declared length (one request declaring 100 GB aborted the process on a failed
//! allocation), drains it on the thread that answers every scrape (a client declaring a body
//! it never sent held up all scrapes), and reads connections on threads without bound or
//! timeout. Every thread here is an agent thread (`crate::agent_thread`): what it allocates
//! is counted by an instrumented heap but never published, so a scrape does not show in the
//! figures it reads.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::agent_thread;
use crate::server::{Conn, ReadBefore, Slot};

/// Connections served at once, at most; one over that is answered `503` and closed.
pub const MAX_CONNECTIONS: usize = 32;

/// Largest request head (request line and headers) read; a longer one is answered `431`.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// How long a client has for a whole request head, counted from when the server starts
/// waiting for it (its connection's start, or the end of its previous response).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the accept thread may spend telling a connection over [`MAX_CONNECTIONS`] why it
/// is refused (a fresh connection's send buffer takes the few bytes at once).
const REFUSE_WRITE_TIMEOUT: Duration = Duration::from_millis(100);

/// How long the accept loop waits after a failed `accept` (out of descriptors, say).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Bytes of a response body written at once, the deadline checked between them.
const WRITE_PIECE: usize = 64 * 1024;

/// A request head as far as `/metrics` cares.
#[derive(Debug)]
pub(crate) struct Request {
    /// The method, as sent (`GET`).
    pub method: String,
    /// The request target (`/metrics?x=1`).
    pub target: String,
    /// The `Accept` header, when sent.
    pub accept: Option<String>,
    /// Whether the connection closes after the response.
    close: bool,
}

/// A response: status, reason, extra headers and body.
pub(crate) struct Response {
    /// The status code.
    pub status: u16,
    /// Headers besides `Content-Length` and `Connection`.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A `text/plain` response of `status` with `text` for body.
    pub(crate) fn text(status: u16, text: impl Into<String>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", "text/plain; charset=utf-8".into())],
            body: text.into().into_bytes(),
        }
    }
}

/// The standard reason phrase of the statuses this server sends.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

/// What reading a request head gave.
enum Head {
    Request(Request),
    /// The client closed (or went silent) between requests.
    Closed,
    /// A request to refuse with this response, then close.
    Refused(Response),
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// Reads one request head (see the module docs).
fn read_head(r: &mut BufReader<ReadBefore<'_>>) -> Head {
    let mut lines: Vec<String> = Vec::new();
    let mut read = 0usize;
    loop {
        let mut line = Vec::new();
        let cap = (MAX_HEAD_BYTES - read) as u64;
        match r.by_ref().take(cap).read_until(b'\n', &mut line) {
            Ok(0) if lines.is_empty() && line.is_empty() => return Head::Closed,
            Ok(_) => {}
            Err(e) if is_timeout(&e) && lines.is_empty() && line.is_empty() => {
                return Head::Closed;
            }
            Err(e) if is_timeout(&e) => {
                return Head::Refused(Response::text(
                    408,
                    format!(
                        "request head not received within {} s\n",
                        REQUEST_TIMEOUT.as_secs()
                    ),
                ));
            }
            Err(_) => return Head::Closed,
        }
        read += line.len();
        if !line.ends_with(b"\n") {
            if read >= MAX_HEAD_BYTES {
                return Head::Refused(Response::text(
                    431,
                    format!("request head over {MAX_HEAD_BYTES} bytes\n"),
                ));
            }
            // The client closed in the middle of a head.
            return Head::Closed;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\r', '\n']);
        if text.is_empty() {
            if lines.is_empty() {
                // RFC 9112 2.2: empty lines before a request line are ignored.
                continue;
            }
            return parse_head(&lines);
        }
        lines.push(text.to_string());
    }
}

/// A request from its head's lines (request line first).
fn parse_head(lines: &[String]) -> Head {
    let bad = |why: &str| Head::Refused(Response::text(400, format!("bad request: {why}\n")));
    let mut parts = lines[0].split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return bad("the request line is not METHOD TARGET HTTP/1.1");
    };
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        v if v.starts_with("HTTP/") => {
            return Head::Refused(Response::text(505, format!("{v} is not served\n")));
        }
        _ => return bad("the request line is not METHOD TARGET HTTP/1.1"),
    };
    let mut req = Request {
        method: method.to_string(),
        target: target.to_string(),
        accept: None,
        close: http10,
    };
    for line in &lines[1..] {
        let Some((name, value)) = line.split_once(':') else {
            return bad("a header line without a colon");
        };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => match value.parse::<u64>() {
                Ok(0) => {}
                Ok(_) => return body_refused(),
                Err(_) => return bad("Content-Length is not a number"),
            },
            "transfer-encoding" => return body_refused(),
            "accept" => req.accept = Some(value.to_string()),
            "connection" => {
                for token in value.split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        req.close = true;
                    } else if token.eq_ignore_ascii_case("keep-alive") && !http10 {
                        // HTTP/1.0's keep-alive would need the answer to say it back; an
                        // HTTP/1.0 request is answered and its connection closed.
                        req.close = false;
                    }
                }
            }
            _ => {}
        }
    }
    Head::Request(req)
}

fn body_refused() -> Head {
    Head::Refused(Response::text(
        413,
        "request bodies are not accepted: /metrics answers GET and HEAD\n",
    ))
}

/// Writes `resp` (its head only for `HEAD`); the body in pieces, failing once `deadline`
/// has passed (the page then ends short of its `Content-Length`: a failed scrape, never a
/// cut page passing for a whole one).
fn write_response(
    w: &mut TcpStream,
    resp: &Response,
    head_only: bool,
    close: bool,
    deadline: Instant,
) -> io::Result<()> {
    use std::fmt::Write as _;
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Length: {}\r\n",
        resp.status,
        reason(resp.status),
        resp.body.len()
    );
    for (name, value) in &resp.headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    if !head_only {
        let mut body = super::DeadlineBody {
            rest: &resp.body,
            deadline,
        };
        let mut piece = vec![0u8; WRITE_PIECE.min(resp.body.len()).max(1)];
        loop {
            let n = body.read(&mut piece)?;
            if n == 0 {
                break;
            }
            w.write_all(&piece[..n])?;
        }
    }
    w.flush()
}

/// What the server answers a request with.
pub(crate) type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// One connection: requests until the client closes, asks to, falls silent or errs.
fn serve_connection(
    stream: TcpStream,
    handler: &Handler,
    write_timeout: Duration,
    response_deadline: Duration,
) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let _ = out.set_write_timeout(Some(write_timeout));
    let mut conn = Conn::Tcp(stream);
    let mut input = BufReader::new(ReadBefore::new(&mut conn, REQUEST_TIMEOUT));
    loop {
        input.get_mut().restart(REQUEST_TIMEOUT);
        let (resp, head_only, close) = match read_head(&mut input) {
            Head::Closed => break,
            Head::Refused(resp) => (resp, false, true),
            Head::Request(req) => (handler(&req), req.method == "HEAD", req.close),
        };
        let written = write_response(
            &mut out,
            &resp,
            head_only,
            close,
            Instant::now() + response_deadline,
        );
        if let Err(e) = written {
            tracing::debug!(error = %e, "metrics client went away");
            break;
        }
        if close {
            break;
        }
    }
    let _ = out.shutdown(Shutdown::Both);
}

/// The connections being served, to close them at [`HttpServer::stop`].
type Connections = Arc<Mutex<Vec<(TcpStream, JoinHandle<()>)>>>;

/// A running listener (see the module docs).
pub(crate) struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    connections: Connections,
}

impl HttpServer {
    /// Serves `listener` with `handler` on a thread named `name` (and its connections on
    /// threads named after it); a response not read for `write_timeout`, or not read whole
    /// within `response_deadline`, is abandoned.
    pub(crate) fn start(
        listener: TcpListener,
        name: &str,
        handler: Arc<Handler>,
        write_timeout: Duration,
        response_deadline: Duration,
    ) -> io::Result<HttpServer> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let connections: Connections = Arc::default();
        let accept = {
            let (stop, connections) = (stop.clone(), connections.clone());
            let conn_name = format!("{name}-conn");
            agent_thread::spawn(name, move || {
                let active = Arc::new(AtomicUsize::new(0));
                for conn in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let stream = match conn {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(error = %e, "metrics accept failed");
                            std::thread::sleep(ACCEPT_RETRY);
                            continue;
                        }
                    };
                    accept_one(
                        stream,
                        &active,
                        &connections,
                        &conn_name,
                        &handler,
                        write_timeout,
                        response_deadline,
                    );
                }
            })?
        };
        Ok(HttpServer {
            addr,
            stop,
            accept: Some(accept),
            connections,
        })
    }

    /// Stops accepting, closes every connection and joins the threads.
    pub(crate) fn stop(&mut self) {
        if self.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the blocking accept with a connection of our own.
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let conns =
            std::mem::take(&mut *self.connections.lock().unwrap_or_else(|p| p.into_inner()));
        for (s, _) in &conns {
            let _ = s.shutdown(Shutdown::Both);
        }
        for (_, h) in conns {
            let _ = h.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves one accepted connection on a thread of its own, or refuses it over the cap.
fn accept_one(
    stream: TcpStream,
    active: &Arc<AtomicUsize>,
    connections: &Connections,
    name: &str,
    handler: &Arc<Handler>,
    write_timeout: Duration,
    response_deadline: Duration,
) {
    let Some(slot) = Slot::enter(active, MAX_CONNECTIONS) else {
        let mut s = stream;
        let _ = s.set_write_timeout(Some(REFUSE_WRITE_TIMEOUT));
        let resp = Response::text(
            503,
            format!("too many connections ({MAX_CONNECTIONS}): try again later\n"),
        );
        let _ = write_response(
            &mut s,
            &resp,
            false,
            true,
            Instant::now() + REFUSE_WRITE_TIMEOUT,
        );
        let _ = s.shutdown(Shutdown::Both);
        return;
    };
    let Ok(handle) = stream.try_clone() else {
        return;
    };
    let handler = handler.clone();
    // The slot goes with the thread (or with the closure, when it cannot start): given back
    // however the connection ends, a panic included.
    let spawned = agent_thread::spawn(name, move || {
        let _slot = slot;
        serve_connection(stream, &*handler, write_timeout, response_deadline);
    });
    let mut list = connections.lock().unwrap_or_else(|p| p.into_inner());
    list.retain(|(_, h)| !h.is_finished());
    match spawned {
        Ok(h) => list.push((handle, h)),
        Err(e) => tracing::warn!(error = %e, "cannot start a metrics connection thread"),
    }
}
