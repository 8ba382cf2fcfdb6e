//! What a benchmark reports ([`Outcome`]), how it is judged against its [`Goal`], and how a run
//! is printed: an aligned table for people, a JSON array for scripts.

use serde::Serialize;

/// What "good enough" means for one benchmark.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// allocview's time per operation is at most this many times the baseline's.
    RatioAtMost(f64),
    /// allocview's time per operation is at most this many nanoseconds.
    NanosAtMost(f64),
    /// allocview handles at least this many events per second.
    EventsPerSecAtLeast(f64),
    /// allocview is faster than the baseline (ratio below 1).
    FasterThanBaseline,
    /// No goal: the figures are shown for comparison with another row (the verdict is
    /// `info`).
    Informational,
}

impl Goal {
    /// The goal in words, as the table shows it.
    pub fn describe(self) -> String {
        match self {
            Goal::RatioAtMost(r) => format!("<= {r}x"),
            Goal::NanosAtMost(ns) => format!("<= {}", nanos(ns)),
            Goal::EventsPerSecAtLeast(rate) => format!(">= {}", rate_text(rate)),
            Goal::FasterThanBaseline => "faster than baseline".to_string(),
            Goal::Informational => "none".to_string(),
        }
    }

    /// Whether the figures meet the goal; `None` when there is no goal
    /// ([`Goal::Informational`]) or a figure it needs is missing.
    pub fn met(self, allocview_ns: Option<f64>, ratio: Option<f64>) -> Option<bool> {
        match self {
            Goal::RatioAtMost(r) => ratio.map(|x| x <= r),
            Goal::NanosAtMost(ns) => allocview_ns.map(|x| x <= ns),
            Goal::EventsPerSecAtLeast(rate) => allocview_ns.map(|x| x > 0.0 && 1e9 / x >= rate),
            Goal::FasterThanBaseline => ratio.map(|x| x < 1.0),
            Goal::Informational => None,
        }
    }
}

/// How a benchmark's figures read best.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Time per operation (`12.3 ns`, `4.56 ms`).
    Time,
    /// Events per second (`25.1 M events/s`), from time per event.
    Events,
}

/// One benchmark's result: measured, or skipped with the reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The benchmark's name (`caching.alloc_free_pair`).
    pub name: &'static str,
    /// What the baseline is, in words.
    pub baseline: &'static str,
    /// The goal.
    pub goal: Goal,
    /// How the figures are shown.
    pub unit: Unit,
    /// allocview's median nanoseconds per operation (or per event); `None` when not measured.
    pub allocview_ns: Option<f64>,
    /// The baseline's median nanoseconds per operation; `None` when not measured.
    pub baseline_ns: Option<f64>,
    /// Why a figure is missing, or what else the reader should know.
    pub notes: Vec<String>,
}

impl Outcome {
    /// An outcome with no figures yet.
    pub fn new(name: &'static str, baseline: &'static str, goal: Goal, unit: Unit) -> Outcome {
        Outcome {
            name,
            baseline,
            goal,
            unit,
            allocview_ns: None,
            baseline_ns: None,
            notes: Vec::new(),
        }
    }

    /// This outcome with a note added.
    pub fn note(mut self, note: impl Into<String>) -> Outcome {
        self.notes.push(note.into());
        self
    }

    /// allocview's time over the baseline's, when both were measured.
    pub fn ratio(&self) -> Option<f64> {
        match (self.allocview_ns, self.baseline_ns) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        }
    }

    /// Whether the goal is met; `None` when there is no goal ([`Goal::Informational`]) or the
    /// figures it needs are missing.
    pub fn met(&self) -> Option<bool> {
        self.goal.met(self.allocview_ns, self.ratio())
    }

    /// The verdict column.
    pub fn verdict(&self) -> &'static str {
        match (self.allocview_ns, self.met()) {
            (None, _) => "skipped",
            (Some(_), _) if self.goal == Goal::Informational => "info",
            (Some(_), Some(true)) => "met",
            (Some(_), Some(false)) => "MISSED",
            (Some(_), None) => "no baseline",
        }
    }

    fn figure(&self, ns: Option<f64>) -> String {
        match (ns, self.unit) {
            (None, _) => "-".to_string(),
            (Some(ns), Unit::Time) => nanos(ns),
            (Some(ns), Unit::Events) if ns > 0.0 => rate_text(1e9 / ns),
            (Some(_), Unit::Events) => "-".to_string(),
        }
    }
}

