//! Prose for people: text wrapped at spaces, a size's number and unit (`1.50 GiB`, as
//! [`human_bytes`](allocview_alloc::stats::human_bytes) writes it) never split. The dashboard
//! wraps to its boxes; the CLI reports (`summary`, `replay`) wrap long sentences to
//! [`REPORT_WIDTH`] with a hanging indent, so that they read in an 80- or 100-column terminal
//! and stay greppable by their first line.

use allocview_alloc::stats::is_byte_unit;

/// Columns the CLI reports wrap their sentences to.
pub const REPORT_WIDTH: usize = 100;

/// Narrowest width [`wrap`] wraps to.
const MIN_WIDTH: usize = 10;

/// The words of `text`, a size's number and its unit kept together as one.
fn words(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        let unit = is_byte_unit(word.trim_end_matches([',', ';', ')', ':', '.']));
        match out.last_mut() {
            Some(prev) if unit && prev.ends_with(|c: char| c.is_ascii_digit()) => {
                prev.push(' ');
                prev.push_str(word);
            }
            _ => out.push(word.to_string()),
        }
    }
    out
}

/// Splits `text` into lines of at most `width` characters at spaces (a single word longer
/// than that stays whole on its line).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    lines(text, width, "")
}

/// `text` as lines of at most `width` columns, each ending in a newline: the first as it
/// starts (its leading spaces kept), the others after those spaces and `indent`.
pub fn paragraph(text: &str, width: usize, indent: &str) -> String {
    let body = text.trim_start();
    let lead = &text[..text.len() - body.len()];
    let mut out = String::new();
    for l in lines(body, width.saturating_sub(lead.chars().count()), indent) {
        out.push_str(lead);
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// [`wrap`], the lines after the first starting with `indent`.
fn lines(text: &str, width: usize, indent: &str) -> Vec<String> {
    let width = width.max(MIN_WIDTH);
    let mut out = Vec::new();
    let mut line = String::new();
    // Whether `line` holds a word yet (beyond its indent).
    let mut has_word = false;
    for word in words(text) {
        if has_word && line.chars().count() + 1 + word.chars().count() > width {
            out.push(std::mem::replace(&mut line, indent.to_string()));
            has_word = false;
        }
        if has_word {
            line.push(' ');
        }
        line.push_str(&word);
        has_word = true;
    }
    if has_word {
        out.push(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_keeps_a_sizes_number_and_unit_together() {
        let text = "peak reserved 15.4 GiB of 16.0 GiB, 841 MiB; 512 B)";
        for width in 10..60 {
            for line in wrap(text, width) {
                assert!(
                    !line.ends_with(|c: char| c.is_ascii_digit()),
                    "{width}: {line:?}"
                );
                assert!(
                    !line.starts_with("GiB") && !line.starts_with("MiB") && !line.starts_with('B')
                );
            }
        }
        assert_eq!(
            wrap(text, 24),
            ["peak reserved 15.4 GiB", "of 16.0 GiB, 841 MiB;", "512 B)"].map(String::from)
        );
    }

    #[test]
    fn a_paragraph_indents_every_line_after_the_first_within_the_width() {
        let text = "recorded: first OOM at trace entry 2074 (426 MiB requested): exhaustion: \
                    live allocations hold 5.75 GiB of the 6.00 GiB this allocator may use";
        let p = paragraph(text, 40, "    ");
        let lines: Vec<&str> = p.lines().collect();
        assert!(lines.len() > 2, "{p}");
        assert!(lines[0].starts_with("recorded:"), "{p}");
        for l in &lines {
            assert!(l.chars().count() <= 40, "{l:?}");
        }
        for l in &lines[1..] {
            assert!(l.starts_with("    ") && !l.starts_with("     "), "{l:?}");
        }
        let words: Vec<&str> = p.split_whitespace().collect();
        assert_eq!(words.join(" "), text);
        assert_eq!(paragraph("short", 40, "  "), "short\n");
        assert_eq!(
            paragraph("  warning: one two three", 16, "  "),
            "  warning: one\n    two three\n"
        );
        assert_eq!(paragraph("", 40, "  "), "");
    }
}
