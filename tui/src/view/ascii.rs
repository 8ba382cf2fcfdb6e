//! The screen in ASCII for a terminal whose locale is not UTF-8 (`LANG=C`, `LC_ALL=POSIX`,
//! `en_US.ISO-8859-1`): there the box drawing, the block glyphs and the chart's braille would
//! arrive as bytes the terminal shows as garbage, several cells each. Like
//! [`super::theme::strip_colors`], a pass over the drawn buffer: every symbol outside ASCII
//! becomes one ASCII character that keeps its role (`-` `|` `+` for the box drawing, `#` `%`
//! `=` `.` for allocated, pending, waste and free, `*` for the chart's dots, `<` `>` `^` `v`
//! for the arrows), so that the layout (one cell each) is kept.
//!
//! Only a locale set to something other than UTF-8 asks for it: an unset locale (common in
//! containers, whose terminals are UTF-8 all the same) keeps the Unicode screen.

use std::ffi::OsStr;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;

/// The locale variables, in the order the C library reads them for the character set: the
/// first one set (and not empty) decides.
pub const LOCALE_VARS: [&str; 3] = ["LC_ALL", "LC_CTYPE", "LANG"];

/// Whether the locale variables' values (in [`LOCALE_VARS`]' order) ask for ASCII: the first
/// one set and not empty names another character set than UTF-8.
pub fn ascii_requested(values: [Option<&OsStr>; 3]) -> bool {
    let Some(locale) = values.into_iter().flatten().find(|v| !v.is_empty()) else {
        return false;
    };
    let locale = locale.to_string_lossy().to_ascii_lowercase();
    !(locale.contains("utf-8") || locale.contains("utf8"))
}

/// Whether this process's environment asks for ASCII ([`ascii_requested`]).
pub fn ascii_requested_by_env() -> bool {
    let values = LOCALE_VARS.map(std::env::var_os);
    ascii_requested([
        values[0].as_deref(),
        values[1].as_deref(),
        values[2].as_deref(),
    ])
}

/// The ASCII character drawn for `c` (itself when ASCII already).
pub fn ascii_symbol(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    match c {
        // Box drawing: horizontal, vertical, the rest are corners and joints.
        '─' | '━' | '═' | '╌' | '╍' | '┄' | '┅' | '┈' | '┉' => '-',
        '│' | '┃' | '║' | '╎' | '╏' | '┆' | '┇' | '┊' | '┋' => '|',
        '\u{2500}'..='\u{257f}' => '+',
        // Blocks: allocated, pending free, rounding waste, free (theme's glyphs).
        '█' => '#',
        '▒' => '%',
        '▓' => '=',
        '░' => '.',
        '▐' | '▌' | '¦' => '|',
        '\u{2580}'..='\u{259f}' => '#',
        // The chart's braille dots: any dot is a mark, none is blank.
        '\u{2800}' => ' ',
        '\u{2801}'..='\u{28ff}' => '*',
        '●' | '•' => '*',
        '○' | '◌' => 'o',
        '▲' | '↑' => '^',
        '▼' | '↓' => 'v',
        '◀' | '←' | '≤' => '<',
        '▶' | '→' | '≥' => '>',
        '·' | '…' => '.',
        '—' | '–' => '-',
        '×' => 'x',
        'µ' => 'u',
        '±' => '~',
        '⚠' => '!',
        _ => '?',
    }
}

/// Replaces every symbol outside ASCII in `area` of `buf` by [`ascii_symbol`] of it.
pub fn to_ascii(buf: &mut Buffer, area: Rect) {
    let area = area.intersection(buf.area);
    for y in area.top()..area.bottom() {
        for x in area.left()..area.right() {
            let cell = &mut buf[(x, y)];
            let symbol = cell.symbol();
            if symbol.is_ascii() {
                continue;
            }
            let mapped: String = symbol.chars().map(ascii_symbol).take(1).collect();
            cell.set_symbol(&mapped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asks(values: [Option<&str>; 3]) -> bool {
        ascii_requested(values.map(|v| v.map(OsStr::new)))
    }

    #[test]
    fn only_a_locale_set_to_another_character_set_asks_for_ascii() {
        assert!(!asks([None, None, None]), "unset: the terminal decides");
        assert!(!asks([None, None, Some("C.UTF-8")]));
        assert!(!asks([None, None, Some("en_US.utf8")]));
        assert!(asks([None, None, Some("C")]));
        assert!(
            asks([Some("POSIX"), None, Some("en_US.UTF-8")]),
            "LC_ALL first"
        );
        assert!(
            !asks([Some(""), Some("en_GB.UTF-8"), Some("C")]),
            "empty is unset"
        );
        assert!(asks([None, Some("en_US.ISO-8859-1"), None]));
    }

    #[test]
    fn every_symbol_becomes_one_ascii_character() {
        for c in [
            '─', '┌', '┐', '└', '┘', '│', '█', '▒', '▓', '░', '⣿', '●', '→', '…', 'µ',
        ] {
            assert!(ascii_symbol(c).is_ascii(), "{c}");
        }
        assert_eq!(ascii_symbol('┌'), '+');
        assert_eq!(ascii_symbol('█'), '#');
        assert_eq!(ascii_symbol('\u{2800}'), ' ');
        assert_eq!(ascii_symbol('q'), 'q');
    }
}
