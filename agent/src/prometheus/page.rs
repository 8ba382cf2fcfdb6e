//! [`Page`]: the families of one scrape, in the order they were added, written by
//! `prometheus-client`'s encoder in either text format ([`Format`]).
//!
//! `prometheus-client` writes OpenMetrics: a counter family `x` with samples `x_total`, a
//! `# UNIT` line for families whose name ends in a unit, `# EOF` at the end. The classic text
//! format declares a counter under its sample name (`# TYPE x_total counter`), has no `# UNIT`,
//! no info type and no `# EOF`; a classic page is written by the same encoder, given those
//! names and types (a counter's samples through the gauge writer, which adds no suffix), so
//! both pages come from one code path and carry the same samples.

use std::collections::HashMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::format::Format;
use crate::state::HistogramSummary;

/// Label pairs of one series.
pub(super) type Labels = Vec<(String, String)>;

/// Owned label pairs.
pub(super) fn labels(pairs: &[(&str, &str)]) -> Labels {
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
    /// An info metric (`1`, its facts in its labels).
    Info,
}

impl Sample {
    fn kind(&self) -> MetricType {
        match self {
            Sample::Gauge(_) | Sample::GaugeF64(_) => MetricType::Gauge,
            Sample::Counter(_) => MetricType::Counter,
            Sample::Histogram(_) => MetricType::Histogram,
            Sample::Info => MetricType::Info,
        }
    }

