//! Pictures of a rendered screen: a ratatui [`Buffer`] to SVG (text runs over background
//! rectangles, colours kept) and to PNG (the cells rasterised with the embedded `font8x8`
//! bitmap font, braille dots drawn procedurally; no system fonts).

pub mod png;
pub mod svg;

use ratatui::buffer::{Buffer, Cell};
use ratatui::style::{Color, Modifier};

/// An RGB colour.
pub type Rgb = [u8; 3];

/// Default foreground (a dark terminal theme's text).
pub const DEFAULT_FG: Rgb = [0xd4, 0xd4, 0xd4];
/// Default background.
pub const DEFAULT_BG: Rgb = [0x1e, 0x1e, 0x1e];

/// The 16 ANSI colours of a common dark theme (VS Code's), indexed as the terminal does.
const ANSI: [Rgb; 16] = [
    [0x00, 0x00, 0x00],
    [0xcd, 0x31, 0x31],
    [0x0d, 0xbc, 0x79],
    [0xe5, 0xe5, 0x10],
    [0x24, 0x72, 0xc8],
    [0xbc, 0x3f, 0xbc],
    [0x11, 0xa8, 0xcd],
    [0xe5, 0xe5, 0xe5],
    [0x66, 0x66, 0x66],
    [0xf1, 0x4c, 0x4c],
    [0x23, 0xd1, 0x8b],
    [0xf5, 0xf5, 0x43],
    [0x3b, 0x8e, 0xea],
    [0xd6, 0x70, 0xd6],
    [0x29, 0xb8, 0xdb],
    [0xff, 0xff, 0xff],
];

/// Levels of the 6x6x6 colour cube of the 256-colour palette.
const CUBE: [u8; 6] = [0, 95, 135, 175, 215, 255];
/// First index of the cube in the 256-colour palette.
const CUBE_START: u8 = 16;
/// First index of the grey ramp.
const GREY_START: u8 = 232;

/// The RGB of a terminal colour (`None`: the default).
pub fn rgb(c: Color) -> Option<Rgb> {
    Some(match c {
        Color::Reset => return None,
        Color::Black => ANSI[0],
        Color::Red => ANSI[1],
        Color::Green => ANSI[2],
        Color::Yellow => ANSI[3],
        Color::Blue => ANSI[4],
        Color::Magenta => ANSI[5],
        Color::Cyan => ANSI[6],
        Color::Gray => ANSI[7],
        Color::DarkGray => ANSI[8],
        Color::LightRed => ANSI[9],
        Color::LightGreen => ANSI[10],
        Color::LightYellow => ANSI[11],
        Color::LightBlue => ANSI[12],
        Color::LightMagenta => ANSI[13],
        Color::LightCyan => ANSI[14],
        Color::White => ANSI[15],
        Color::Rgb(r, g, b) => [r, g, b],
        Color::Indexed(i) if i < CUBE_START => ANSI[i as usize],
        Color::Indexed(i) if i < GREY_START => {
            let n = i - CUBE_START;
            [
                CUBE[(n / 36) as usize],
                CUBE[(n / 6 % 6) as usize],
                CUBE[(n % 6) as usize],
            ]
        }
        Color::Indexed(i) => {
            let v = 8 + (i - GREY_START) * 10;
            [v, v, v]
        }
    })
}

/// How one cell looks: its symbol and final colours (reversal applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Look {
    /// Foreground.
    pub fg: Rgb,
    /// Background.
    pub bg: Rgb,
    /// Bold.
    pub bold: bool,
}

/// The colours a cell is drawn with.
pub fn look(cell: &Cell) -> Look {
    let mut fg = rgb(cell.fg).unwrap_or(DEFAULT_FG);
    let mut bg = rgb(cell.bg).unwrap_or(DEFAULT_BG);
    // Faint text: halfway to the background, as terminals draw it.
    if cell.modifier.contains(Modifier::DIM) {
        fg = std::array::from_fn(|i| ((u16::from(fg[i]) + u16::from(bg[i])) / 2) as u8);
    }
    if cell.modifier.contains(Modifier::REVERSED) {
        std::mem::swap(&mut fg, &mut bg);
    }
    Look {
        fg,
        bg,
        bold: cell.modifier.contains(Modifier::BOLD),
    }
}

/// The cells of a buffer row by row.
pub fn rows(buf: &Buffer) -> impl Iterator<Item = Vec<&Cell>> {
    let a = buf.area;
    (a.y..a.y + a.height).map(move |y| (a.x..a.x + a.width).map(|x| &buf[(x, y)]).collect())
}

/// `#rrggbb`.
pub fn hex(c: Rgb) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn palette_covers_named_indexed_and_rgb_colours() {
        assert_eq!(rgb(Color::Reset), None);
        assert_eq!(rgb(Color::LightGreen), Some(ANSI[10]));
        assert_eq!(rgb(Color::Indexed(16)), Some([0, 0, 0]));
        assert_eq!(rgb(Color::Indexed(231)), Some([255, 255, 255]));
        assert_eq!(rgb(Color::Indexed(232)), Some([8, 8, 8]));
        assert_eq!(hex([1, 2, 255]), "#0102ff");
    }
}
