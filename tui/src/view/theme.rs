//! One colour language everywhere (TUI.md): allocated green `█`, pending free yellow `▒`,
//! rounding waste dark green `▓`, free grey `░`, unmapped blank; OOMs, errors and dropped
//! events red.

use ratatui::style::{Color, Modifier, Style};

use allocview_alloc::snapshot::BlockState;

/// Glyph of allocated memory.
pub const ALLOCATED_GLYPH: &str = "█";
/// Glyph of pending-free memory.
pub const PENDING_GLYPH: &str = "▒";
/// Glyph of rounding waste inside an allocated block.
pub const WASTE_GLYPH: &str = "▓";
/// Glyph of free cached memory.
pub const FREE_GLYPH: &str = "░";
/// First cell of a block that directly follows a block of the same look (zoomed segments):
/// a half-cell gap in the block's own colour.
pub const BOUNDARY_GLYPH: &str = "▐";
/// Glyph of unmapped address space.
pub const UNMAPPED_GLYPH: &str = " ";

/// Allocated (active) memory.
pub const ALLOCATED: Color = Color::LightGreen;
/// Freed, waiting on another stream.
pub const PENDING: Color = Color::Yellow;
/// Rounding waste.
pub const WASTE: Color = Color::Green;
/// Free, cached.
pub const FREE: Color = Color::DarkGray;
/// Errors, OOMs, drops.
pub const ALERT: Color = Color::LightRed;
/// Reserved memory in charts.
pub const RESERVED: Color = Color::LightBlue;
/// Active memory in charts.
pub const ACTIVE: Color = Color::LightMagenta;
/// Panel titles and highlights.
pub const ACCENT: Color = Color::Cyan;

/// Style of panel titles.
pub fn title() -> Style {
    Style::new().fg(ACCENT).add_modifier(Modifier::BOLD)
}

/// Style of labels and secondary text.
pub fn dim() -> Style {
    Style::new().fg(Color::Gray)
}

/// Style of the selected row or tab.
pub fn selected() -> Style {
    Style::new().add_modifier(Modifier::REVERSED)
}

/// Style of alerts.
pub fn alert() -> Style {
    Style::new().fg(ALERT).add_modifier(Modifier::BOLD)
}

/// Style of a count that must turn red when not zero (drops, resyncs, OOMs).
pub fn alert_if(nonzero: bool) -> Style {
    if nonzero { alert() } else { Style::new() }
}

/// Glyph and colour of a block state.
pub fn block(state: BlockState) -> (&'static str, Color) {
    match state {
        BlockState::ActiveAllocated => (ALLOCATED_GLYPH, ALLOCATED),
        BlockState::ActivePendingFree => (PENDING_GLYPH, PENDING),
        BlockState::Inactive => (FREE_GLYPH, FREE),
    }
}
