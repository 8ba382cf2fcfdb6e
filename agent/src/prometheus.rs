//! Prometheus exposition of the agent's figures: `GET /metrics` on an optional HTTP listener.
//!
//! The text is written by the Prometheus project's own Rust client's encoder
//! (`prometheus-client`), from one collector that lists the families and their label sets in a
//! fixed order, so that a scrape of the same state is the same text (diffable). Two formats, by
//! content negotiation on `Accept` ([`Format`]): OpenMetrics 1.0 for clients that ask for it
//! (Prometheus does), the classic text format 0.0.4 for everyone else (`curl`, older
//! scrapers, other agents); both carry the same samples.
//!
//! Names follow `torch.cuda.memory_stats()` and Prometheus' conventions (base units, the unit
//! at the end of the name, before `_total`): each stat array `X` becomes `allocview_X` (current)
//! and `allocview_X_peak` gauges (gauges: `reset_peak_memory_stats` lowers a peak) and
//! `allocview_X_allocated_total` / `allocview_X_freed_total` counters; for the byte arrays
//! `X_bytes` the unit moves to the end (`allocview_reserved_bytes`,
//! `allocview_reserved_peak_bytes`, `allocview_reserved_allocated_bytes_total`). They are
//! labelled by `device` and `pool` (`all`, `small_pool`, `large_pool`; `all` is the sum of
//! the other two); the scalar counters follow. The device's capacity
//! (`allocview_device_total_memory_bytes`) and the allocator's limit under a memory fraction
//! (`allocview_device_memory_limit_bytes`) are present only when known, so that a ratio over
//! them is absent rather than infinite.
//!
//! The size, lifetime and latency HdrHistograms of each pool become Prometheus histograms
//! (`allocview_allocation_size_bytes`, `allocview_block_lifetime_seconds`,
//! `allocview_allocator_latency_seconds`: times in seconds, as Prometheus names them) on a fixed
//! ladder of power-of-two buckets per metric (`le = 2^b - 1` of the recorded integers, exact:
//! the bucket counts the values below `2^b`; the same buckets in every series and process, so
//! `sum by (le)` and `histogram_quantile` work across a fleet), with exact `_sum` and
//! `_count`, plus `_quantile_bytes` / `_quantile_seconds` gauges (label `q`) of their own
//! finer quantiles since start. The `pool` label of histograms is `small_pool` or
//! `large_pool`; every private pool (a CUDA graph's; their ids grow with each capture) is
//! merged into one `private_pools` series, so the number of series stays bounded. Dropped
//! events per action, resyncs, OOM dumps, attach clients refused per reason
//! (`allocview_attach_refused_total{reason}`), the agent's start time and
//! its version (`allocview_build_info`) close the page.
//! `allocview_max_split_size_bytes` is the `max_split_size` setting, `-1` when unlimited (as
//! `torch.cuda.memory_stats()` reports it).
//!
//! The HTTP side is [`http`], as much HTTP/1.1 as a scrape needs: `GET` and `HEAD` of
//! `/metrics` are answered, another method there gets `405 Method Not Allowed` with
//! `Allow: GET, HEAD`, any other path a 404, a request with a body `413` (never read). Each
//! connection has a thread of its own, at most [`MAX_CONNECTIONS`] (one over gets `503` at
//! once), and [`REQUEST_TIMEOUT`] for each request head, so silent or trickling clients cost
//! bounded threads for a bounded time and hold up no one else's scrape (rendering takes about
//! 0.2 µs of CPU per series: 4.3 ms for 64 devices, 22 000 series, in the `metrics_scrape`
//! bench). A response the client does not read for [`DEFAULT_WRITE_TIMEOUT`], or has not
//! read whole within [`RESPONSE_DEADLINE_WRITES`] times that, is abandoned (sent with its
//! `Content-Length`, so a cut page fails the scrape rather than passing for a whole one). The
//! endpoint belongs on an address only Prometheus reaches (docs/metrics.md). There is no
//! authentication (as usual for Prometheus targets): the page holds figures, not frames or
//! snapshots.
//!
//! # The observer effect
//!
//! With [`Instrumented`](allocview_alloc::global::Instrumented) as the global allocator, a
//! scrape's own allocations would show in the host figures it serves. Every thread of the
//! listener is an agent thread (`allocview:metrics`, `allocview:metrics-conn`): the heap
//! counts what they allocate but publishes none of it, and a request is read, answered and
//! freed on one such thread, so a scrape publishes no event at all and leaves the host's bytes
//! in use where they were.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use allocview_alloc::caching::stats::StatType;
use allocview_alloc::event::EventAction;
use prometheus_client::encoding::text::{encode, encode_registry};
use prometheus_client::registry::Registry;

