//! Prometheus exposition of the agent's figures: `GET /metrics` on an optional HTTP listener.
//!
//! The text is written by the Prometheus project's own Rust client's encoder
//! (`prometheus-client`, OpenMetrics text format, which Prometheus scrapes), from one collector
//! that lists the families and their label sets in a fixed order, so that a scrape of the same
//! state is the same text (diffable). Names follow `torch.cuda.memory_stats()`:
//! each stat array `X` becomes `allocview_X` (current) and `allocview_X_peak` gauges and
//! `allocview_X_allocated` / `allocview_X_freed` counters, labelled by `device` and `pool`
//! (`all`, `small_pool`, `large_pool`; `all` is the sum of the other two); the scalar counters
//! follow. The size, lifetime and latency HdrHistograms of each pool (`small_pool`,
//! `large_pool` or `private_pool_ID`) become Prometheus histograms
//! (`allocview_allocation_size_bytes`, `allocview_block_lifetime_seconds`,
//! `allocview_allocator_latency_seconds`: times in seconds, as Prometheus names them) on a fixed
//! ladder of power-of-two buckets per metric (`le = 2^b - 1` of the recorded integers, exact:
//! the bucket counts the values below `2^b`;
//! the same buckets in every series and process, so `sum by (le)` and `histogram_quantile`
//! work across a fleet), with exact `_sum` and `_count`, plus `_quantile` gauges of their own
//! finer quantiles; dropped events per action, resyncs, OOM dumps and attach clients refused
//! per reason (`allocview_attach_refused_total{reason}`) close the page.
//! `allocview_max_split_size_bytes` is the `max_split_size` setting, `-1` when unlimited (as
//! `torch.cuda.memory_stats()` reports it).
//! The HTTP side is `tiny_http` on one thread, so services need no async runtime; `GET` and
//! `HEAD` of `/metrics` are answered, another method there gets `405 Method Not Allowed` with
//! `Allow: GET, HEAD`, any other path a 404. There is no authentication
//! (as usual for Prometheus targets): the page holds figures, not frames or snapshots.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use allocview_alloc::caching::stats::StatType;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::agent::AgentError;
use crate::aggregator::AggregatorHandle;
use crate::server::RefusalReason;
use crate::state::{AgentState, HistogramSummary, PoolKey};

/// The path metrics are served at.
pub const METRICS_PATH: &str = "/metrics";

/// The methods [`METRICS_PATH`] answers (the `Allow` header of a `405 Method Not Allowed`).
pub const ALLOWED_METHODS: &str = "GET, HEAD";

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One sample of a [`MetricFamily`].
#[derive(Debug)]
enum Sample {
    /// A gauge's value.
    Gauge(i64),
    /// A gauge's value in a unit with fractions (seconds).
    GaugeF64(f64),
    /// A counter's total.
    Counter(u64),
    /// A histogram's buckets, sum and count.
    Histogram(HistogramSeries),
}

impl Sample {
    fn encode(&self, metric: &mut MetricEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Sample::Gauge(v) => metric.encode_gauge(v),
            Sample::GaugeF64(v) => metric.encode_gauge(v),
            Sample::Counter(v) => metric.encode_counter::<NoLabelSet, _, u64>(v, None),
            Sample::Histogram(h) => {
                metric.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
            }
        }
    }
}

/// The samples of one metric name, in the order the page adds them: `None` labels for a metric
/// without any (written without braces, which some parsers need).
#[derive(Debug)]
struct MetricFamily {
    name: String,
    help: String,
    kind: MetricType,
    samples: Vec<(Option<Labels>, Sample)>,
}

/// The page of one scrape, families and their samples in the order they were added, so that
/// two scrapes of the same state are the same text (`prometheus-client`'s `Family` keeps its
/// label sets in a hash map and writes them in no fixed order).
#[derive(Debug, Default)]
struct Page(Vec<MetricFamily>);

