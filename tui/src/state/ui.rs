//! What the user is looking at: the view, selections, scroll positions, filters, the help
//! overlay. Changed only by the app loop applying an [`Action`](crate::input::Action).

use super::filter::TraceFilter;

/// The seven views, in tab order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum View {
    /// Gauges, counters and the usage chart.
    #[default]
    Overview,
    /// One row per segment, blocks drawn to scale.
    Segments,
    /// Small, large and private pools.
    Pools,
    /// Usage per stream.
    Streams,
    /// Size, lifetime and latency histograms.
    Histograms,
    /// The event log.
    Trace,
    /// Each OOM with its facts.
    Oom,
}

impl View {
    /// Every view in tab order.
    pub const ALL: [View; 7] = [
        View::Overview,
        View::Segments,
        View::Pools,
        View::Streams,
        View::Histograms,
        View::Trace,
        View::Oom,
    ];

    /// The tab title.
    pub fn title(self) -> &'static str {
        match self {
            View::Overview => "Overview",
            View::Segments => "Segments",
            View::Pools => "Pools",
            View::Streams => "Streams",
            View::Histograms => "Histograms",
            View::Trace => "Trace",
            View::Oom => "OOM",
        }
    }

    /// Position in tab order (0-based).
    pub fn index(self) -> usize {
        View::ALL.iter().position(|&v| v == self).unwrap_or(0)
    }

    /// The view with this 0-based index, wrapping around.
    pub fn from_index(i: usize) -> View {
        View::ALL[i % View::ALL.len()]
    }

    /// The next view (Tab).
    pub fn next(self) -> View {
        View::from_index(self.index() + 1)
    }

    /// The previous view (Shift-Tab).
    pub fn prev(self) -> View {
        View::from_index(self.index() + View::ALL.len() - 1)
    }
}

/// Which segments the segment view lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SegmentFilter {
    /// Every segment.
    #[default]
    All,
    /// Large pool only.
    Large,
    /// Small pool only.
    Small,
}

impl SegmentFilter {
    /// The next filter (`f`).
    pub fn next(self) -> SegmentFilter {
        match self {
            SegmentFilter::All => SegmentFilter::Large,
            SegmentFilter::Large => SegmentFilter::Small,
            SegmentFilter::Small => SegmentFilter::All,
        }
    }

    /// `all`, `large`, `small`.
    pub fn label(self) -> &'static str {
        match self {
            SegmentFilter::All => "all",
            SegmentFilter::Large => "large",
            SegmentFilter::Small => "small",
        }
    }
}

/// Which histogram groups the histogram view offers (`p`, `s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HistogramGrouping {
    /// Every group (all, the pools, the streams), one at a time.
    #[default]
    Every,
    /// The pools (`small pool`, `large pool`, `private pool N`), side by side in a table.
    Pool,
    /// The streams (`stream N`), side by side in a table.
    Stream,
}

impl HistogramGrouping {
    /// Whether a group named as the sources name them (`all`, `small pool`,
    /// `private pool 3`, `stream 7`) belongs here.
    pub fn includes(self, group: &str) -> bool {
        match self {
            HistogramGrouping::Every => true,
            HistogramGrouping::Pool => group.contains("pool"),
            HistogramGrouping::Stream => group.starts_with("stream "),
        }
    }

    /// `p` (pools) or `s` (streams) pressed: that grouping, or back to every group when it is
    /// already shown.
    pub fn toggle(self, to: HistogramGrouping) -> HistogramGrouping {
        if self == to {
            HistogramGrouping::Every
        } else {
            to
        }
    }

    /// `every group`, `per pool`, `per stream`.
    pub fn label(self) -> &'static str {
        match self {
            HistogramGrouping::Every => "every group",
            HistogramGrouping::Pool => "per pool",
            HistogramGrouping::Stream => "per stream",
        }
    }
}

/// How much of the run the usage chart spans (`t` cycles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChartSpan {
    /// The whole run (every sample kept).
    Whole,
    /// The last hour (traces without time: 10,000 events).
    Hour,
    /// The last 10 minutes (traces without time: 1,000 events).
    TenMinutes,
    /// The last minute (traces without time: 100 events).
    Minute,
}

/// Seconds in a minute.
const MINUTE_S: f64 = crate::units::MINUTE as f64;

impl ChartSpan {
    /// The span a source starts with: a live process's last 10 minutes (what it is doing now,
    /// however long it has run), a file's whole trace (its cursor always in view).
    pub fn default_for(file: bool) -> ChartSpan {
        if file {
            ChartSpan::Whole
        } else {
            ChartSpan::TenMinutes
        }
    }

    /// The next span (`t`): whole, 1 h, 10 min, 1 min, whole again.
    pub fn next(self) -> ChartSpan {
        match self {
            ChartSpan::Whole => ChartSpan::Hour,
            ChartSpan::Hour => ChartSpan::TenMinutes,
            ChartSpan::TenMinutes => ChartSpan::Minute,
            ChartSpan::Minute => ChartSpan::Whole,
        }
    }