use crate::agent::AgentError;
use crate::aggregator::AggregatorHandle;
use crate::server::RefusalReason;
use crate::state::{AgentState, HistogramSet, HistogramSummary, PoolKey};

mod format;
pub mod http;
mod page;

pub use format::{Format, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE};
pub use http::{MAX_CONNECTIONS, MAX_HEAD_BYTES, REQUEST_TIMEOUT};
use page::{HistogramMetric, Ladder, Page, Quantiles, labels};

/// The path metrics are served at.
pub const METRICS_PATH: &str = "/metrics";

/// The methods [`METRICS_PATH`] answers (the `Allow` header of a `405 Method Not Allowed`).
pub const ALLOWED_METHODS: &str = "GET, HEAD";

/// The content type of the OpenMetrics text format (see [`Format`]).
pub const CONTENT_TYPE: &str = OPENMETRICS_CONTENT_TYPE;

/// How long a response may wait for a client that reads none of it before it is abandoned
/// (Prometheus' own scrape timeout is 10 s by default).
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The name of the listener's thread (its connections' threads add `-conn`): the unpublished
/// threads' prefix
/// ([`UNPUBLISHED_THREAD_PREFIX`](allocview_alloc::global::UNPUBLISHED_THREAD_PREFIX)).
const METRICS_THREAD: &str = "allocview:metrics";

/// The `pool` label of the histograms of every private pool, merged.
pub const PRIVATE_POOLS: &str = "private_pools";

/// The version the page reports in `allocview_build_info`.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Allocation sizes in bytes: below 512 B (the smallest block) up to 1 TiB, 32 buckets.
const SIZE: HistogramMetric = HistogramMetric {
    name: "allocview_allocation_size_bytes",
    quantile_name: "allocview_allocation_size_quantile_bytes",
    help: "Requested size of allocations",
    ladder: Ladder {
        first: 9,
        last: 40,
        per_unit: 1.0,
    },
};
/// Block lifetimes in seconds: below 1 µs (2^10 ns) up to 9.8 hours (2^45 ns), 36 buckets.
const LIFETIME: HistogramMetric = HistogramMetric {
    name: "allocview_block_lifetime_seconds",
    quantile_name: "allocview_block_lifetime_quantile_seconds",
    help: "Time from allocation to free completion",
    ladder: Ladder {
        first: 10,
        last: 45,
        per_unit: 1e9,
    },
};
/// Allocator latencies in seconds: below 32 ns up to 134 ms (2^27 ns), 23 buckets.
const LATENCY: HistogramMetric = HistogramMetric {
    name: "allocview_allocator_latency_seconds",
    quantile_name: "allocview_allocator_latency_quantile_seconds",
    help: "Time the allocator call took, on the calls that measured it (a random sample)",
    ladder: Ladder {
        first: 5,
        last: 27,
        per_unit: 1e9,
    },
};

/// What a `torch.cuda.memory_stats()` stat array counts, for help texts.
fn stat_meaning(name: &str) -> &'static str {
    match name {
        "allocation" => "Allocated blocks (a count)",
        "allocated_bytes" => "Bytes in allocated blocks (rounded sizes)",
        "requested_bytes" => "Bytes the callers asked for in allocated blocks (before rounding)",
        "active" => "Active blocks: allocated, or freed while a stream still uses them (a count)",
        "active_bytes" => "Bytes in active blocks",
        "inactive_split" => "Free blocks inside partly used segments (a count)",
        "inactive_split_bytes" => "Bytes in free blocks inside partly used segments",
        "segment" => "Segments reserved from the device (a count)",
        "reserved_bytes" => "Bytes reserved from the device (segments)",
        _ => "Allocator figure",
    }
}

/// Adds `b` into `a`: counts, sums and buckets add, the extremes widen. Quantiles do not merge;
/// a merged summary shows only its maximum ([`Quantiles::MaxOnly`]).
fn merge_into(a: &mut HistogramSummary, b: &HistogramSummary) {
    if b.count == 0 {
        return;
    }
    a.min = if a.count == 0 {
        b.min
    } else {
        a.min.min(b.min)
    };
    a.max = a.max.max(b.max);
    a.count += b.count;
    a.sum += b.sum;
    a.mean = a.sum / a.count as f64;
    for &(ub, n) in &b.buckets {
        match a.buckets.binary_search_by_key(&ub, |&(u, _)| u) {
            Ok(i) => a.buckets[i].1 += n,
            Err(i) => a.buckets.insert(i, (ub, n)),
        }
    }
}