/// The JSON form of an outcome.
#[derive(Debug, Serialize)]
struct JsonOutcome<'a> {
    name: &'a str,
    allocview_ns: Option<f64>,
    baseline_ns: Option<f64>,
    ratio: Option<f64>,
    goal: String,
    met: Option<bool>,
    baseline: &'a str,
    notes: &'a [String],
}

/// The outcomes as a JSON array of `{name, allocview_ns, baseline_ns, ratio, goal, met,
/// baseline, notes}` (missing figures are `null`).
pub fn to_json(outcomes: &[Outcome]) -> String {
    let rows: Vec<JsonOutcome<'_>> = outcomes
        .iter()
        .map(|o| JsonOutcome {
            name: o.name,
            allocview_ns: o.allocview_ns,
            baseline_ns: o.baseline_ns,
            ratio: o.ratio(),
            goal: o.goal.describe(),
            met: o.met(),
            baseline: o.baseline,
            notes: &o.notes,
        })
        .collect();
    serde_json::to_string_pretty(&rows).unwrap_or_else(|e| format!("\"{e}\""))
}

/// Column headings of the table.
const HEADINGS: [&str; 6] = [
    "benchmark",
    "allocview",
    "baseline",
    "ratio",
    "goal",
    "verdict",
];

/// The outcomes as an aligned table, then what each baseline is and every note.
pub fn to_table(outcomes: &[Outcome]) -> String {
    let rows: Vec<[String; 6]> = outcomes
        .iter()
        .map(|o| {
            [
                o.name.to_string(),
                o.figure(o.allocview_ns),
                o.figure(o.baseline_ns),
                o.ratio().map_or("-".to_string(), |r| format!("{r:.2}x")),
                o.goal.describe(),
                o.verdict().to_string(),
            ]
        })
        .collect();
    let mut widths = HEADINGS.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String; 6]| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = " ".repeat(w - cell.chars().count());
            // Names and words left, figures right.
            let text = if i == 0 || i >= 4 {
                format!("{cell}{pad}")
            } else {
                format!("{pad}{cell}")
            };
            if i > 0 {
                s.push_str("  ");
            }
            s.push_str(&text);
        }
        s.trim_end().to_string()
    };
    let mut out = String::new();
    out.push_str(&line(&HEADINGS.map(String::from)));
    out.push('\n');
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&rule.join("  "));
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out.push('\n');
    for o in outcomes {
        out.push_str(&format!("{}: baseline = {}\n", o.name, o.baseline));
        for n in &o.notes {
            out.push_str(&format!("  note: {n}\n"));
        }
    }
    out
}

/// Nanoseconds with three significant digits in the unit that suits them.
pub fn nanos(ns: f64) -> String {
    const UNITS: [(&str, f64); 3] = [("s", 1e9), ("ms", 1e6), ("µs", 1e3)];
    for (name, unit) in UNITS {
        if ns >= unit {
            return format!("{} {name}", three_digits(ns / unit));
        }
    }
    format!("{} ns", three_digits(ns))
}

/// A rate of events per second (`25.1 M events/s`).
pub fn rate_text(per_sec: f64) -> String {
    if per_sec >= 1e6 {
        format!("{} M events/s", three_digits(per_sec / 1e6))
    } else if per_sec >= 1e3 {
        format!("{} k events/s", three_digits(per_sec / 1e3))
    } else {
        format!("{} events/s", three_digits(per_sec))
    }
}

