//! `/metrics` over real HTTP, parsed by a Prometheus text-format parser.

#[path = "support/raw_client.rs"]
mod raw_client;
#[path = "support/toy.rs"]
mod toy;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use allocview_agent::agent::{Agent, AgentError};
use allocview_agent::prometheus::Format;
use allocview_agent::protocol::{self, ClientFrame, MAX_SERVER_FRAME, ServerFrame};
use allocview_agent::server::{MAX_AWAITING_HELLO, RefusalReason};
use allocview_alloc::event::{Event, EventAction, EventPool};
use raw_client::{WAIT, raw_hello, send_hello};

fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    request(addr, "GET", path)
}

fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    let resp = exchange(
        addr,
        &format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    );
    let status = resp.split(' ').nth(1).unwrap().parse().unwrap();
    let body = resp.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

/// Sends `request` (a whole HTTP request) and reads the whole response.
fn exchange(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp
}

#[test]
fn metrics_parse_as_prometheus_text_and_match_the_state() {
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let toy = toy::Toy::new();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .metrics("127.0.0.1:0".parse().unwrap())
        .provider(toy.clone())
        .spawn()
        .unwrap();
    toy.set_sink(agent.sink());
    for i in 0..50usize {
        toy.malloc((i % 2) as u64);
    }
    for i in 0..20usize {
        toy.free_nth(i);
    }
    agent.flush();
    let addr = agent.metrics_addr().unwrap();
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
    // Every sample line parsed (the parser gathers a histogram's `_bucket` lines into one
    // sample per label set).
    let lines: Vec<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    let bucket_sets: std::collections::BTreeSet<String> = lines
        .iter()
        .filter(|l| l.contains("_bucket{"))
        .map(|l| {
            let (name, rest) = l.split_once('{').unwrap();
            let labels = rest.split("le=").next().unwrap();
            format!("{name}{labels}")
        })
        .collect();
    let sample_lines = lines.iter().filter(|l| !l.contains("_bucket{")).count() + bucket_sets.len();
    if scrape.samples.len() != sample_lines {
        for l in body.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            if !scrape.samples.iter().any(|s| s.metric == name) {
                eprintln!("unparsed: {l}");
            }
        }
    }
    assert_eq!(scrape.samples.len(), sample_lines);
    let find = |metric: &str, labels: &[(&str, &str)]| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .unwrap_or_else(|| panic!("no {metric} {labels:?} in\n{body}"));
        match s.value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Counter(v) => v,
            // The parser gathers a histogram's buckets but leaves its `_sum` and `_count`
            // untyped.
            prometheus_parse::Value::Untyped(v)
                if metric.ends_with("_sum") || metric.ends_with("_count") =>
            {
                v
            }
            ref other => panic!("unexpected {other:?}"),
        }
    };
    let stats = toy.stats();
    let m = stats.memory_stats();
    assert_eq!(
        find(
            "allocview_allocated_bytes",
            &[("device", "0"), ("pool", "all")]
        ),
        m["allocated_bytes.all.current"] as f64
    );
    assert_eq!(
        find(
            "allocview_reserved_peak_bytes",
            &[("device", "0"), ("pool", "large_pool")]
        ),
        m["reserved_bytes.large_pool.peak"] as f64
    );
    assert_eq!(
        find(
            "allocview_allocation_allocated_total",
            &[("device", "0"), ("pool", "all")]
        ),
        50.0
    );
    assert_eq!(
        find("allocview_device_allocs_total", &[("device", "0")]),
        m["num_device_alloc"] as f64
    );
    assert_eq!(
        find("allocview_events_ingested_total", &[]),
        agent.state().pipeline.events_ingested as f64
    );
    assert_eq!(
        find("allocview_events_dropped_total", &[("action", "alloc")]),
        0.0
    );
    assert_eq!(find("allocview_resyncs_total", &[]), 0.0);
    assert_eq!(
        find(
            "allocview_allocation_size_bytes_count",
            &[("device", "0"), ("pool", "large_pool")]
        ),
        50.0
    );
    let p50 = find(
        "allocview_allocation_size_quantile_bytes",
        &[("device", "0"), ("pool", "large_pool"), ("q", "0.5")],
    );
    let requested = toy::TOY_SEGMENT / 2 - 100;
    let half = requested as f64;
    assert!((p50 - half).abs() / half < 0.01, "p50 {p50} ~ {half}");
    // The sizes as a Prometheus histogram: the exact sum, and the fixed ladder of cumulative
    // power-of-two buckets `le = 2^b - 1`, from 511 (everything below 512 B) to 1 TiB - 1,
    // then +Inf.
    assert_eq!(
        find(
            "allocview_allocation_size_bytes_sum",
            &[("device", "0"), ("pool", "large_pool")]
        ),
        (50 * requested) as f64
    );
    let sizes = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "allocview_allocation_size_bytes"
                && s.labels.get("pool") == Some("large_pool")
        })
        .unwrap_or_else(|| panic!("no size histogram in\n{body}"));
    let prometheus_parse::Value::Histogram(buckets) = &sizes.value else {
        panic!("not a histogram: {sizes:?}");
    };
    let holding = u64::BITS - requested.leading_zeros();
    let expected: Vec<(f64, f64)> = (9..=40)
        .map(|b| {
            let le = ((1u64 << b) - 1) as f64;
            (le, if b >= holding { 50.0 } else { 0.0 })
        })
        .chain([(f64::INFINITY, 50.0)])
        .collect();
    let got: Vec<(f64, f64)> = buckets.iter().map(|b| (b.less_than, b.count)).collect();
    assert_eq!(got, expected);
    // Every series of a histogram metric has the metric's fixed buckets, whatever values it
    // holds, so that sums over pools, devices and processes add like to like.
    // Seconds are nanoseconds divided by 1e9, which rounds correctly (no `5.110000000000001e-7`).
    for (metric, first, last, per_unit) in [
        ("allocview_allocation_size_bytes", 9, 40, 1.0),
        ("allocview_block_lifetime_seconds", 10, 45, 1e9),
        ("allocview_allocator_latency_seconds", 5, 27, 1e9),
    ] {
        let ladder: Vec<f64> = (first..=last)
            .map(|b| ((1u64 << b) - 1) as f64 / per_unit)
            .chain([f64::INFINITY])
            .collect();
        let mut series = 0;
        for s in scrape.samples.iter().filter(|s| s.metric == metric) {
            let prometheus_parse::Value::Histogram(b) = &s.value else {
                panic!("{metric} is not a histogram: {s:?}");
            };
            let got: Vec<f64> = b.iter().map(|b| b.less_than).collect();
            assert_eq!(got, ladder, "{metric} {:?}", s.labels);
            series += 1;
        }
        assert!(series > 0, "no {metric} in\n{body}");
    }
    // Lifetimes, in seconds: one per free, and their sum below the test's running time.
    assert_eq!(
        find(
            "allocview_block_lifetime_seconds_count",
            &[("device", "0"), ("pool", "large_pool")]
        ),
        20.0
    );
    let lifetimes = find(
        "allocview_block_lifetime_seconds_sum",
        &[("device", "0"), ("pool", "large_pool")],
    );
    assert!(
        lifetimes > 0.0 && lifetimes < 20.0 * started.elapsed().as_secs_f64(),
        "{lifetimes}"
    );
    assert_eq!(
        find("allocview_device_total_memory_bytes", &[("device", "0")]),
        (80u64 << 30) as f64
    );

    // One vocabulary of pools across every family: the stat arrays' keys.
    let pools: std::collections::BTreeSet<&str> = scrape
        .samples
        .iter()
        .filter_map(|s| s.labels.get("pool"))
        .collect();
    assert_eq!(
        pools.into_iter().collect::<Vec<_>>(),
        ["all", "large_pool", "small_pool"]
    );

    // A scrape copies only what it shows (not the segment map, timeline or recent events),
    // and loses none of it: the body is the text the whole state renders to, families and
    // label sets in the same order every time.
    let state = agent.state();
    assert!(!state.devices[0].segments.is_empty());
    assert_eq!(
        get(addr, "/metrics").1,
        allocview_agent::prometheus::render_as(&state, Format::Text)
    );

    // Bucket bounds read as written, without float noise (`5.110000000000001e-7`): no more
    // significant digits than the integer (`2^b - 1`, at most 14 digits) they come from.
    let page = get(addr, "/metrics").1;
    for le in page
        .split("le=\"")
        .skip(1)
        .filter_map(|r| r.split('"').next())
    {
        let mantissa: String = le
            .split(['e', 'E'])
            .next()
            .unwrap_or("")
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        let digits = mantissa.trim_start_matches('0').trim_end_matches('0');
        assert!(digits.len() <= 14, "le=\"{le}\" carries float noise");
    }

    // HEAD, as uptime checkers send it: GET's status without the page.
    assert_eq!(request(addr, "HEAD", "/metrics"), (200, String::new()));

    let (status, _) = get(addr, "/other");
    assert_eq!(status, 404);
    agent.shutdown();
}

