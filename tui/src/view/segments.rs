//! View 2, Segments: one row per segment (largest first), its blocks drawn to scale across the
//! row and coloured by state (allocated `█`, rounding waste `▓`, pending free `▒`, free `░`);
//! the selected block's facts and frames in a side pane (PyTorch memory_viz's segment picture,
//! in a terminal).
//!
//! `z` zooms into the selected segment: it fills the list area, one row per equal slice of its
//! address range (the label gives each slice's address and offset), so blocks that are a
//! fraction of a cell in a 2 GiB segment's single row get cells of their own. Where a block
//! directly follows another block of the same look, its first cell is the boundary glyph `▐`
//! in that colour; the selected block is highlighted; past the segment's end is blank.

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
pub const HINTS: &str = "▲▼ select  ◀▶ block  Enter detail  f filter  z zoom";
/// Key hints at the bottom of a zoomed segment.
pub const ZOOM_HINTS: &str = "▲▼ segment  ◀▶ block  Enter detail  z/Esc back";
/// Fewest bytes a zoomed row covers (the allocator's block granularity).
pub const ZOOM_MIN_ROW: u64 = 512;

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

/// The cells `[c0, c1)` a byte range `[off, end)` of a `total`-byte span covers in `width`
/// cells: at least one cell, however small the range.
fn cells(off: u64, end: u64, total: u64, width: usize) -> (usize, usize) {
    let scale = |b: u64| (b as u128 * width as u128 / total.max(1) as u128) as usize;
    let c0 = scale(off).min(width.saturating_sub(1));
    let c1 = ((end as u128 * width as u128).div_ceil(total.max(1) as u128) as usize)
        .clamp(c0 + 1, width.max(c0 + 1));
    (c0, c1.min(width))
}

/// A slice of a segment painted into cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Painted {
    /// Each cell's kind; `None` past the segment's end.
    pub kinds: Vec<Option<CellKind>>,
    /// Per block, the cells `[c0, c1)` it covers in this slice (`None`: not in the slice).
    pub ranges: Vec<Option<(usize, usize)>>,
    /// Cells where a block starts right after another block of the same look.
    pub boundaries: Vec<usize>,
}

/// Paints the bytes `[from, from + span)` of `seg` (offsets from its start) into `width` cells.
pub fn paint_slice(seg: &SegmentInfo, from: u64, span: u64, width: usize) -> Painted {
    let mut kinds: Vec<Option<CellKind>> = vec![None; width];
    let mut ranges = vec![None; seg.blocks.len()];
    let mut boundaries = Vec::new();
    let span = span.max(1);
    let to = from.saturating_add(span);
    let inside = seg.total_size.min(to).saturating_sub(from);
    if width == 0 || inside == 0 {
        return Painted {
            kinds,
            ranges,
            boundaries,
        };
    }
    let (_, seg_end) = cells(0, inside, span, width);
    for k in &mut kinds[..seg_end] {
        *k = Some(CellKind::Free);
    }
    let mut prev_end_kind: Option<(u64, CellKind)> = None;
    let mut prev_c1: Option<usize> = None;
    for (i, b) in seg.blocks.iter().enumerate() {
        let b_off = b.address.saturating_sub(seg.address);
        let b_end = b_off + b.size;
        let (first, last) = match b.state {
            BlockState::Inactive => (CellKind::Free, CellKind::Free),
            BlockState::ActivePendingFree => (CellKind::Pending, CellKind::Pending),
            BlockState::ActiveAllocated if b.requested_size >= b.size => {
                (CellKind::Allocated, CellKind::Allocated)
            }
            BlockState::ActiveAllocated => (CellKind::Allocated, CellKind::Waste),
        };
        let follows_same = prev_end_kind == Some((b_off, first));
        prev_end_kind = Some((b_end, last));
        if b_end <= from || b_off >= to {
            continue;
        }
        let off = b_off.max(from) - from;
        let end = b_end.min(to) - from;
        let (c0, c1) = cells(off, end, span, width);
        ranges[i] = Some((c0, c1));
        // A boundary only where this block has its first cell to itself.
        let own_first = prev_c1.is_none_or(|p| p <= c0);
        prev_c1 = Some(c1);
        let mut mark = |a: usize, z: usize, k: CellKind| {
            for c in kinds[a.min(width)..z.min(width)].iter_mut().flatten() {
                *c = (*c).max(k);
            }
        };
        match b.state {
            BlockState::Inactive => mark(c0, c1, CellKind::Free),
            BlockState::ActivePendingFree => mark(c0, c1, CellKind::Pending),
            BlockState::ActiveAllocated => {
                // The used part `[b_off, b_off + requested)`, at least one byte.
                let used_end = b_off + b.requested_size.min(b.size).max(1);
                if used_end <= from {
                    mark(c0, c1, CellKind::Waste);
                } else {
                    let (_, cu) = cells(off, used_end.min(to) - from, span, width);
                    let cu = cu.clamp(c0 + 1, c1);
                    mark(c0, cu, CellKind::Allocated);
                    mark(cu, c1, CellKind::Waste);
                }
            }
        }
        if follows_same && own_first && b_off >= from && c1 > c0 + 1 {
            boundaries.push(c0);
        }
    }
    Painted {
        kinds,
        ranges,
        boundaries,
    }
}

