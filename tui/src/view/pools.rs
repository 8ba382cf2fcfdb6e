//! View 3, Pools: small, large and private pools with segments, reserved, allocated, active,
//! inactive split blocks (count / bytes), the largest free block and oversize allocations.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::{left, put, right, theme};
use crate::state::{State, UiState};
use crate::units;

/// Columns: title, width (the first left-aligned, the rest right-aligned).
const COLUMNS: [(&str, usize); 9] = [
    ("pool", 15),
    ("segments", 9),
    ("reserved", 10),
    ("allocated", 10),
    ("active", 10),
    ("inactive split (n/bytes)", 25),
    ("largest free", 13),
    ("oversize", 9),
    ("", 0),
];

/// Below this width the split and oversize columns are dropped (the byte figures stay).
const MIN_WIDTH_ALL_COLUMNS: u16 = 104;

/// Draws the pool table.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, _ui: &UiState) {
    let block = Block::bordered().title(Span::styled(" Pools ", theme::title()));
    let inner = block.inner(area);
    block.render(area, buf);
    let all = area.width >= MIN_WIDTH_ALL_COLUMNS;
    let keep = |i: usize| all || !matches!(i, 5 | 7);
    let mut head = String::new();
    for (i, (t, w)) in COLUMNS.iter().enumerate().filter(|(i, _)| keep(*i)) {
        if i == 0 {
            head.push_str(&left(&format!(" {t}"), *w));
        } else {
            head.push_str(&right(t, *w));
        }
    }
    put(buf, inner, 0, &Line::styled(head, theme::title()));
    for (r, row) in state.pool_rows().iter().enumerate() {
        let cells = [
            format!(" {}", row.kind.label()),
            units::count(row.segments),
            units::bytes(row.reserved),
            units::bytes(row.allocated),
            units::bytes(row.active),
            format!(
                "{} / {}",
                units::count(row.inactive_split),
                units::bytes(row.inactive_split_bytes)
            ),
            units::bytes(row.largest_free),
            row.oversize.map_or_else(|| "-".to_string(), units::count),
            String::new(),
        ];
        let mut line = String::new();
        for (i, c) in cells.iter().enumerate().filter(|(i, _)| keep(*i)) {
            let w = COLUMNS[i].1;
            if i == 0 {
                line.push_str(&left(c, w));
            } else {
                line.push_str(&right(c, w));
            }
        }
        put(buf, inner, r as u16 + 1, &Line::raw(line));
    }
    let first = state.pool_rows().len() as u16 + 2;
    // What the split and oversize columns mean, where they are shown.
    if all {
        super::put_wrapped(buf, inner, first, FOOTNOTE, theme::dim());
    }
}

/// The footnote of the split and oversize columns (wrapped at spaces to the width).
const FOOTNOTE: &str = "inactive split: free blocks inside segments that still hold live blocks; \
     empty_cache cannot release them. oversize: allocations of at least max_split_size (- = \
     unlimited).";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::testing::{buffer, rows};

    #[test]
    fn a_narrow_table_explains_no_column_it_dropped_and_cuts_no_word() {
        for (w, shown) in [(80u16, false), (104, true), (120, true)] {
            let mut buf = buffer(w, 12);
            render(buf.area, &mut buf, &State::default(), &UiState::default());
            let text = rows(&buf).join("\n");
            assert_eq!(text.contains("inactive split"), shown, "{text}");
            assert_eq!(text.contains("oversize"), shown, "{text}");
            if shown {
                assert!(text.contains("empty_cache") && text.contains("(- = unlimited)."));
                let all = rows(&buf);
                for r in &all[1..all.len() - 1] {
                    // A wrapped line ends in a whole word and a space before the border.
                    let chars: Vec<char> = r.chars().collect();
                    assert_eq!(chars[chars.len() - 2], ' ', "{r}");
                }
            }
        }
    }

    #[test]
    fn an_empty_state_lists_small_and_large() {
        let mut buf = buffer(110, 8);
        render(buf.area, &mut buf, &State::default(), &UiState::default());
        let r = rows(&buf);
        assert!(
            r[1].contains("pool") && r[1].contains("largest free"),
            "{}",
            r[1]
        );
        assert!(r[2].contains("small") && r[2].contains("0 B"));
        assert!(r[3].contains("large"));
    }
}