#[test]
fn dropped_events_show_per_action_in_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let agent = toy::quiet_agent(dir.path(), 2)
        .metrics("127.0.0.1:0".parse().unwrap())
        .spawn()
        .unwrap();
    for i in 0..50u64 {
        agent.sink().publish(&Event::new(
            EventAction::SegmentAlloc,
            0,
            EventPool::Large,
            0x1000_0000 + i * (2 << 20),
            2 << 20,
        ));
    }
    agent.flush();
    let dropped = agent.state().pipeline.dropped_total;
    let (_, body) = get(agent.metrics_addr().unwrap(), "/metrics");
    let line = format!("allocview_events_dropped_total{{action=\"segment_alloc\"}} {dropped}");
    assert!(body.contains(&line), "{line} in\n{body}");
    // The actions that dropped nothing are there too, at 0: an alert pinned to one does not
    // see its series appear only after the first drop.
    for action in ["alloc", "free", "oom", "segment_free"] {
        let zero = format!("allocview_events_dropped_total{{action=\"{action}\"}} 0");
        assert!(body.lines().any(|l| l == zero), "{zero} in\n{body}");
    }
    // Help texts carry no double quote, which OpenMetrics requires escaped there.
    for help in body.lines().filter(|l| l.starts_with("# HELP ")) {
        assert!(!help.contains('"'), "{help}");
    }
}