/// `x` with three significant digits (`1.23`, `12.3`, `123`).
fn three_digits(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(goal: Goal, a: f64, b: Option<f64>) -> Outcome {
        let mut o = Outcome::new("x.y", "something", goal, Unit::Time);
        o.allocview_ns = Some(a);
        o.baseline_ns = b;
        o
    }

    #[test]
    fn a_ratio_goal_is_met_at_or_below_the_ratio() {
        assert_eq!(
            measured(Goal::RatioAtMost(3.0), 30.0, Some(10.0)).met(),
            Some(true)
        );
        assert_eq!(
            measured(Goal::RatioAtMost(3.0), 31.0, Some(10.0)).met(),
            Some(false)
        );
        assert_eq!(measured(Goal::RatioAtMost(3.0), 31.0, None).met(), None);
    }

    #[test]
    fn a_rate_goal_is_judged_from_time_per_event() {
        // 40 ns per event is 25 M events/s.
        let goal = Goal::EventsPerSecAtLeast(20e6);
        assert_eq!(measured(goal, 40.0, None).met(), Some(true));
        assert_eq!(measured(goal, 60.0, None).met(), Some(false));
    }

    #[test]
    fn an_absolute_goal_ignores_the_baseline() {
        let o = measured(Goal::NanosAtMost(15.0), 9.0, Some(1.0));
        assert_eq!(o.met(), Some(true));
        assert_eq!(o.verdict(), "met");
    }

    #[test]
    fn an_informational_row_shows_its_figures_and_no_verdict() {
        let o = measured(Goal::Informational, 70.0, Some(35.0));
        assert_eq!(o.met(), None);
        assert_eq!(o.verdict(), "info");
        let t = to_table(&[o]);
        assert!(t.contains("2.00x") && t.contains("none"), "{t}");
    }

    #[test]
    fn a_skipped_benchmark_says_so_in_the_table_with_its_reason() {
        let o = Outcome::new("a.b", "python", Goal::FasterThanBaseline, Unit::Time)
            .note("fixture not found");
        let t = to_table(&[o]);
        assert!(t.contains("skipped"), "{t}");
        assert!(t.contains("note: fixture not found"), "{t}");
    }

    #[test]
    fn table_columns_line_up() {
        let rows = [
            measured(Goal::RatioAtMost(3.0), 12.5, Some(10.0)),
            measured(Goal::RatioAtMost(1.2), 12_345_678.0, Some(1_000.0)),
        ];
        let t = to_table(&rows);
        let lines: Vec<&str> = t.lines().take(4).collect();
        let col = |l: &str| l[..l.find("x  ").unwrap_or(0)].chars().count();
        assert!(
            lines[2].contains("12.5 ns") && lines[3].contains("12.3 ms"),
            "{t}"
        );
        assert_eq!(col(lines[2]), col(lines[3]), "{t}");
    }

    #[test]
    fn units_read_as_a_person_would_write_them() {
        assert_eq!(nanos(8.25), "8.25 ns");
        assert_eq!(nanos(1_250.0), "1.25 µs");
        assert_eq!(nanos(3_400_000.0), "3.40 ms");
        assert_eq!(rate_text(25_100_000.0), "25.1 M events/s");
    }

    #[test]
    fn json_has_every_field_and_nulls_for_missing_figures() {
        let o = measured(Goal::RatioAtMost(3.0), 20.0, None);
        let v: serde_json::Value = serde_json::from_str(&to_json(&[o])).unwrap();
        let row = &v[0];
        assert_eq!(row["name"], "x.y");
        assert_eq!(row["allocview_ns"], 20.0);
        assert!(row["baseline_ns"].is_null() && row["ratio"].is_null() && row["met"].is_null());
        assert_eq!(row["goal"], "<= 3x");
    }
}