    /// The span in x units: seconds, or events where the x axis counts events (`None`: the
    /// whole run).
    pub fn width(self, x_is_events: bool) -> Option<f64> {
        let (seconds, events) = match self {
            ChartSpan::Whole => return None,
            ChartSpan::Hour => (60.0 * MINUTE_S, 10_000.0),
            ChartSpan::TenMinutes => (10.0 * MINUTE_S, 1_000.0),
            ChartSpan::Minute => (MINUTE_S, 100.0),
        };
        Some(if x_is_events { events } else { seconds })
    }

    /// How the chart's title names it: `whole run`, `last 10 min`; in a file, the span is
    /// around the cursor (`whole trace`, `1 min around the cursor`, `100 events around the
    /// cursor`).
    pub fn label(self, x_is_events: bool, file: bool) -> String {
        let size = match (self, x_is_events) {
            (ChartSpan::Whole, _) => {
                return if file { "whole trace" } else { "whole run" }.to_string();
            }
            (ChartSpan::Hour, false) => "1 h",
            (ChartSpan::TenMinutes, false) => "10 min",
            (ChartSpan::Minute, false) => "1 min",
            (ChartSpan::Hour, true) => "10,000 events",
            (ChartSpan::TenMinutes, true) => "1,000 events",
            (ChartSpan::Minute, true) => "100 events",
        };
        if file {
            format!("{size} around the cursor")
        } else {
            format!("last {size}")
        }
    }
}

/// The user's side of the dashboard.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UiState {
    /// The view shown.
    pub view: View,
    /// The help overlay is open.
    pub help: bool,
    /// Rows of the help overlay scrolled past (↑↓ PgUp PgDn while it is open), for a terminal
    /// too short to show it whole.
    pub help_scroll: usize,
    /// The detail pane is open (segments: block facts; OOM: frames).
    pub detail: bool,
    /// Selected row of the segment list (index into the filtered list).
    pub segment_row: usize,
    /// Selected block within the selected segment.
    pub block: usize,
    /// Which segments are listed.
    pub segment_filter: SegmentFilter,
    /// The selected segment is zoomed to fill the list (`z`).
    pub zoom: bool,
    /// Selected stream row.
    pub stream_row: usize,
    /// Which histogram group is shown (index into the distinct groups of the grouping).
    pub histogram_group: usize,
    /// Which groups the histogram view offers.
    pub histogram_by: HistogramGrouping,
    /// Selected trace row (index into the filtered trace); `None` follows the newest entry.
    pub trace_row: Option<usize>,
    /// The trace filter in force.
    pub trace_filter: TraceFilter,
    /// The filter being typed after `/`, if any.
    pub filter_input: Option<String>,
    /// Selected OOM.
    pub oom: usize,
    /// Lines of the selected OOM's box scrolled past (PgDn / PgUp in the OOM view), for a
    /// terminal too short to show it whole.
    pub oom_scroll: usize,
    /// Updates are paused (live sources).
    pub paused: bool,
    /// The user asked to quit.
    pub quit: bool,
    /// The usage chart's span, once the user picks one (`t`); `None`: the source's default
    /// ([`ChartSpan::default_for`]).
    pub chart_span: Option<ChartSpan>,
    /// No colours (the `NO_COLOR` convention, <https://no-color.org>): the screen is drawn
    /// without colours, its cues kept as modifiers (reverse, bold, underline) and symbols.
    pub no_color: bool,
    /// ASCII only: the locale names another character set than UTF-8, where box drawing,
    /// blocks and braille would be garbage ([`crate::view::ascii`]).
    pub ascii: bool,
}

impl UiState {
    /// The usage chart's span for a live source or a file.
    pub fn chart_span(&self, file: bool) -> ChartSpan {
        self.chart_span
            .unwrap_or_else(|| ChartSpan::default_for(file))
    }

    /// `t`: the usage chart's next span.
    pub fn cycle_chart_span(&mut self, file: bool) {
        self.chart_span = Some(self.chart_span(file).next());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tab_order_wraps_both_ways() {
        assert_eq!(View::Overview.next(), View::Segments);
        assert_eq!(View::Oom.next(), View::Overview);
        assert_eq!(View::Overview.prev(), View::Oom);
        assert_eq!(View::from_index(6), View::Oom);
        assert_eq!(View::Trace.index(), 5);
    }

    #[test]
    fn the_chart_span_starts_per_source_and_cycles_through_every_span() {
        let mut live = UiState::default();
        assert_eq!(live.chart_span(false), ChartSpan::TenMinutes);
        assert_eq!(live.chart_span(true), ChartSpan::Whole);
        let mut seen = vec![];
        for _ in 0..4 {
            live.cycle_chart_span(false);
            seen.push(live.chart_span(false));
        }
        assert_eq!(
            seen,
            [
                ChartSpan::Minute,
                ChartSpan::Whole,
                ChartSpan::Hour,
                ChartSpan::TenMinutes
            ]
        );
        assert_eq!(ChartSpan::Hour.width(false), Some(3600.0));
        assert_eq!(ChartSpan::Hour.width(true), Some(10_000.0));
        assert_eq!(
            ChartSpan::Minute.label(false, true),
            "1 min around the cursor"
        );
        assert_eq!(ChartSpan::TenMinutes.label(false, false), "last 10 min");
    }
}