    fn encode(
        &self,
        metric: &mut MetricEncoder,
        labels: Option<&Labels>,
        format: Format,
    ) -> Result<(), std::fmt::Error> {
        match self {
            Sample::Gauge(v) => metric.encode_gauge(v),
            Sample::GaugeF64(v) => metric.encode_gauge(v),
            // Classic: the family is already named `x_total`.
            Sample::Counter(v) if format == Format::Text => metric.encode_gauge(v),
            Sample::Counter(v) => metric.encode_counter::<NoLabelSet, _, u64>(v, None),
            Sample::Histogram(h) => {
                metric.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
            }
            // Classic: a gauge named `x_info` of value 1.
            Sample::Info if format == Format::Text => metric.encode_gauge(&1i64),
            Sample::Info => metric.encode_info(labels.unwrap_or(&Vec::new())),
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

/// The units a family name may end with, as OpenMetrics declares them.
static UNITS: [(&str, Unit); 2] = [("_bytes", Unit::Bytes), ("_seconds", Unit::Seconds)];

impl MetricFamily {
    /// The name and unit to hand the encoder, for `format`: OpenMetrics splits the unit off
    /// (the encoder appends it and writes `# UNIT`) and an info family's `_info` (the encoder
    /// appends it); the classic format names a counter by its samples (`_total`).
    fn descriptor(&self, format: Format) -> (String, Option<&'static Unit>, MetricType) {
        match format {
            Format::Text => {
                let (name, kind) = match self.kind {
                    MetricType::Counter => (format!("{}_total", self.name), MetricType::Counter),
                    MetricType::Info => (self.name.clone(), MetricType::Gauge),
                    kind => (self.name.clone(), kind),
                };
                (name, None, kind)
            }
            Format::OpenMetrics => {
                if matches!(self.kind, MetricType::Info) {
                    let stem = self.name.strip_suffix("_info").unwrap_or(&self.name);
                    return (stem.to_string(), None, self.kind);
                }
                for (suffix, unit) in UNITS.iter() {
                    if let Some(stem) = self.name.strip_suffix(suffix) {
                        return (stem.to_string(), Some(unit), self.kind);
                    }
                }
                (self.name.clone(), None, self.kind)
            }
        }
    }
}

/// The page of one scrape, families and their samples in the order they were added, so that
/// two scrapes of the same state are the same text (`prometheus-client`'s `Family` keeps its
/// label sets in a hash map and writes them in no fixed order).
#[derive(Debug)]
pub(super) struct Page {
    families: Vec<MetricFamily>,
    /// Index of each family in `families` by name (a page has some 70 families and a sample
    /// per device and pool for most: a scan per sample was a third of the rendering).
    by_name: HashMap<String, usize>,
    format: Format,
}

impl Page {
    /// An empty page to be written in `format`.
    pub(super) fn new(format: Format) -> Page {
        Page {
            families: Vec::new(),
            by_name: HashMap::new(),
            format,
        }
    }

    /// The family `name`, added (with `help`) on first use.
    fn family(&mut self, name: &str, help: &str, kind: MetricType) -> &mut MetricFamily {
        let i = match self.by_name.get(name) {
            Some(&i) => i,
            None => {
                self.families.push(MetricFamily {
                    name: name.to_string(),
                    help: help.to_string(),
                    kind,
                    samples: Vec::new(),
                });
                self.by_name
                    .insert(name.to_string(), self.families.len() - 1);
                self.families.len() - 1
            }
        };
        &mut self.families[i]
    }

    fn add(&mut self, name: &str, help: &str, labels: Option<Labels>, sample: Sample) {
        let kind = sample.kind();
        self.family(name, help, kind).samples.push((labels, sample));
    }

    /// A gauge without labels.
    pub(super) fn plain_gauge(&mut self, name: &str, help: &str, v: i64) {
        self.add(name, help, None, Sample::Gauge(v));
    }

    /// A gauge without labels, with fractions.
    pub(super) fn plain_gauge_f64(&mut self, name: &str, help: &str, v: f64) {
        self.add(name, help, None, Sample::GaugeF64(v));
    }

    /// A counter without labels.
    pub(super) fn plain_counter(&mut self, name: &str, help: &str, v: u64) {
        self.add(name, help, None, Sample::Counter(v));
    }

    /// A labelled gauge.
    pub(super) fn gauge(&mut self, name: &str, help: &str, l: Labels, v: i64) {
        self.add(name, help, Some(l), Sample::Gauge(v));
    }

    /// A labelled counter.
    pub(super) fn counter(&mut self, name: &str, help: &str, l: Labels, v: u64) {
        self.add(name, help, Some(l), Sample::Counter(v));
    }

    /// An info metric: `name` (ending in `_info`) of value 1 with the facts in `l`.
    pub(super) fn info(&mut self, name: &str, help: &str, l: Labels) {
        self.add(name, help, Some(l), Sample::Info);
    }

    /// A histogram as a Prometheus histogram (the metric's [`Ladder`] of power-of-two
    /// buckets, exact sum and count) plus `{stem}_quantile_{unit}` gauges of its HdrHistogram
    /// quantiles (label `q`; within 1%, finer than the buckets; `q="1"` is the maximum) in the
    /// ladder's unit, for the quantiles listed by `quantiles` (a merged histogram has only its
    /// maximum).
    pub(super) fn histogram(
        &mut self,
        hist: &HistogramMetric,
        base: &[(&str, &str)],
        h: &HistogramSummary,
        quantiles: Quantiles,
    ) {
        let series = HistogramSeries::new(h, hist.ladder);
        self.add(
            hist.name,
            hist.help,
            Some(labels(base)),
            Sample::Histogram(series),
        );
        let quantiles_help = format!(
            "{}: quantiles since the agent started (HdrHistogram, within 1%; q=1 is the \
             maximum), not aggregatable across series: for windows and sums use the histogram",
            hist.help
        );
        let all = [
            ("0.5", h.p50),
            ("0.9", h.p90),
            ("0.99", h.p99),
            ("1", h.max),
        ];
        let shown = match quantiles {
            Quantiles::All => &all[..],
            Quantiles::MaxOnly => &all[3..],
        };
        for &(q, v) in shown {
            let mut l = labels(base);
            l.push(("q".into(), q.into()));
            self.add(
                hist.quantile_name,
                &quantiles_help,
                Some(l),
                Sample::GaugeF64(v as f64 / hist.ladder.per_unit),
            );
        }
    }
}

/// Which quantiles of a histogram the page shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Quantiles {
    /// 0.5, 0.9, 0.99 and 1.
    All,
    /// Only 1 (the maximum): what survives merging histograms.
    MaxOnly,
}

/// One histogram metric: its names, help and bucket ladder.
#[derive(Debug, Clone, Copy)]
pub(super) struct HistogramMetric {
    /// The histogram's name (ending in its unit).
    pub name: &'static str,
    /// The quantile gauges' name (ending in the same unit).
    pub quantile_name: &'static str,
    /// Help text, without the final full stop.
    pub help: &'static str,
    /// Its buckets.
    pub ladder: Ladder,
}

/// The fixed buckets of one histogram metric: `le = (2^b - 1) / per_unit` for `b` in
/// `first..=last`, then `+Inf`. Every series of a metric, in every process, has the same
/// buckets, so that `sum by (le)` over pools, devices or a fleet adds like to like and
/// `histogram_quantile` sees a monotonic ladder.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ladder {
    /// The first bucket, `le = 2^first - 1`, holds every value below `2^first`.
    pub first: u32,
    /// The last finite bucket, `le = 2^last - 1`; larger values are counted by `+Inf`.
    pub last: u32,
    /// Recorded units per exposed unit (`1e9`: nanoseconds recorded, seconds exposed, as
    /// Prometheus names time). Values are divided by it: a division by `1e9` rounds correctly
    /// (`511 / 1e9` is `5.11e-7`), where a multiplication by `1e-9` adds float noise
    /// (`5.110000000000001e-7`).
    pub per_unit: f64,
}

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
        for f in &self.families {
            // As the registry writes help texts: ending with a full stop.
            let help = format!("{}.", f.help);
            let (name, unit, kind) = f.descriptor(self.format);
            let mut family = encoder.encode_descriptor(&name, &help, unit, kind)?;
            for (labels, sample) in &f.samples {
                match labels {
                    // An info metric's labels are its value, not a family's.
                    Some(l)
                        if matches!(f.kind, MetricType::Info)
                            && self.format == Format::OpenMetrics =>
                    {
                        sample.encode(&mut family, Some(l), self.format)?
                    }
                    Some(l) => {
                        sample.encode(&mut family.encode_family(l)?, Some(l), self.format)?
                    }
                    None => sample.encode(&mut family, None, self.format)?,
                }
            }
        }
        Ok(())
    }
}