impl Page {
    /// The family `name`, added (with `help`) on first use.
    fn family(&mut self, name: &str, help: &str, kind: MetricType) -> &mut MetricFamily {
        let i = match self.0.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.0.push(MetricFamily {
                    name: name.to_string(),
                    help: help.to_string(),
                    kind,
                    samples: Vec::new(),
                });
                self.0.len() - 1
            }
        };
        &mut self.0[i]
    }

    fn add(&mut self, name: &str, help: &str, labels: Option<Labels>, sample: Sample) {
        let kind = match sample {
            Sample::Gauge(_) | Sample::GaugeF64(_) => MetricType::Gauge,
            Sample::Counter(_) => MetricType::Counter,
            Sample::Histogram(_) => MetricType::Histogram,
        };
        self.family(name, help, kind).samples.push((labels, sample));
    }

    /// A gauge without labels.
    fn plain_gauge(&mut self, name: &str, help: &str, v: i64) {
        self.add(name, help, None, Sample::Gauge(v));
    }

    /// A counter without labels.
    fn plain_counter(&mut self, name: &str, help: &str, v: u64) {
        self.add(name, help, None, Sample::Counter(v));
    }

    fn gauge(&mut self, name: &str, help: &str, l: Labels, v: i64) {
        self.add(name, help, Some(l), Sample::Gauge(v));
    }

    fn counter(&mut self, name: &str, help: &str, l: Labels, v: u64) {
        self.add(name, help, Some(l), Sample::Counter(v));
    }

    /// A histogram as a Prometheus histogram (the metric's [`Ladder`] of power-of-two
    /// buckets, exact sum and count) plus `{name}_quantile` gauges of its HdrHistogram
    /// quantiles (within 1%, finer than the buckets; quantile `1` is the maximum), in the
    /// ladder's unit.
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        base: &[(&str, &str)],
        ladder: Ladder,
        h: &HistogramSummary,
    ) {
        let series = HistogramSeries::new(h, ladder);
        self.add(name, help, Some(labels(base)), Sample::Histogram(series));
        let quantiles = format!("{name}_quantile");
        let quantiles_help =
            format!("{help}: quantiles since the agent started (HdrHistogram, within 1%)");
        for (q, v) in [
            ("0.5", h.p50),
            ("0.9", h.p90),
            ("0.99", h.p99),
            ("1", h.max),
        ] {
            let mut l = labels(base);
            l.push(("quantile".into(), q.into()));
            self.add(
                &quantiles,
                &quantiles_help,
                Some(l),
                Sample::GaugeF64(v as f64 / ladder.per_unit),
            );
        }
    }
}

/// The fixed buckets of one histogram metric: `le = (2^b - 1) / per_unit` for `b` in
/// `first..=last`, then `+Inf`. Every series of a metric, in every process, has the same
/// buckets, so that `sum by (le)` over pools, devices or a fleet adds like to like and
/// `histogram_quantile` sees a monotonic ladder.
#[derive(Debug, Clone, Copy)]
struct Ladder {
    /// The first bucket, `le = 2^first - 1`, holds every value below `2^first`.
    first: u32,
    /// The last finite bucket, `le = 2^last - 1`; larger values are counted by `+Inf`.
    last: u32,
    /// Recorded units per exposed unit (`1e9`: nanoseconds recorded, seconds exposed, as
    /// Prometheus names time). Values are divided by it: a division by `1e9` rounds correctly
    /// (`511 / 1e9` is `5.11e-7`), where a multiplication by `1e-9` adds float noise
    /// (`5.110000000000001e-7`).
    per_unit: f64,
}

/// Allocation sizes in bytes: below 512 B (the smallest block) up to 1 TiB, 32 buckets.
const SIZE_LADDER: Ladder = Ladder {
    first: 9,
    last: 40,
    per_unit: 1.0,
};
/// Block lifetimes in seconds: below 1 µs (2^10 ns) up to 9.8 hours (2^45 ns), 36 buckets.
const LIFETIME_LADDER: Ladder = Ladder {
    first: 10,
    last: 45,
    per_unit: 1e9,
};
/// Allocator latencies in seconds: below 32 ns up to 134 ms (2^27 ns), 23 buckets.
const LATENCY_LADDER: Ladder = Ladder {
    first: 5,
    last: 27,
    per_unit: 1e9,
};

/// One labelled histogram series: per-bucket counts, which the encoder makes cumulative.
#[derive(Debug)]
struct HistogramSeries {
    sum: f64,
    count: u64,
    /// `(le, count)`: the ladder's buckets, then `+Inf`.
    buckets: Vec<(f64, u64)>,
}