/// The state in the OpenMetrics text format (what Prometheus asks for; see [`render_as`]).
pub fn render(state: &AgentState) -> String {
    render_as(state, Format::OpenMetrics)
}

/// The state in `format`.
pub fn render_as(state: &AgentState, format: Format) -> String {
    let mut b = Page::new(format);
    for d in &state.devices {
        let dev = d.device.to_string();
        for (name, arr) in d.stats.arrays() {
            let what = stat_meaning(name);
            // `allocated_bytes` -> `allocated` + `_bytes`: the unit goes last.
            let (stem, unit) = match name.strip_suffix("_bytes") {
                Some(stem) => (stem, "_bytes"),
                None => (name, ""),
            };
            let names = [
                format!("allocview_{stem}{unit}"),
                format!("allocview_{stem}_peak{unit}"),
                format!("allocview_{stem}_allocated{unit}"),
                format!("allocview_{stem}_freed{unit}"),
            ];
            let helps = [
                format!(
                    "{what} now (torch.cuda.memory_stats {name}.*.current); pool=all is \
                     small_pool plus large_pool, so sum one or the other, not both"
                ),
                format!(
                    "Highest {name} since the last peak reset ({name}.*.peak; a gauge: \
                     reset_peak_memory_stats lowers it)"
                ),
                format!(
                    "Sum of increases of {name} ({name}.*.allocated; \
                     reset_accumulated_memory_stats restarts it from 0)"
                ),
                format!(
                    "Sum of decreases of {name} ({name}.*.freed; \
                     reset_accumulated_memory_stats restarts it from 0)"
                ),
            ];
            for t in StatType::ALL {
                let l = labels(&[("device", &dev), ("pool", t.key())]);
                let s = arr.get(t);
                b.gauge(&names[0], &helps[0], l.clone(), s.current);
                b.gauge(&names[1], &helps[1], l.clone(), s.peak);
                b.counter(&names[2], &helps[2], l.clone(), s.allocated.max(0) as u64);
                b.counter(&names[3], &helps[3], l, s.freed.max(0) as u64);
            }
        }
        let l = labels(&[("device", &dev)]);
        let s = &d.stats;
        for (name, help, v) in [
            (
                "allocview_alloc_retries",
                "Allocations that flushed the cache and retried (num_alloc_retries)",
                s.num_alloc_retries,
            ),
            (
                "allocview_ooms",
                "Allocations that failed with out of memory (num_ooms)",
                s.num_ooms,
            ),
            (
                "allocview_sync_all_streams",
                "Synchronizations of every stream (num_sync_all_streams)",
                s.num_sync_all_streams,
            ),
            (
                "allocview_device_allocs",
                "Device allocations, cudaMalloc or page maps (num_device_alloc)",
                s.num_device_alloc,
            ),
            (
                "allocview_device_frees",
                "Device frees (num_device_free)",
                s.num_device_free,
            ),
        ] {
            b.counter(name, help, l.clone(), v.max(0) as u64);
        }
        for (name, help, stat) in [
            (
                "allocview_oversize_allocations",
                "Allocated blocks of at least max_split_size",
                &s.oversize_allocations,
            ),
            (
                "allocview_oversize_segments",
                "Segments of at least max_split_size",
                &s.oversize_segments,
            ),
        ] {
            b.gauge(name, &format!("{help} now"), l.clone(), stat.current);
            b.gauge(
                &format!("{name}_peak"),
                &format!("{help}: the most since the last peak reset"),
                l.clone(),
                stat.peak,
            );
        }
        b.gauge(
            "allocview_max_split_size_bytes",
            "max_split_size setting in bytes (-1: unlimited, any cached block may be split)",
            l.clone(),
            s.max_split_size,
        );
        // Absent when unknown: `reserved / total` then has no value instead of +Inf.
        if d.total_memory > 0 {
            b.gauge(
                "allocview_device_total_memory_bytes",
                "Total device memory (absent when the device did not say)",
                l.clone(),
                d.total_memory as i64,
            );
        }
        if let Some(limit) = d.allowed_memory {
            b.gauge(
                "allocview_device_memory_limit_bytes",
                "Memory the allocator may reserve under its memory fraction (absent when not \
                 limited)",
                l.clone(),
                limit as i64,
            );
        }
        let mut private = HistogramSet::default();
        let mut privates = 0;
        for ph in &d.histograms.by_pool {
            let pool = match ph.pool {
                PoolKey::Small => StatType::SmallPool.key(),
                PoolKey::Large => StatType::LargePool.key(),
                PoolKey::Private(_) => {
                    merge_into(&mut private.size, &ph.set.size);
                    merge_into(&mut private.lifetime, &ph.set.lifetime);
                    merge_into(&mut private.latency, &ph.set.latency);
                    privates += 1;
                    continue;
                }
            };
            let base = [("device", dev.as_str()), ("pool", pool)];
            b.histogram(&SIZE, &base, &ph.set.size, Quantiles::All);
            b.histogram(&LIFETIME, &base, &ph.set.lifetime, Quantiles::All);
            b.histogram(&LATENCY, &base, &ph.set.latency, Quantiles::All);
        }
        if privates > 0 {
            let base = [("device", dev.as_str()), ("pool", PRIVATE_POOLS)];
            b.histogram(&SIZE, &base, &private.size, Quantiles::MaxOnly);
            b.histogram(&LIFETIME, &base, &private.lifetime, Quantiles::MaxOnly);
            b.histogram(&LATENCY, &base, &private.latency, Quantiles::MaxOnly);
        }
    }
    if let Some(h) = &state.host {
        b.plain_gauge(
            "allocview_host_allocations",
            "Live CPU heap allocations",
            h.allocations.current,
        );
        b.plain_gauge(
            "allocview_host_allocated_bytes",
            "Live CPU heap bytes",
            h.bytes.current,
        );
        b.plain_gauge(
            "allocview_host_allocated_peak_bytes",
            "Highest live CPU heap bytes since the last peak reset",
            h.bytes.peak,
        );
    }
    let p = &state.pipeline;
    b.plain_counter(
        "allocview_events_ingested",
        "Events the aggregator folded in",
        p.events_ingested,
    );
    labelled_counters(
        &mut b,
        "allocview_events_dropped",
        "Events dropped because the channel was full",
        "action",
        (0..EventAction::COUNT as u8)
            .filter_map(EventAction::from_u8)
            .map(EventAction::as_str),
        &p.dropped_by_action,
    );
    b.plain_counter(
        "allocview_resyncs",
        "Resynchronisations from the allocator after drops",
        p.resyncs,
    );
    b.plain_counter(
        "allocview_inconsistent_events",
        "Events that did not fit the mirror",
        p.inconsistencies,
    );
    b.plain_counter(
        "allocview_oom_records",
        "OOMs the agent recorded (also those whose records are no longer kept)",
        p.ooms_total,
    );
    b.plain_counter(
        "allocview_oom_dumps_written",
        "OOM dumps written",
        p.dumps_written,
    );
    b.plain_counter(
        "allocview_oom_dump_failures",
        "OOM dumps that could not be written",
        p.dump_failures,
    );
    b.plain_gauge(
        "allocview_attach_clients",
        "Attach clients connected",
        p.clients as i64,
    );
    labelled_counters(
        &mut b,
        "allocview_attach_refused",
        "Attach clients refused, by reason (hello_cap: too many connections waiting for their \
         hello; client_cap: too many clients attached)",
        "reason",
        RefusalReason::ALL.map(RefusalReason::as_str),
        &p.refused_clients,
    );
    b.plain_gauge(
        "allocview_channel_capacity",
        "Capacity of the event channel",
        p.channel_capacity as i64,
    );
    b.plain_gauge_f64(
        "allocview_agent_start_time_seconds",
        "When the agent started, seconds since the Unix epoch",
        state.process.started_ns as f64 / 1e9,
    );
    b.info(
        "allocview_build_info",
        "The allocview agent's version",
        labels(&[("version", VERSION)]),
    );
    let mut registry = Registry::default();
    registry.register_collector(Box::new(b));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = match format {
        Format::OpenMetrics => encode(&mut out, &registry),
        Format::Text => encode_registry(&mut out, &registry),
    };
    out
}