/// Paints a segment into `width` cells; returns each cell's kind and the cell range of each
/// block.
pub fn paint(seg: &SegmentInfo, width: usize) -> (Vec<CellKind>, Vec<(usize, usize)>) {
    let p = paint_slice(seg, 0, seg.total_size, width);
    (
        p.kinds
            .into_iter()
            .map(|k| k.unwrap_or(CellKind::Free))
            .collect(),
        p.ranges.into_iter().map(|r| r.unwrap_or((0, 0))).collect(),
    )
}

/// How a zoomed segment is laid out in the list's inner area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoomLayout {
    /// Rows used for slices (the last row of the area holds the key hints).
    pub rows: usize,
    /// Bytes each row covers.
    pub row_bytes: u64,
    /// Width of a row's label.
    pub label_width: usize,
    /// Width of a row's bar.
    pub bar_width: usize,
}

/// The smallest round row size of at least `need` bytes: a power of two or one and a half
/// times one (4, 6, 8, 12, 16 MiB ...), so rows start at round addresses and a segment uses at
/// least two thirds of the rows it is given.
pub fn round_row_bytes(need: u64) -> u64 {
    let need = need.max(ZOOM_MIN_ROW);
    let pow = need.next_power_of_two();
    let three_halves = pow / 4 * 3;
    if three_halves >= need {
        three_halves
    } else {
        pow
    }
}

/// The zoom layout of `seg` in an inner area of `width` x `height` cells.
pub fn zoom_layout(seg: &SegmentInfo, width: usize, height: usize) -> ZoomLayout {
    let slots = height.saturating_sub(1).max(1) as u64;
    let row_bytes = round_row_bytes(seg.total_size.div_ceil(slots));
    let label_width = LABEL_WIDTH.min(width);
    ZoomLayout {
        rows: seg.total_size.div_ceil(row_bytes).max(1) as usize,
        row_bytes,
        label_width,
        bar_width: width.saturating_sub(label_width),
    }
}

/// The block of a zoomed `seg` drawn at cell (`col`, `row`) of the list's inner area of
/// `width` x `height` cells (`None` off the bars or past the segment's end).
pub fn zoom_block_at(
    seg: &SegmentInfo,
    width: usize,
    height: usize,
    col: usize,
    row: usize,
) -> Option<usize> {
    let z = zoom_layout(seg, width, height);
    if row >= z.rows.min(height.saturating_sub(1)) || col < z.label_width || z.bar_width == 0 {
        return None;
    }
    let cell = (col - z.label_width) as u64;
    let off = row as u64 * z.row_bytes
        + (cell as u128 * z.row_bytes as u128 / z.bar_width as u128) as u64;
    let addr = seg.address + off;
    // A tiny block drawn over a whole cell wins the cell, as in the picture.
    let p = paint_slice(seg, row as u64 * z.row_bytes, z.row_bytes, z.bar_width);
    let c = cell as usize;
    let hit = |i: usize| p.ranges[i].is_some_and(|(c0, c1)| c >= c0 && c < c1);
    let drawn = p.kinds.get(c).copied().flatten()?;
    seg.blocks
        .iter()
        .enumerate()
        .filter(|&(i, _)| hit(i))
        .find(|(_, b)| {
            let looks = match b.state {
                BlockState::Inactive => CellKind::Free,
                BlockState::ActivePendingFree => CellKind::Pending,
                BlockState::ActiveAllocated => CellKind::Allocated,
            };
            looks == drawn || (drawn == CellKind::Waste && looks == CellKind::Allocated)
        })
        .map(|(i, _)| i)
        .or_else(|| {
            seg.blocks
                .iter()
                .position(|b| addr >= b.address && addr < b.address + b.size)
        })
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
    let cells = kinds.iter().map(|k| {
        let (glyph, color) = k.look();
        (glyph, Style::new().fg(color))
    });
    push_cell_runs(&mut spans, cells, highlight);
    Line::from(spans)
}