impl HistogramSeries {
    /// The summary's buckets `[2^(b-1), 2^b)` of integer values, as `le = 2^b - 1` (exact,
    /// where `le = 2^b` would count the values equal to `2^b`, the next bucket's, too), put
    /// on the ladder: those below its first bucket into the first, those above its last into
    /// `+Inf`.
    fn new(h: &HistogramSummary, ladder: Ladder) -> Self {
        let finite = (ladder.last - ladder.first + 1) as usize;
        let mut counts = vec![0u64; finite + 1];
        for &(ub, n) in &h.buckets {
            // The top bucket's upper bound is u64::MAX (past 2^63): +Inf.
            let b = if ub.is_power_of_two() {
                ub.trailing_zeros()
            } else {
                u64::BITS
            };
            let i = (b.saturating_sub(ladder.first) as usize).min(finite);
            counts[i] += n;
        }
        let buckets = (ladder.first..=ladder.last)
            .map(|b| ((1u64 << b) - 1) as f64 / ladder.per_unit)
            .chain([f64::INFINITY])
            .zip(counts)
            .collect();
        HistogramSeries {
            sum: h.sum / ladder.per_unit,
            count: h.count,
            buckets,
        }
    }
}

/// The page is written by `prometheus-client`'s encoder as one collector: its families keep the
/// order they were added in.
impl Collector for Page {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            // As the registry writes help texts: ending with a full stop.
            let help = format!("{}.", f.help);
            let mut family = encoder.encode_descriptor(&f.name, &help, None, f.kind)?;
            for (labels, sample) in &f.samples {
                match labels {
                    Some(l) => sample.encode(&mut family.encode_family(l)?)?,
                    None => sample.encode(&mut family)?,
                }
            }
        }
        Ok(())
    }
}

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

/// The `pool` label of a histogram's pool, in the stat arrays' words: `small_pool`,
/// `large_pool`, and `private_pool_ID` for a private pool (which the stat arrays count inside
/// the other two), so one query selects a pool across every family.
fn pool_label(pool: PoolKey) -> String {
    match pool {
        PoolKey::Small => StatType::SmallPool.key().into(),
        PoolKey::Large => StatType::LargePool.key().into(),
        PoolKey::Private(id) => format!("private_pool_{id}"),
    }
}

/// The state in the OpenMetrics text format.
pub fn render(state: &AgentState) -> String {
    let mut b = Page::default();
    for d in &state.devices {
        let dev = d.device.to_string();
        for (name, arr) in d.stats.arrays() {
            let what = stat_meaning(name);
            for t in StatType::ALL {
                let l = labels(&[("device", &dev), ("pool", t.key())]);
                let s = arr.get(t);
                b.gauge(
                    &format!("allocview_{name}"),
                    &format!(
                        "{what} now (torch.cuda.memory_stats {name}.*.current); pool=\"all\" is \
                         small_pool plus large_pool, so sum one or the other, not both"
                    ),
                    l.clone(),
                    s.current,
                );
                b.gauge(
                    &format!("allocview_{name}_peak"),
                    &format!("Highest {name} since the last peak reset"),
                    l.clone(),
                    s.peak,
                );
                b.counter(
                    &format!("allocview_{name}_allocated"),
                    &format!("Sum of increases of {name} since the last accumulated reset"),
                    l.clone(),
                    s.allocated.max(0) as u64,
                );
                b.counter(
                    &format!("allocview_{name}_freed"),
                    &format!("Sum of decreases of {name} since the last accumulated reset"),
                    l,
                    s.freed.max(0) as u64,
                );
            }
        }
        let l = labels(&[("device", &dev)]);
        let s = &d.stats;
        for (name, help, v) in [
            (
                "allocview_alloc_retries",
                "Allocations that flushed the cache and retried",
                s.num_alloc_retries,
            ),
            ("allocview_ooms", "Allocations that failed", s.num_ooms),
            (
                "allocview_sync_all_streams",
                "Synchronizations of every stream",
                s.num_sync_all_streams,
            ),
            (
                "allocview_device_allocs",
                "Device allocations (cudaMalloc or page maps)",
                s.num_device_alloc,
            ),
            ("allocview_device_frees", "Device frees", s.num_device_free),
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
        b.gauge(
            "allocview_device_total_memory_bytes",
            "Total device memory (0 unknown)",
            l.clone(),
            d.total_memory as i64,
        );
        for ph in &d.histograms.by_pool {
            let pool = pool_label(ph.pool);
            let base = [("device", dev.as_str()), ("pool", pool.as_str())];
            b.histogram(
                "allocview_allocation_size_bytes",
                "Requested size of allocations",
                &base,
                SIZE_LADDER,
                &ph.set.size,
            );
            b.histogram(
                "allocview_block_lifetime_seconds",
                "Time from allocation to free completion",
                &base,
                LIFETIME_LADDER,
                &ph.set.lifetime,
            );
            b.histogram(
                "allocview_allocator_latency_seconds",
                "Time the allocator call took, on the calls that measured it (a random sample)",
                &base,
                LATENCY_LADDER,
                &ph.set.latency,
            );
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
            "allocview_host_allocated_bytes_peak",
            "Highest live CPU heap bytes",
            h.bytes.peak,
        );
    }
    let p = &state.pipeline;
    b.plain_counter(
        "allocview_events_ingested",
        "Events the aggregator folded in",
        p.events_ingested,
    );
    if p.dropped_by_action.is_empty() {
        b.counter(
            "allocview_events_dropped",
            "Events dropped because the channel was full",
            labels(&[("action", "alloc")]),
            0,
        );
    }
    for (action, n) in &p.dropped_by_action {
        b.counter(
            "allocview_events_dropped",
            "Events dropped because the channel was full",
            labels(&[("action", action)]),
            *n,
        );
    }
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
    // Every reason, zeros included, so a rate over any of them exists from the first scrape.
    for reason in RefusalReason::ALL.map(RefusalReason::as_str) {
        let n = p
            .refused_clients
            .iter()
            .find(|(r, _)| r == reason)
            .map_or(0, |(_, n)| *n);
        b.counter(
            "allocview_attach_refused",
            "Attach clients refused, by reason (hello_cap: too many connections waiting for \
             their hello)",
            labels(&[("reason", reason)]),
            n,
        );
    }
    b.plain_gauge(
        "allocview_channel_capacity",
        "Capacity of the event channel",
        p.channel_capacity as i64,
    );
    let mut registry = Registry::default();
    registry.register_collector(Box::new(b));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &registry);
    out
}

