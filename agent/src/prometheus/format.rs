//! Which exposition format a scrape gets: content negotiation on the `Accept` header.
//!
//! Two text formats exist. Prometheus 2.x asks for OpenMetrics first
//! (`Accept: application/openmetrics-text;version=1.0.0,...,text/plain;version=0.0.4;q=0.5,
//! */*;q=0.1`); a plain `curl`, older scrapers and most other agents (Telegraf, Datadog, the
//! OpenTelemetry collector's receiver in its default mode) send no `Accept` or `*/*` and read
//! the classic text format (`text/plain; version=0.0.4`), whose counters are declared under
//! their `_total` sample name and which has no `# EOF`. The rule (as client_golang's
//! `expfmt.Negotiate`): OpenMetrics when the client lists `application/openmetrics-text` with a
//! quality at least as high as any range that covers `text/plain`; the classic format
//! otherwise, so a client that says nothing gets the format every reader understands.

/// The exposition format of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The classic Prometheus text format 0.0.4 (the default).
    Text,
    /// OpenMetrics 1.0.0 text.
    OpenMetrics,
}

/// The content type of the classic text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The content type of the OpenMetrics text format.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The media type that asks for OpenMetrics.
const OPENMETRICS_MEDIA_TYPE: &str = "application/openmetrics-text";

impl Format {
    /// The format for a request with this `Accept` header (`None`: no header).
    ///
    /// ```
    /// use allocview_agent::prometheus::Format;
    ///
    /// let prometheus = "application/openmetrics-text;version=1.0.0,\
    ///     application/openmetrics-text;version=0.0.1;q=0.75,\
    ///     text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    /// assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
    /// assert_eq!(Format::negotiate(None), Format::Text);
    /// assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
    /// ```
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Text;
        };
        let mut openmetrics = 0.0f64;
        let mut text = 0.0f64;
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let quality = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, v)| v.trim().parse::<f64>().unwrap_or(0.0));
            match media.as_str() {
                OPENMETRICS_MEDIA_TYPE => openmetrics = openmetrics.max(quality),
                "text/plain" | "text/*" | "*/*" => text = text.max(quality),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    /// The `Content-Type` of a page in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => TEXT_CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_goes_to_clients_that_rank_it_first_and_text_to_everyone_else() {
        for (accept, expected) in [
            ("application/openmetrics-text", Format::OpenMetrics),
            (
                "application/openmetrics-text; version=0.0.1; q=0.75, text/plain; q=0.5",
                Format::OpenMetrics,
            ),
            ("text/plain;version=0.0.4", Format::Text),
            (
                "text/plain, application/openmetrics-text;q=0.5",
                Format::Text,
            ),
            ("application/openmetrics-text;q=0", Format::Text),
            ("application/openmetrics-text;q=nonsense", Format::Text),
            ("application/json", Format::Text),
            ("", Format::Text),
        ] {
            assert_eq!(Format::negotiate(Some(accept)), expected, "{accept}");
        }
    }
}