#[test]
fn metrics_at_a_host_name_serves_and_a_bad_one_is_refused_at_spawn() {
    let agent = Agent::builder()
        .no_listen()
        .metrics_at("localhost:0")
        .spawn()
        .unwrap();
    let addr = agent.metrics_addr().expect("metrics listener");
    assert!(addr.ip().is_loopback(), "{addr}");
    agent.shutdown();

    let err = Agent::builder()
        .no_listen()
        .metrics_at("localhost:soon")
        .spawn()
        .unwrap_err();
    assert!(matches!(err, AgentError::BadMetricsAddress { .. }), "{err}");
    assert!(
        err.to_string().contains("\"soon\" is not a number"),
        "{err}"
    );
}

#[test]
fn a_post_to_metrics_is_405_with_an_allow_header() {
    let agent = Agent::builder()
        .no_listen()
        .metrics("127.0.0.1:0".parse().unwrap())
        .spawn()
        .unwrap();
    let addr = agent.metrics_addr().unwrap();
    let resp = exchange(
        addr,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    let (head, _) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case("allow: GET, HEAD")),
        "{head}"
    );
    assert_eq!(get(addr, "/nothing").0, 404);
    agent.shutdown();
}

/// Reads the fatal error frame a refused connection gets; its message.
fn refusal(s: &mut std::os::unix::net::UnixStream) -> String {
    match protocol::read_frame::<_, ServerFrame>(s, MAX_SERVER_FRAME).unwrap() {
        ServerFrame::Error { message, fatal } => {
            assert!(fatal, "{message}");
            message
        }
        other => panic!("expected an error frame, got {other:?}"),
    }
}