/// One counter series per value of `label` in `values`, zeros included, from the `(value,
/// count)` pairs the state keeps for the non-zero ones: a series that appeared only at its
/// first count would be absent to a rate or an alert pinned to it until then.
fn labelled_counters<'a>(
    b: &mut Page,
    name: &str,
    help: &str,
    label: &str,
    values: impl IntoIterator<Item = &'a str>,
    counts: &[(String, u64)],
) {
    for value in values {
        let n = counts
            .iter()
            .find(|(v, _)| v == value)
            .map_or(0, |(_, n)| *n);
        b.counter(name, help, labels(&[(label, value)]), n);
    }
}

/// The HTTP listener serving [`render_as`] at [`METRICS_PATH`] (see [`http`]).
pub struct MetricsServer {
    addr: SocketAddr,
    server: http::HttpServer,
}

impl MetricsServer {
    /// Starts serving at `addr` (port 0 picks a free port; see [`addr`](Self::addr)); a
    /// response the client does not read for `write_timeout` is abandoned.
    pub(crate) fn start(
        addr: SocketAddr,
        agg: AggregatorHandle,
        write_timeout: Duration,
    ) -> Result<MetricsServer, AgentError> {
        let error = |message: String| AgentError::Metrics { addr, message };
        let listener = TcpListener::bind(addr).map_err(|e| error(e.to_string()))?;
        let bound = listener.local_addr().map_err(|e| error(e.to_string()))?;
        let handler: Arc<http::Handler> = Arc::new(move |req: &http::Request| answer(req, &agg));
        let server = http::HttpServer::start(
            listener,
            METRICS_THREAD,
            handler,
            write_timeout,
            write_timeout * RESPONSE_DEADLINE_WRITES,
        )
        .map_err(|e| error(e.to_string()))?;
        tracing::info!(addr = %bound, "allocview metrics at http://{bound}{METRICS_PATH}");
        Ok(MetricsServer {
            addr: bound,
            server,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the listener, closes its connections and joins its threads.
    pub fn stop(&mut self) {
        self.server.stop();
    }
}

/// A response takes at most this many write timeouts in all: a client that reads a little now
/// and then (each write finishing within the timeout) is cut off all the same, so that it
/// cannot hold a connection's thread for long.
pub const RESPONSE_DEADLINE_WRITES: u32 = 3;

/// A response body that fails once `deadline` has passed, which ends the response: each read
/// hands the writer the next piece of the page, and a write blocks at most the write timeout.
struct DeadlineBody<'a> {
    rest: &'a [u8],
    deadline: std::time::Instant,
}

impl std::io::Read for DeadlineBody<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.rest.is_empty() && std::time::Instant::now() >= self.deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read the page too slowly",
            ));
        }
        self.rest.read(buf)
    }
}