/// Appends cells as one span per run of same-looking cells, the cells in `highlight` (a
/// `[first, end)` range of cell indices) reversed.
fn push_cell_runs<'g>(
    spans: &mut Vec<Span<'static>>,
    cells: impl Iterator<Item = (&'g str, Style)>,
    highlight: Option<(usize, usize)>,
) {
    let mut run = String::new();
    let mut run_style = Style::new();
    for (i, (glyph, mut style)) in cells.enumerate() {
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
        let (stack, hidden) = crate::state::context::user_stack(&b.frames);
        lines.extend(stack.into_iter().map(|l| Line::raw(format!("   {l}"))));
        if hidden > 0 {
            lines.push(Line::styled(
                format!("   (+{hidden} library frames hidden)"),
                theme::dim(),
            ));
        }
    } else if b.state.is_active() {
        // Say so rather than leave the pane blank: PyTorch records no frames for blocks
        // allocated before `_record_memory_history`, nor an allocator without context.
        lines.push(Line::styled(" allocated at  not recorded", theme::dim()));
    }
    lines
}

/// One row of a zoomed segment: its slice's address and offset, then the slice's cells.
fn zoom_row_line(seg: &SegmentInfo, z: &ZoomLayout, row: usize, block: usize) -> Line<'static> {
    let from = row as u64 * z.row_bytes;
    let p = paint_slice(seg, from, z.row_bytes, z.bar_width);
    let selected = p.ranges.get(block).copied().flatten();
    // The label is highlighted on the row where the selected block starts.
    let starts_here = seg.blocks.get(block).is_some_and(|b| {
        let off = b.address.saturating_sub(seg.address);
        off >= from && off < from + z.row_bytes
    });
    let label = format!(
        "{} +{} ",
        right(&units::address(seg.address + from), 14),
        right(&units::bytes(from), 8)
    );
    let mut spans = vec![Span::styled(
        super::left(&label, z.label_width),
        if starts_here {
            theme::selected()
        } else {
            theme::dim()
        },
    )];
    let cells = p.kinds.iter().enumerate().map(|(i, k)| match k {
        Some(k) => {
            let (glyph, color) = k.look();
            let glyph = if p.boundaries.contains(&i) {
                theme::BOUNDARY_GLYPH
            } else {
                glyph
            };
            (glyph, Style::new().fg(color))
        }
        None => (theme::UNMAPPED_GLYPH, Style::new()),
    });
    push_cell_runs(&mut spans, cells, selected);
    Line::from(spans)
}

/// Draws the selected segment zoomed into `list`.
fn render_zoom(list: Rect, buf: &mut Buffer, seg: &SegmentInfo, block: usize) {
    let inner_w = list.width.saturating_sub(2) as usize;
    let inner_h = list.height.saturating_sub(2) as usize;
    let z = zoom_layout(seg, inner_w, inner_h);
    let frame = Block::bordered()
        .title(Span::styled(
            format!(
                " Segment {} {} {} s{} · zoom {}/row ",
                units::address(seg.address),
                units::bytes(seg.total_size),
                pool_letter(seg),
                seg.stream,
                units::bytes(z.row_bytes)
            ),
            theme::title(),
        ))
        .title(
            Line::styled(
                format!(" {} blocks ", units::count(seg.blocks.len() as u64)),
                theme::dim(),
            )
            .right_aligned(),
        );
    let inner = frame.inner(list);
    frame.render(list, buf);
    if inner.height == 0 {
        return;
    }
    for row in 0..z.rows.min(inner.height.saturating_sub(1) as usize) {
        put(buf, inner, row as u16, &zoom_row_line(seg, &z, row, block));
    }
    put(
        buf,
        inner,
        inner.height - 1,
        &Line::styled(format!(" {ZOOM_HINTS}"), theme::dim()),
    );
}

