//! Hostile HTTP clients of `/metrics`, which usually listens where any host that Prometheus
//! runs on (or any host at all) can reach it: a declared request body the client never sends,
//! one of 100 GB, a request head without end, connections that never say anything. The host
//! process lives, every other scrape is answered, and threads stay bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use allocview_agent::agent::Agent;

/// How long a test waits for an answer before it counts as held up.
const WAIT: Duration = Duration::from_secs(20);

fn metrics_agent(dir: &std::path::Path) -> (Agent, SocketAddr) {
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir)
        .metrics("127.0.0.1:0".parse().unwrap())
        .spawn()
        .unwrap();
    let addr = agent.metrics_addr().unwrap();
    (agent, addr)
}

/// Sends `request` and reads the response's status line (or what the server said before it
/// closed); `None` when nothing came within [`WAIT`].
fn status_of(addr: SocketAddr, request: &[u8]) -> Option<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let _ = s.write_all(request);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    Some(text.lines().next().unwrap_or("").to_string())
}

fn scrape_status(addr: SocketAddr) -> Option<String> {
    status_of(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
}

#[test]
fn a_request_declaring_a_100_gb_body_is_refused_and_the_host_lives() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = metrics_agent(dir.path());
    let status = status_of(
        addr,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\nabc",
    )
    .expect("an answer");
    assert!(status.contains(" 413 "), "{status}");
    // Still serving (an abort would have taken this test's process with it).
    assert_eq!(scrape_status(addr).as_deref(), Some("HTTP/1.1 200 OK"));
    agent.shutdown();
}

#[test]
fn a_client_that_declares_a_body_and_never_sends_it_holds_up_no_other_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = metrics_agent(dir.path());
    let mut holder = TcpStream::connect(addr).unwrap();
    holder
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        scrape_status(addr).as_deref(),
        Some("HTTP/1.1 200 OK"),
        "a scrape waited on a client that never sent its body"
    );
    drop(holder);
    agent.shutdown();
}

#[test]
fn a_request_head_without_end_is_refused_at_its_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = metrics_agent(dir.path());
    let mut request = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    request.extend(std::iter::repeat_n(b'a', 1 << 20));
    let status = status_of(addr, &request).expect("an answer");
    assert!(status.contains(" 431 "), "{status}");
    assert_eq!(scrape_status(addr).as_deref(), Some("HTTP/1.1 200 OK"));
    agent.shutdown();
}

fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn silent_connections_cost_a_bounded_number_of_threads_and_scrapes_get_an_answer() {
    use allocview_agent::prometheus::MAX_CONNECTIONS;
    if !std::path::Path::new("/proc/self/status").exists() {
        println!("skipped: no /proc to count threads");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = metrics_agent(dir.path());
    let before = threads();
    let silent: Vec<TcpStream> = (0..4 * MAX_CONNECTIONS)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = threads();
    assert!(
        during <= before + MAX_CONNECTIONS + 2,
        "{before} threads before, {during} with {} silent connections",
        silent.len()
    );
    // A scrape over the cap is answered (503, try again), never left hanging.
    let deadline = Instant::now() + WAIT;
    let status = scrape_status(addr).expect("an answer");
    assert!(Instant::now() < deadline);
    assert!(
        status == "HTTP/1.1 200 OK" || status.contains(" 503 "),
        "{status}"
    );
    drop(silent);
    agent.shutdown();
}

#[test]
fn an_http_1_0_request_asking_for_keep_alive_is_answered_and_its_connection_closed() {
    // HTTP/1.0 keep-alive needs the answer to say `Connection: keep-alive`; without it a 1.0
    // client reads to the end of the connection, which stayed open for 10 s.
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = metrics_agent(dir.path());
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    // The answer says the connection closes (and it does: the read reached its end).
    assert!(text.contains("Connection: close\r\n"), "{text}");
    agent.shutdown();
}

#[test]
fn a_zero_metrics_write_timeout_still_serves_whole_pages() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .metrics("127.0.0.1:0".parse().unwrap())
        .metrics_write_timeout(Duration::ZERO)
        .spawn()
        .unwrap();
    let mut s = TcpStream::connect(agent.metrics_addr().unwrap()).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(len > 0);
    assert_eq!(body.len(), len, "a cut page");
    agent.shutdown();
}