/// Connects and reads the agent's hello once the agent has let go of connections that just
/// closed while waiting for their hello (it notices each close on its own thread): a
/// connection refused meanwhile for the hello cap is tried again. The stream, and how many
/// were refused so.
fn hello_once_slots_free(sock: &std::path::Path) -> (std::os::unix::net::UnixStream, u64) {
    let deadline = std::time::Instant::now() + WAIT;
    let mut refused = 0;
    loop {
        let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        match protocol::read_frame::<_, ServerFrame>(&mut s, MAX_SERVER_FRAME).unwrap() {
            ServerFrame::Hello { .. } => return (s, refused),
            ServerFrame::Error { message, .. } if message.contains("waiting for their hello") => {
                refused += 1;
                assert!(std::time::Instant::now() < deadline, "{message}");
                std::thread::sleep(Duration::from_millis(10));
            }
            other => panic!("expected a hello, got {other:?}"),
        }
    }
}

#[test]
fn refused_attach_clients_are_counted_per_reason_in_the_state_and_the_metrics() {
    /// Connections beyond the hello cap, each refused.
    const OVER_CAP: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let agent = Agent::builder()
        .listen(format!("unix:{}", sock.display()))
        .dump_dir(dir.path().join("dumps"))
        .metrics("127.0.0.1:0".parse().unwrap())
        .spawn()
        .unwrap();
    // Nothing refused yet: every reason is on the page, at 0.
    let (_, body) = get(agent.metrics_addr().unwrap(), "/metrics");
    for r in RefusalReason::ALL {
        let line = format!(
            "allocview_attach_refused_total{{reason=\"{}\"}} 0",
            r.as_str()
        );
        assert!(body.contains(&line), "{line} in\n{body}");
    }

    // Silent connections up to the cap (each has had the agent's hello), then more: refused.
    let silent: Vec<_> = (0..MAX_AWAITING_HELLO).map(|_| raw_hello(&sock)).collect();
    for _ in 0..OVER_CAP {
        let mut over = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        over.set_read_timeout(Some(WAIT)).unwrap();
        assert!(refusal(&mut over).contains("waiting for their hello"));
    }
    drop(silent);
    // Other refusals: a hello of another program, and a frame over the size limit.
    let (mut wrong, refused_while_freeing) = hello_once_slots_free(&sock);
    protocol::write_frame(
        &mut wrong,
        &ClientFrame::Hello {
            magic: "not-allocview".into(),
            version: protocol::PROTOCOL_VERSION,
            token: None,
        },
    )
    .unwrap();
    assert!(refusal(&mut wrong).contains("not an allocview client"));
    let mut oversize = raw_hello(&sock);
    oversize.write_all(&u32::MAX.to_be_bytes()).unwrap();
    assert!(refusal(&mut oversize).contains("exceeds the limit"));
    // A real client still gets in (and is not counted).
    let mut ok = raw_hello(&sock);
    send_hello(&mut ok);

    let expected = vec![
        (
            "hello_cap".to_string(),
            OVER_CAP as u64 + refused_while_freeing,
        ),
        ("bad_hello".to_string(), 1),
        ("oversize_frame".to_string(), 1),
    ];
    let pipeline = agent.state().pipeline;
    assert_eq!(pipeline.refused_clients, expected);
    assert_eq!(
        pipeline.refused_clients_total(),
        OVER_CAP as u64 + refused_while_freeing + 2
    );

    let (status, body) = get(agent.metrics_addr().unwrap(), "/metrics");
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
    let refused = |reason: &str| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == "allocview_attach_refused_total"
                    && s.labels.get("reason") == Some(reason)
            })
            .unwrap_or_else(|| panic!("no refusals for {reason} in\n{body}"));
        match s.value {
            prometheus_parse::Value::Counter(v) => v,
            ref other => panic!("not a counter: {other:?}"),
        }
    };
    assert!(
        body.lines()
            .any(|l| l == "# TYPE allocview_attach_refused_total counter"),
        "{body}"
    );
    assert_eq!(
        refused("hello_cap"),
        (OVER_CAP as u64 + refused_while_freeing) as f64
    );
    assert_eq!(refused("bad_hello"), 1.0);
    assert_eq!(refused("oversize_frame"), 1.0);
    for r in ["hello_timeout", "version", "token", "bad_request"] {
        assert_eq!(refused(r), 0.0, "{r}");
    }
    drop(ok);
    agent.shutdown();
}

