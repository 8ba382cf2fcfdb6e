//! View 2, Segments: one row per segment (largest first), its blocks drawn to scale across the
//! row and coloured by state (allocated `█`, rounding waste `▓`, pending free `▒`, free `░`);
//! the selected block's facts and frames in a side pane (PyTorch memory_viz's segment picture,
//! in a terminal).

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use allocview_alloc::snapshot::{BlockState, SegmentInfo, SegmentType};

use super::{put, right, theme};
use crate::state::ui::SegmentFilter;
use crate::state::{State, UiState};
use crate::units;

/// Width of the block detail pane.
pub const DETAIL_WIDTH: u16 = 38;
/// From this width the detail pane is always shown; below it only after Enter.
pub const MIN_WIDTH_WITH_DETAIL: u16 = 100;
/// Width of a row's label (`0x7f3a2c000000  200 MiB L s0 `).
const LABEL_WIDTH: usize = 30;
/// Key hints at the bottom of the list.
const HINTS: &str = "▲▼ select  ◀▶ block  Enter detail  f filter";

/// What one cell of a segment row shows, in increasing priority (a cell shared by blocks
/// shows the most important one, so a small allocation is never hidden by free space).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CellKind {
    /// Free, cached.
    Free,
    /// Rounding waste of an allocated block.
    Waste,
    /// Pending free.
    Pending,
    /// Allocated.
    Allocated,
}

impl CellKind {
    /// Glyph and colour.
    pub fn look(self) -> (&'static str, Color) {
        match self {
            CellKind::Free => (theme::FREE_GLYPH, theme::FREE),
            CellKind::Waste => (theme::WASTE_GLYPH, theme::WASTE),
            CellKind::Pending => (theme::PENDING_GLYPH, theme::PENDING),
            CellKind::Allocated => (theme::ALLOCATED_GLYPH, theme::ALLOCATED),
        }
    }
}

/// The cells `[c0, c1)` a byte range `[off, end)` of a `total`-byte segment covers in `width`
/// cells: at least one cell, however small the range.
fn cells(off: u64, end: u64, total: u64, width: usize) -> (usize, usize) {
    let scale = |b: u64| (b as u128 * width as u128 / total.max(1) as u128) as usize;
    let c0 = scale(off).min(width.saturating_sub(1));
    let c1 = ((end as u128 * width as u128).div_ceil(total.max(1) as u128) as usize)
        .clamp(c0 + 1, width.max(c0 + 1));
    (c0, c1.min(width))
}

/// Paints a segment into `width` cells; returns each cell's kind and the cell range of each
/// block.
pub fn paint(seg: &SegmentInfo, width: usize) -> (Vec<CellKind>, Vec<(usize, usize)>) {
    let mut out = vec![CellKind::Free; width];
    let mut ranges = Vec::with_capacity(seg.blocks.len());
    if width == 0 {
        return (out, vec![(0, 0); seg.blocks.len()]);
    }
    let total = seg.total_size;
    for b in &seg.blocks {
        let off = b.address.saturating_sub(seg.address);
        let end = off + b.size;
        let (c0, c1) = cells(off, end, total, width);
        ranges.push((c0, c1));
        let mut mark = |from: usize, to: usize, k: CellKind| {
            for c in &mut out[from.min(width)..to.min(width)] {
                *c = (*c).max(k);
            }
        };
        match b.state {
            BlockState::Inactive => mark(c0, c1, CellKind::Free),
            BlockState::ActivePendingFree => mark(c0, c1, CellKind::Pending),
            BlockState::ActiveAllocated => {
                let used = b.requested_size.min(b.size);
                let (_, cu) = cells(off, off + used.max(1), total, width);
                let cu = cu.clamp(c0 + 1, c1);
                mark(c0, cu, CellKind::Allocated);
                mark(cu, c1, CellKind::Waste);
            }
        }
    }
    (out, ranges)
}

fn pool_letter(seg: &SegmentInfo) -> &'static str {
    match seg.segment_type {
        SegmentType::Small => "S",
        SegmentType::Large => "L",
    }
}