/// The answer to one request: the page at [`METRICS_PATH`] for `GET` and `HEAD`, `405` for
/// another method there, `404` elsewhere.
fn answer(req: &http::Request, agg: &AggregatorHandle) -> http::Response {
    let is_metrics = req.target.split('?').next() == Some(METRICS_PATH);
    if !is_metrics {
        return http::Response::text(404, "not found: metrics are at /metrics\n");
    }
    if req.method != "GET" && req.method != "HEAD" {
        let mut r = http::Response::text(
            405,
            format!("method not allowed: {METRICS_PATH} answers {ALLOWED_METHODS}\n"),
        );
        r.headers.push(("Allow", ALLOWED_METHODS.into()));
        return r;
    }
    let format = Format::negotiate(req.accept.as_deref());
    match agg.metrics_state().map(|s| render_as(&s, format)) {
        Some(page) => http::Response {
            status: 200,
            headers: vec![("Content-Type", format.content_type().into())],
            body: page.into_bytes(),
        },
        None => http::Response::text(503, "agent stopped\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_alloc::caching::stats::DeviceStats;

    #[test]
    fn a_body_read_past_its_deadline_fails_and_one_read_in_time_is_whole() {
        use std::io::Read;
        let page = vec![7u8; 100_000];
        let mut late = DeadlineBody {
            rest: &page,
            deadline: std::time::Instant::now(),
        };
        let mut buf = [0u8; 8192];
        assert_eq!(
            late.read(&mut buf).unwrap_err().kind(),
            std::io::ErrorKind::TimedOut
        );
        let mut in_time = DeadlineBody {
            rest: &page,
            deadline: std::time::Instant::now() + Duration::from_secs(3600),
        };
        let mut all = Vec::new();
        in_time.read_to_end(&mut all).unwrap();
        assert_eq!(all, page);
        // The end of a page is an end, not a failure, even past the deadline.
        let mut done = DeadlineBody {
            rest: &[],
            deadline: std::time::Instant::now(),
        };
        assert_eq!(done.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn every_stat_array_has_a_help_text_of_its_own() {
        let stats = DeviceStats::default();
        let meanings: Vec<&str> = stats
            .arrays()
            .iter()
            .map(|(n, _)| stat_meaning(n))
            .collect();
        let distinct: std::collections::BTreeSet<&&str> = meanings.iter().collect();
        assert_eq!(distinct.len(), meanings.len(), "{meanings:?}");
        assert!(!meanings.contains(&stat_meaning("no such stat")));
    }
}