/// The `Accept` header Prometheus 2.x sends.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// Status, headers and body of a GET of `/metrics` with these extra header lines.
fn get_with(addr: std::net::SocketAddr, extra: &str) -> (u16, String, String) {
    let resp = exchange(
        addr,
        &format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n"),
    );
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_string(), body.to_string())
}

fn content_type(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no content type in\n{head}"))
}

/// The sample lines of a page (neither comments nor blank).
fn sample_lines(page: &str) -> Vec<&str> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect()
}

/// The metric name of a sample line.
fn sample_name(line: &str) -> &str {
    line.split(['{', ' ']).next().unwrap()
}

/// An agent with the toy's device (some allocations, some frees) serving metrics.
fn toy_agent(dir: &std::path::Path) -> (Agent, std::sync::Arc<toy::Toy>) {
    let toy = toy::Toy::new();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir)
        .metrics("127.0.0.1:0".parse().unwrap())
        .provider(toy.clone())
        .spawn()
        .unwrap();
    toy.set_sink(agent.sink());
    for i in 0..30usize {
        toy.malloc((i % 3) as u64);
    }
    for i in 0..10usize {
        toy.free_nth(i);
    }
    agent.flush();
    (agent, toy)
}

#[test]
fn a_plain_scrape_gets_the_classic_text_format_and_prometheus_gets_openmetrics() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _toy) = toy_agent(dir.path());
    let addr = agent.metrics_addr().unwrap();

    // No Accept (curl, most agents): the classic format, where every sample's family is
    // declared under the sample's own name (a counter as `x_total`), as promtool and the
    // classic parsers read it, and no `# EOF`.
    let (status, head, text) = get_with(addr, "");
    assert_eq!(status, 200);

    assert_eq!(
        content_type(&head),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    let declared: std::collections::BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').unwrap())
        .collect();
    let helped: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .map(|l| l.split_once(' ').unwrap().0)
        .collect();
    for line in sample_lines(&text) {
        let name = sample_name(line);
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| declared.get(f) == Some(&"histogram"))
            })
            .unwrap_or(name);
        let kind = declared
            .get(family)
            .unwrap_or_else(|| panic!("{name} has no TYPE of its own in\n{text}"));
        assert!(helped.contains(family), "{family} has no HELP");
        assert_eq!(
            name.ends_with("_total"),
            *kind == "counter",
            "{name} is a {kind}"
        );
    }
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let untyped: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| matches!(s.value, prometheus_parse::Value::Untyped(_)))
        // The parser leaves a histogram's `_sum` and `_count` untyped.
        .filter(|s| !s.metric.ends_with("_sum") && !s.metric.ends_with("_count"))
        .map(|s| s.metric.clone())
        .collect();
    assert!(untyped.is_empty(), "untyped: {untyped:?}");

    // Prometheus' Accept: OpenMetrics, counters declared without `_total`, units declared,
    // `# EOF` last; the same samples.
    let (status, head, om) = get_with(addr, &format!("Accept: {PROMETHEUS_ACCEPT}\r\n"));
    assert_eq!(status, 200);
    assert_eq!(
        content_type(&head),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert_eq!(om.lines().last(), Some("# EOF"));
    assert!(
        om.lines()
            .any(|l| l == "# TYPE allocview_events_ingested counter"),
        "{om}"
    );
    assert!(
        om.lines()
            .any(|l| l == "# UNIT allocview_reserved_bytes bytes"),
        "{om}"
    );
    let mut a = sample_lines(&text);
    let mut b = sample_lines(&om);
    // The agent's start time is the same; its event count moves only with events.
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
    agent.shutdown();
}