/// A segment's label: `0x7f3a2c000000  200 MiB L s0 `.
pub fn label(seg: &SegmentInfo) -> String {
    format!(
        "{} {} {} s{:<3}",
        right(&units::address(seg.address), 14),
        right(&units::bytes(seg.total_size), 8),
        pool_letter(seg),
        seg.stream
    )
}

fn row_line(
    seg: &SegmentInfo,
    width: usize,
    selected: bool,
    block: Option<usize>,
) -> Line<'static> {
    let label = label(seg);
    let label_width = LABEL_WIDTH.min(width);
    let bar_width = width.saturating_sub(label_width);
    let mut spans = vec![Span::styled(
        super::left(&label, label_width),
        if selected {
            theme::selected()
        } else {
            Style::new()
        },
    )];
    let (kinds, ranges) = paint(seg, bar_width);
    let highlight = block.and_then(|b| ranges.get(b)).copied();
    // One span per run of same-looking cells.
    let mut run = String::new();
    let mut run_style = Style::new();
    for (i, k) in kinds.iter().enumerate() {
        let (glyph, color) = k.look();
        let mut style = Style::new().fg(color);
        if let Some((c0, c1)) = highlight
            && i >= c0
            && i < c1
        {
            style = style.add_modifier(Modifier::REVERSED);
        }
        if style != run_style && !run.is_empty() {
            spans.push(Span::styled(std::mem::take(&mut run), run_style));
        }
        run_style = style;
        run.push_str(glyph);
    }
    if !run.is_empty() {
        spans.push(Span::styled(run, run_style));
    }
    Line::from(spans)
}

/// First row shown so that `selected` is visible in `visible` rows.
pub fn scroll_offset(selected: usize, visible: usize) -> usize {
    if visible == 0 {
        0
    } else {
        selected.saturating_sub(visible - 1)
    }
}

fn detail_lines(seg: &SegmentInfo, block: usize) -> Vec<Line<'static>> {
    let Some(b) = seg.blocks.get(block) else {
        return vec![Line::styled(" no blocks", theme::dim())];
    };
    let kv = |k: &str, v: String| {
        Line::from(vec![
            Span::styled(format!(" {k:<10} "), theme::dim()),
            Span::raw(v),
        ])
    };
    let (glyph, color) = theme::block(b.state);
    let mut lines = vec![
        kv("size", units::bytes(b.size)),
        kv(
            "requested",
            if b.state == BlockState::Inactive {
                "-".into()
            } else {
                units::bytes(b.requested_size)
            },
        ),
        Line::from(vec![
            Span::styled(format!(" {:<10} ", "state"), theme::dim()),
            Span::styled(format!("{glyph} "), Style::new().fg(color)),
            Span::raw(match b.state {
                BlockState::ActiveAllocated => "allocated",
                BlockState::ActivePendingFree => "pending free",
                BlockState::Inactive => "free",
            }),
        ]),
    ];
    if b.state == BlockState::ActiveAllocated && b.size > b.requested_size {
        lines.push(kv("waste", units::bytes(b.size - b.requested_size)));
    }
    lines.push(kv("stream", seg.stream.to_string()));
    lines.push(kv(
        "segment",
        format!(
            "{} {}",
            units::address(seg.address),
            units::bytes(seg.total_size)
        ),
    ));
    lines.push(kv("pool", crate::state::PoolKind::of(seg).label()));
    lines.push(kv(
        "block",
        format!("{} of {}", block + 1, seg.blocks.len()),
    ));
    if !b.frames.is_empty() {
        lines.push(Line::styled(" allocated at", theme::dim()));
        for f in b.frames.iter() {
            let loc = if f.filename == "??" || f.filename.is_empty() {
                f.name.clone()
            } else {
                let file = f.filename.rsplit('/').next().unwrap_or(&f.filename);
                format!("{file}:{} {}", f.line, f.name)
            };
            lines.push(Line::raw(format!("   {loc}")));
        }
    }
    lines
}