/// The HTTP listener serving [`render`] at [`METRICS_PATH`].
pub struct MetricsServer {
    addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Starts serving at `addr` (port 0 picks a free port; see [`addr`](Self::addr)).
    pub(crate) fn start(
        addr: SocketAddr,
        agg: AggregatorHandle,
    ) -> Result<MetricsServer, AgentError> {
        let server = tiny_http::Server::http(addr).map_err(|e| AgentError::Metrics {
            addr,
            message: e.to_string(),
        })?;
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| AgentError::Metrics {
                addr,
                message: "not an IP listener".into(),
            })?;
        let server = Arc::new(server);
        let s = server.clone();
        let thread = crate::agent_thread::spawn("allocview-metrics", move || serve(&s, &agg))
            .map_err(|error| AgentError::Thread {
                what: "metrics",
                error,
            })?;
        tracing::info!(addr = %bound, "allocview metrics at http://{bound}{METRICS_PATH}");
        Ok(MetricsServer {
            addr: bound,
            server,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the listener and joins its thread.
    pub fn stop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(server: &tiny_http::Server, agg: &AggregatorHandle) {
    for req in server.incoming_requests() {
        let path = req.url().split('?').next().unwrap_or("").to_string();
        // HEAD gets GET's headers without the body (tiny_http leaves it out).
        let get_or_head = matches!(
            req.method(),
            tiny_http::Method::Get | tiny_http::Method::Head
        );
        let resp = if path != METRICS_PATH {
            tiny_http::Response::from_string("not found: metrics are at /metrics\n")
                .with_status_code(404)
        } else if !get_or_head {
            let allow =
                tiny_http::Header::from_bytes("Allow", ALLOWED_METHODS).expect("a valid header");
            tiny_http::Response::from_string(format!(
                "method not allowed: {METRICS_PATH} answers {ALLOWED_METHODS}\n"
            ))
            .with_header(allow)
            .with_status_code(405)
        } else {
            match agg.metrics_state() {
                Some(state) => {
                    let header = tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE)
                        .expect("a valid header");
                    tiny_http::Response::from_string(render(&state))
                        .with_header(header)
                        .with_status_code(200)
                }
                None => tiny_http::Response::from_string("agent stopped\n").with_status_code(503),
            }
        };
        if let Err(e) = req.respond(resp) {
            tracing::debug!(error = %e, "metrics client went away");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_alloc::caching::stats::DeviceStats;

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