#[test]
fn metric_names_end_in_their_unit_and_no_gauge_carries_a_quantile_label() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _toy) = toy_agent(dir.path());
    let (_, _, text) = get_with(agent.metrics_addr().unwrap(), "");
    let kinds: std::collections::BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').unwrap())
        .collect();
    for (name, kind) in &kinds {
        let stem = name.strip_suffix("_total").unwrap_or(name);
        for unit in ["bytes", "seconds"] {
            // A unit is the last word (before `_total`), never in the middle.
            if stem.split('_').any(|w| w == unit) {
                assert!(stem.ends_with(unit), "{name}: the unit is not last");
            }
        }
        assert!(
            !name.contains("_bytes_") || name.ends_with("_bytes_total"),
            "{name}"
        );
        if *kind != "summary" {
            for line in sample_lines(&text)
                .into_iter()
                .filter(|l| sample_name(l) == *name)
            {
                assert!(!line.contains("quantile=\""), "{line}");
            }
        }
    }
    // The renamed families are there.
    for name in [
        "allocview_reserved_peak_bytes",
        "allocview_reserved_allocated_bytes_total",
        "allocview_allocated_freed_bytes_total",
        "allocview_allocation_size_quantile_bytes",
        "allocview_block_lifetime_quantile_seconds",
        "allocview_allocator_latency_quantile_seconds",
    ] {
        assert!(kinds.contains_key(name), "no {name} in\n{text}");
    }
    agent.shutdown();
}