/// The view's list (left) and detail pane (right; zero-wide when hidden).
fn split(area: Rect, ui: &UiState) -> [Rect; 2] {
    let show_detail = area.width >= MIN_WIDTH_WITH_DETAIL || ui.detail;
    let detail_width = if show_detail {
        DETAIL_WIDTH.min(area.width / 2)
    } else {
        0
    };
    Layout::horizontal([Constraint::Min(0), Constraint::Length(detail_width)]).areas(area)
}

/// The list part of the segment view, inside its border (the detail pane takes the rest).
pub fn list_inner(area: Rect, ui: &UiState) -> Rect {
    let [list, _] = split(area, ui);
    Block::bordered().inner(list)
}

/// Draws the segment view.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    let (order, selected) = state.segment_selection(ui);
    let [list, detail] = split(area, ui);
    let zoomed = order.get(selected).filter(|_| ui.zoom);
    if let Some(&i) = zoomed {
        let seg = &state.segments[i];
        render_zoom(
            list,
            buf,
            seg,
            ui.block.min(seg.blocks.len().saturating_sub(1)),
        );
    } else {
        render_list(list, buf, state, ui, &order, selected);
    }
    render_detail(detail, buf, state, ui, &order, selected);
}

fn render_list(
    list: Rect,
    buf: &mut Buffer,
    state: &State,
    ui: &UiState,
    order: &[usize],
    selected: usize,
) {
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
}