/// Draws the segment view.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    let order = state.segment_order(ui.segment_filter);
    let show_detail = area.width >= MIN_WIDTH_WITH_DETAIL || ui.detail;
    let detail_width = if show_detail {
        DETAIL_WIDTH.min(area.width / 2)
    } else {
        0
    };
    let [list, detail] =
        Layout::horizontal([Constraint::Min(0), Constraint::Length(detail_width)]).areas(area);

    let mut filters = vec![Span::raw(" ")];
    for f in [
        SegmentFilter::Large,
        SegmentFilter::Small,
        SegmentFilter::All,
    ] {
        let style = if f == ui.segment_filter {
            theme::selected()
        } else {
            theme::dim()
        };
        filters.push(Span::styled(f.label(), style));
        filters.push(Span::raw(" "));
    }
    let block = Block::bordered()
        .title(Span::styled(
            format!(" Segments ({}, by size) ", units::count(order.len() as u64)),
            theme::title(),
        ))
        .title(Line::from(filters).right_aligned());
    let inner = block.inner(list);
    block.render(list, buf);
    if inner.height == 0 {
        return;
    }
    let visible = inner.height.saturating_sub(1) as usize;
    let selected = ui.segment_row.min(order.len().saturating_sub(1));
    let offset = scroll_offset(selected, visible);
    if order.is_empty() {
        put(buf, inner, 0, &Line::styled(" no segments", theme::dim()));
    }
    for (row, &i) in order.iter().skip(offset).take(visible).enumerate() {
        let is_sel = offset + row == selected;
        let line = row_line(
            &state.segments[i],
            inner.width as usize,
            is_sel,
            is_sel.then_some(ui.block),
        );
        put(buf, inner, row as u16, &line);
    }
    put(
        buf,
        inner,
        inner.height - 1,
        &Line::styled(format!(" {HINTS}"), theme::dim()),
    );

    if detail_width > 0 {
        let seg = order.get(selected).map(|&i| &state.segments[i]);
        let title =
            match seg.and_then(|s| s.blocks.get(ui.block.min(s.blocks.len().saturating_sub(1)))) {
                Some(b) => format!(" Block {} ", units::address(b.address)),
                None => " Block ".to_string(),
            };
        let block = Block::bordered().title(Span::styled(title, theme::title()));
        let inner = block.inner(detail);
        block.render(detail, buf);
        if let Some(seg) = seg {
            let b = ui.block.min(seg.blocks.len().saturating_sub(1));
            for (i, l) in detail_lines(seg, b).iter().enumerate() {
                put(buf, inner, i as u16, l);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fixtures::{block, segment};
    use crate::units::MIB;

    #[test]
    fn blocks_are_drawn_to_scale_and_tiny_blocks_still_show() {
        let seg = segment(
            0,
            0,
            SegmentType::Large,
            vec![
                block(0, 10 * MIB, 8 * MIB, BlockState::ActiveAllocated),
                block(10 * MIB, 5 * MIB, 5 * MIB, BlockState::ActivePendingFree),
                block(15 * MIB, 4 * MIB + 512 * 1024, 0, BlockState::Inactive),
                block(
                    19 * MIB + 512 * 1024,
                    512 * 1024,
                    512,
                    BlockState::ActiveAllocated,
                ),
            ],
        );
        let (kinds, ranges) = paint(&seg, 20);
        let s: String = kinds.iter().map(|k| k.look().0).collect();
        assert_eq!(s, "████████▓▓▒▒▒▒▒░░░░█");
        assert_eq!(ranges[0], (0, 10));
        assert_eq!(ranges[3], (19, 20));
    }

    #[test]
    fn zero_width_paints_nothing() {
        let seg = segment(
            0,
            0,
            SegmentType::Small,
            vec![block(0, 2 * MIB, 1, BlockState::ActiveAllocated)],
        );
        let (kinds, _) = paint(&seg, 0);
        assert!(kinds.is_empty());
    }
}