#[test]
fn capacity_is_absent_when_unknown_and_the_agents_own_facts_are_on_the_page() {
    let dir = tempfile::tempdir().unwrap();
    // Events only, no provider: the device's memory is unknown.
    let agent = toy::quiet_agent(dir.path(), 1024)
        .metrics("127.0.0.1:0".parse().unwrap())
        .spawn()
        .unwrap();
    agent.sink().publish(&Event::new(
        EventAction::SegmentAlloc,
        3,
        EventPool::Large,
        0x1000_0000,
        2 << 20,
    ));
    agent.flush();
    let (_, _, text) = get_with(agent.metrics_addr().unwrap(), "");
    assert!(
        text.contains("allocview_reserved_bytes{device=\"3\",pool=\"all\"} 2097152"),
        "{text}"
    );
    // A ratio over the capacity must have no value, not +Inf: the series is absent.
    assert!(
        !text.contains("allocview_device_total_memory_bytes"),
        "{text}"
    );
    let version = format!(
        "allocview_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.lines().any(|l| l == version), "{version} in\n{text}");
    // Pausing is a client's own: the agent and this page keep updating, so no gauge says it.
    assert!(!text.contains("allocview_paused"), "{text}");
    let started = text
        .lines()
        .find_map(|l| l.strip_prefix("allocview_agent_start_time_seconds "))
        .unwrap_or_else(|| panic!("no start time in\n{text}"));
    let started: f64 = started.parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(started > 1.6e9 && started <= now + 1.0, "{started}");
    agent.shutdown();
}

#[test]
fn private_pools_share_one_series_so_graph_captures_do_not_grow_the_page() {
    /// Private pools made (one per capture, ids growing).
    const CAPTURES: u64 = 6;
    let dir = tempfile::tempdir().unwrap();
    let agent = toy::quiet_agent(dir.path(), 1024)
        .metrics("127.0.0.1:0".parse().unwrap())
        .spawn()
        .unwrap();
    for id in 1..=CAPTURES {
        let addr = 0x1000_0000 + id * (4 << 20);
        for (action, size) in [
            (EventAction::SegmentAlloc, 2u64 << 20),
            (EventAction::Alloc, 1 << 20),
        ] {
            let mut e = Event::new(action, 0, EventPool::Large, addr, size);
            e.flags = allocview_alloc::event::FLAG_PRIVATE_POOL;
            e.pool_id = id;
            e.requested = size;
            agent.sink().publish(&e);
        }
    }
    agent.flush();
    let (_, _, text) = get_with(agent.metrics_addr().unwrap(), "");
    let pools: std::collections::BTreeSet<&str> = sample_lines(&text)
        .into_iter()
        .filter(|l| l.starts_with("allocview_allocation_size_bytes_count"))
        .filter_map(|l| l.split("pool=\"").nth(1)?.split('"').next())
        .collect();
    assert!(pools.contains("private_pools"), "{text}");
    assert!(
        pools.iter().all(|p| !p.starts_with("private_pool_")),
        "{pools:?}"
    );
    let private_count = sample_lines(&text)
        .into_iter()
        .find(|l| {
            l.starts_with("allocview_allocation_size_bytes_count")
                && l.contains("pool=\"private_pools\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .unwrap()
        .to_string();
    assert_eq!(private_count, CAPTURES.to_string());
    agent.shutdown();
}

#[test]
fn a_listener_with_a_short_write_timeout_still_accepts_after_idling_past_it() {
    // The timeout is set on the listening socket: a send timeout, which `accept` ignores (a
    // receive timeout would end an accept loop at the first idle period).
    let timeout = Duration::from_millis(50);
    let agent = Agent::builder()
        .no_listen()
        .metrics("127.0.0.1:0".parse().unwrap())
        .metrics_write_timeout(timeout)
        .spawn()
        .unwrap();
    let addr = agent.metrics_addr().unwrap();
    assert_eq!(get(addr, "/metrics").0, 200);
    std::thread::sleep(timeout * 6);
    assert_eq!(get(addr, "/metrics").0, 200);
    agent.shutdown();
}

/// The families a page declares (`# TYPE` names; a classic counter's is its `_total` name).
fn declared_families(page: &str) -> std::collections::BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').unwrap().0.to_string())
        .collect()
}

#[test]
fn every_metric_the_docs_and_rules_name_is_on_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _toy) = toy_agent(dir.path());
    let (_, _, text) = get_with(agent.metrics_addr().unwrap(), "");
    let mut families = declared_families(&text);
    // What a page shows only in some processes: a memory fraction, an instrumented heap,
    // private pools; rendered from the same state with them.
    let mut state = agent.state();
    state.devices[0].allowed_memory = Some(40 << 30);
    state.host = Some(Default::default());
    families.extend(declared_families(&allocview_agent::prometheus::render_as(
        &state,
        Format::Text,
    )));
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    for doc in ["docs/prometheus-rules.yml", "docs/metrics.md", "README.md"] {
        let whole = std::fs::read_to_string(format!("{root}/{doc}")).unwrap();
        // The README's metrics section (it also names the C library's functions).
        let text = match (
            whole.find("metrics_at(\""),
            whole.find("A Rust program can"),
        ) {
            (Some(a), Some(b)) if doc == "README.md" && a < b => &whole[a..b],
            _ => &whole[..],
        };
        let mut named = 0;
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
            // Metric names; recording rules' (`level:metric`), the crates' names and the
            // docs' name patterns (`allocview_X...`, `allocview_<stat>`) are not.
            if !word.starts_with("allocview_")
                || [
                    "allocview_alloc",
                    "allocview_agent",
                    "allocview_pluggable",
                    "allocview_",
                ]
                .contains(&word)
                || word.starts_with("allocview_X")
                || !word[10..]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
            {
                continue;
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| word.strip_suffix(s).filter(|f| families.contains(*f)))
                .unwrap_or(word);
            // The renamed table names the old names too.
            let old = [
                "_bytes_peak",
                "_bytes_quantile",
                "_seconds_quantile",
                "_bytes_allocated_total",
                "_bytes_freed_total",
            ]
            .iter()
            .any(|o| family.ends_with(o));
            if doc == "docs/metrics.md" && old {
                continue;
            }
            assert!(
                families.contains(family),
                "{doc} names {word}, not on the page"
            );
            named += 1;
        }
        assert!(named > 0, "{doc} names no metric");
    }
    agent.shutdown();
}

