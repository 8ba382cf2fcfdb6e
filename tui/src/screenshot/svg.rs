//! A buffer as SVG: one background `<rect>` per run of same-coloured cells, one `<text>` per
//! row with one `<tspan>` per run of same-styled cells, each placed at its column so the grid
//! holds whatever monospace font the viewer picks.

use std::fmt::Write as _;

use ratatui::buffer::Buffer;

use super::{DEFAULT_BG, Look, hex, look, rows};

/// Width of a cell in SVG units.
pub const CELL_W: f64 = 8.4;
/// Height of a cell.
pub const CELL_H: f64 = 17.0;
/// Font size.
const FONT_SIZE: f64 = 14.0;
/// Baseline offset inside a cell.
const BASELINE: f64 = 13.0;

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// Renders `buf` as an SVG document.
pub fn render(buf: &Buffer) -> String {
    let (w, h) = (
        buf.area.width as f64 * CELL_W,
        buf.area.height as f64 * CELL_H,
    );
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="{}"/>"#,
        hex(DEFAULT_BG)
    );
    let _ = writeln!(
        s,
        r#"<g font-family="'DejaVu Sans Mono','Menlo','Consolas',monospace" font-size="{FONT_SIZE}" xml:space="preserve">"#
    );
    for (y, row) in rows(buf).enumerate() {
        let top = y as f64 * CELL_H;
        // Backgrounds.
        let mut x = 0;
        while x < row.len() {
            let bg = look(row[x]).bg;
            let start = x;
            while x < row.len() && look(row[x]).bg == bg {
                x += 1;
            }
            if bg != DEFAULT_BG {
                let _ = writeln!(
                    s,
                    r#"<rect x="{:.1}" y="{top:.1}" width="{:.1}" height="{CELL_H}" fill="{}"/>"#,
                    start as f64 * CELL_W,
                    (x - start) as f64 * CELL_W,
                    hex(bg)
                );
            }
        }
        // Text runs.
        let mut text = String::new();
        let mut x = 0;
        while x < row.len() {
            let l: Look = look(row[x]);
            let start = x;
            let mut run = String::new();
            while x < row.len() {
                let lx = look(row[x]);
                if lx.fg != l.fg || lx.bold != l.bold {
                    break;
                }
                run.push_str(row[x].symbol());
                x += 1;
            }
            if run.trim().is_empty() {
                continue;
            }
            let weight = if l.bold { r#" font-weight="bold""# } else { "" };
            let _ = write!(
                text,
                r#"<tspan x="{:.1}" fill="{}"{weight}>{}</tspan>"#,
                start as f64 * CELL_W,
                hex(l.fg),
                escape(&run)
            );
        }
        if !text.is_empty() {
            let _ = writeln!(s, r#"<text y="{:.1}">{text}</text>"#, top + BASELINE);
        }
    }
    s.push_str("</g>\n</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::layout::Rect;
    use ratatui::style::{Color, Style};

    #[test]
    fn runs_of_the_same_style_share_a_tspan_and_backgrounds_a_rect() {
        let mut buf = Buffer::empty(Rect::new(0, 0, 10, 1));
        buf.set_string(0, 0, "ab<", Style::new().fg(Color::Red));
        buf.set_string(3, 0, "cd", Style::new().fg(Color::Green).bg(Color::Blue));
        let svg = render(&buf);
        assert!(
            svg.contains(r##"<tspan x="0.0" fill="#cd3131">ab&lt;</tspan>"##),
            "{svg}"
        );
        assert!(
            svg.contains(r##"<tspan x="25.2" fill="#0dbc79">cd</tspan>"##),
            "{svg}"
        );
        assert!(
            svg.contains(r##"<rect x="25.2" y="0.0" width="16.8" height="17" fill="#2472c8"/>"##),
            "{svg}"
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}