fn render_detail(
    detail: Rect,
    buf: &mut Buffer,
    state: &State,
    ui: &UiState,
    order: &[usize],
    selected: usize,
) {
    if detail.width > 0 {
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

    /// The detail pane's lines from "allocated at" on, as text.
    fn frame_lines(seg: &SegmentInfo, block: usize) -> Vec<String> {
        let text: Vec<String> = detail_lines(seg, block)
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect();
        let from = text
            .iter()
            .position(|l| l.starts_with(" allocated at"))
            .unwrap_or(text.len());
        text[from..].to_vec()
    }

    #[test]
    fn the_detail_pane_shows_user_frames_says_when_none_were_recorded_and_none_for_free() {
        use allocview_alloc::snapshot::Frame;
        let mut with = block(0, 2 * MIB, 2 * MIB, BlockState::ActiveAllocated);
        with.frames = std::sync::Arc::from(vec![
            Frame::new("step 3 backward", "", 0),
            Frame::new("torch::unwind::unwind()", "??", 0),
            Frame::new("_PyEval_EvalFrameDefault", "??", 0),
            Frame::new("forward", "/home/me/model.py", 88),
            Frame::new("<module>", "/home/me/train.py", 130),
        ]);
        let without = allocview_alloc::snapshot::BlockInfo::new(
            2 * MIB,
            MIB,
            MIB,
            BlockState::ActiveAllocated,
        );
        let free = allocview_alloc::snapshot::BlockInfo::new(3 * MIB, MIB, 0, BlockState::Inactive);
        let seg = segment(0, 0, SegmentType::Large, vec![with, without, free]);
        assert_eq!(
            frame_lines(&seg, 0),
            [
                " allocated at",
                "   step 3 backward",
                "   model.py:88 forward",
                "   train.py:130 <module>",
                "   (+2 library frames hidden)",
            ]
        );
        assert_eq!(frame_lines(&seg, 1), [" allocated at  not recorded"]);
        assert!(frame_lines(&seg, 2).is_empty());
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

    #[test]
    fn a_zoomed_two_gib_segment_gives_small_blocks_cells_and_boundaries() {
        use crate::units::GIB;
        // 2 GiB: two adjacent 1 MiB allocations, a free gap, a 512 B block, the rest free.
        let base = 0x7f00_0000_0000;
        let seg = segment(
            base,
            0,
            SegmentType::Large,
            vec![
                block(base, MIB, MIB, BlockState::ActiveAllocated),
                block(base + MIB, MIB, MIB, BlockState::ActiveAllocated),
                block(base + 2 * MIB, 62 * MIB, 0, BlockState::Inactive),
                block(base + 64 * MIB, 512, 512, BlockState::ActivePendingFree),
                block(
                    base + 64 * MIB + 512,
                    2 * GIB - 64 * MIB - 512,
                    0,
                    BlockState::Inactive,
                ),
            ],
        );
        // Unzoomed, 90 cells: the first three blocks share one cell.
        let (_, ranges) = paint(&seg, 90);
        assert_eq!((ranges[0], ranges[1]), ((0, 1), (0, 1)));
        // Zoomed into 32 rows of 90 cells: 64 MiB a row, so the first row alone holds the
        // two allocations (side by side, a boundary between them), the gap and nothing else.
        let z = zoom_layout(&seg, 120, 33);
        assert_eq!(round_row_bytes(2 * GIB / 32), 64 * MIB);
        assert_eq!((z.rows, z.row_bytes, z.bar_width), (32, 64 * MIB, 90));
        let row0 = paint_slice(&seg, 0, z.row_bytes, z.bar_width);
        assert_eq!(row0.ranges[0], Some((0, 2)));
        assert_eq!(row0.ranges[1], Some((1, 3)));
        assert_eq!(row0.boundaries, Vec::<usize>::new(), "cell 1 is shared");
        let row0 = paint_slice(&seg, 0, z.row_bytes, 64 * 4);
        assert_eq!(row0.ranges[1], Some((4, 8)));
        assert_eq!(row0.boundaries, vec![4]);
        assert_eq!(row0.kinds[4], Some(CellKind::Allocated));
        // The 512 B pending free starts row 1 and gets its own cell.
        let row1 = paint_slice(&seg, z.row_bytes, z.row_bytes, z.bar_width);
        assert_eq!(row1.ranges[3], Some((0, 1)));
        assert_eq!(row1.kinds[0], Some(CellKind::Pending));
        assert_eq!(row1.ranges[0], None);
        // A slice running past the end is blank there.
        let tail = paint_slice(&seg, 2 * GIB - MIB, 2 * MIB, 10);
        assert_eq!(tail.kinds[4], Some(CellKind::Free));
        assert_eq!(tail.kinds[5], None);
    }

    #[test]
    fn zoomed_rows_cover_round_sizes() {
        assert_eq!(round_row_bytes(0), ZOOM_MIN_ROW);
        assert_eq!(round_row_bytes(7 * MIB), 8 * MIB);
        assert_eq!(round_row_bytes(6 * MIB), 6 * MIB);
        assert_eq!(round_row_bytes(5 * MIB), 6 * MIB);
        assert_eq!(round_row_bytes(4 * MIB), 4 * MIB);
        assert_eq!(round_row_bytes(4 * MIB + 1), 6 * MIB);
    }

    #[test]
    fn a_click_on_a_zoomed_cell_finds_the_block_drawn_there() {
        let seg = segment(
            0,
            0,
            SegmentType::Large,
            vec![
                block(0, 10 * MIB, 10 * MIB, BlockState::ActiveAllocated),
                block(10 * MIB, 512, 512, BlockState::ActiveAllocated),
                block(10 * MIB + 512, 10 * MIB - 512, 0, BlockState::Inactive),
            ],
        );
        // 40 wide (label 30, bar 10), 7 high: 6 slots, 5 rows of 4 MiB, 0.4 MiB a cell.
        let z = zoom_layout(&seg, 40, 7);
        assert_eq!((z.row_bytes, z.rows), (4 * MIB, 5));
        assert_eq!(zoom_block_at(&seg, 40, 7, 30, 0), Some(0));
        // Row 2 starts at 8 MiB: cell 5 (10 MiB) is the 512 B block, drawn over the free one.
        assert_eq!(zoom_block_at(&seg, 40, 7, 34, 2), Some(0));
        assert_eq!(zoom_block_at(&seg, 40, 7, 35, 2), Some(1));
        assert_eq!(zoom_block_at(&seg, 40, 7, 36, 2), Some(2));
        assert_eq!(zoom_block_at(&seg, 40, 7, 29, 2), None, "the label");
        assert_eq!(zoom_block_at(&seg, 40, 7, 30, 5), None, "past the segment");
        assert_eq!(zoom_block_at(&seg, 40, 7, 30, 6), None, "the hints row");
    }
}