/// `promtool`, where it is installed (`None`: the caller says it skipped).
fn promtool() -> Option<std::process::Command> {
    let found = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        println!("skipped: promtool not found");
    }
    found.then(|| std::process::Command::new("promtool"))
}

#[test]
fn promtool_passes_the_page_and_the_documented_rules_pass_their_unit_tests() {
    let Some(mut check) = promtool() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (agent, _toy) = toy_agent(dir.path());
    // The classic text a plain scrape gets (read here, not over HTTP: a large page comes in
    // chunks).
    let page = allocview_agent::prometheus::render_as(&agent.state(), Format::Text);
    agent.shutdown();
    let mut child = check
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // Its lint remarks differ between versions: a failure fails the test, a remark is shown.
    assert!(o.status.success(), "{said}");
    if !said.trim().is_empty() {
        println!("promtool check metrics remarks:\n{said}");
    }

    // docs/metrics.md: the rules are unit-tested by docs/prometheus-rules.test.yml.
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs");
    let o = promtool()
        .unwrap()
        .current_dir(docs)
        .args(["test", "rules", "prometheus-rules.test.yml"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn the_series_counts_docs_metrics_md_gives_are_the_pages() {
    use allocview_alloc::caching::backend::StreamId;
    use allocview_alloc::caching::sim::SimBackend;
    use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};

    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
        .unwrap();
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    // "One device is N series (... 11 more), plus M for the process".
    let number_after = |marker: &str| -> usize {
        let at = doc
            .find(marker)
            .unwrap_or_else(|| panic!("metrics.md: no {marker:?}"))
            + marker.len();
        doc[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let per_device = number_after("One device is ");
    let per_process = number_after("more), plus ");

    // A device of known size that used both pools.
    let dir = tempfile::tempdir().unwrap();
    let allocator = std::sync::Arc::new(CachingAllocator::new(
        SimBackend::new(1 << 30),
        AllocatorConfig::default(),
    ));
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .provider(allocator.clone())
        .spawn()
        .unwrap();
    allocator.set_event_sink(Some(agent.sink()));
    allocator.set_event_latency_sampling(1);
    for size in [4 << 10, 8 << 20] {
        let p = allocator.malloc(size, StreamId::DEFAULT).unwrap();
        allocator.free(p).unwrap();
    }
    agent.flush();
    let page = allocview_agent::prometheus::render_as(&agent.state(), Format::Text);
    agent.shutdown();
    let samples = sample_lines(&page);
    let device = samples
        .iter()
        .filter(|l| l.contains("device=\"0\""))
        .count();
    assert_eq!(device, per_device, "{page}");
    let process: Vec<&&str> = samples
        .iter()
        .filter(|l| !l.contains("device=\"0\""))
        .collect();
    assert_eq!(process.len(), per_process, "{process:#?}");
}

#[test]
fn a_large_page_is_sent_with_its_length_never_chunked() {
    // Four devices make a page larger than tiny_http's 32 KiB chunking threshold. A page cut
    // at the response's deadline must fail the scrape (short of its Content-Length), not end
    // with a well-formed last chunk and pass for a whole one.
    let dir = tempfile::tempdir().unwrap();
    let agent = toy::quiet_agent(dir.path(), 1 << 12)
        .metrics("127.0.0.1:0".parse().unwrap())
        .spawn()
        .unwrap();
    for device in 0..4i16 {
        agent.sink().publish(&Event::new(
            EventAction::SegmentAlloc,
            device,
            EventPool::Large,
            0x1000_0000,
            2 << 20,
        ));
    }
    agent.flush();
    let (status, head, text) = get_with(agent.metrics_addr().unwrap(), "");
    assert_eq!(status, 200);
    assert!(text.len() > 32 * 1024, "{} bytes", text.len());
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains(&format!("content-length: {}", text.len())) && !head.contains("chunked"),
        "{head}"
    );
}
