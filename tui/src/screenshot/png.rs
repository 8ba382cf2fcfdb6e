//! A buffer as PNG: every cell an 8x16 pixel block, glyphs from the embedded `font8x8`
//! bitmap font (basic Latin, Latin-1, Greek, box drawing, block elements) drawn two pixel rows
//! per font row, braille patterns and a few symbols the font lacks drawn procedurally.

use font8x8::UnicodeFonts as _;
use ratatui::buffer::Buffer;

use super::{Rgb, look, rows};

/// Cell width in pixels.
pub const CELL_W: usize = 8;
/// Cell height in pixels (the 8x8 font doubled vertically).
pub const CELL_H: usize = 16;

/// A cell's pixels, row by row, `true` for foreground.
type Glyph = [[bool; CELL_W]; CELL_H];

fn from_font(rows8: [u8; 8]) -> Glyph {
    let mut g = [[false; CELL_W]; CELL_H];
    for (r, bits) in rows8.iter().enumerate() {
        // font8x8: bit 0 is the leftmost pixel; each font row fills two pixel rows.
        let row: [bool; CELL_W] = std::array::from_fn(|c| bits & (1 << c) != 0);
        g[2 * r] = row;
        g[2 * r + 1] = row;
    }
    g
}

/// Braille: dots 1-3 and 7 down the left column, 4-6 and 8 down the right.
fn braille(bits: u8) -> Glyph {
    const DOTS: [(usize, usize); 8] = [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
        (0, 3),
        (1, 3),
    ];
    let mut g = [[false; CELL_W]; CELL_H];
    for (i, &(col, row)) in DOTS.iter().enumerate() {
        if bits & (1 << i) != 0 {
            let (x, y) = (1 + col * 4, 1 + row * 4);
            for dy in 0..2 {
                for dx in 0..2 {
                    g[y + dy][x + dx] = true;
                }
            }
        }
    }
    g
}

/// Shapes for symbols outside the font: discs, circles and triangles.
fn shape(c: char) -> Option<Glyph> {
    let mut g = [[false; CELL_W]; CELL_H];
    let (cx, cy) = (3.5f64, 7.5f64);
    match c {
        '●' | '○' | '◌' | '•' => {
            for (y, row) in g.iter_mut().enumerate() {
                for (x, px) in row.iter_mut().enumerate() {
                    let d = ((x as f64 - cx).powi(2) + ((y as f64 - cy) / 1.6).powi(2)).sqrt();
                    *px = match c {
                        '●' | '•' => d <= 3.2,
                        '○' => (2.2..=3.3).contains(&d),
                        _ => (2.2..=3.3).contains(&d) && (x + y) % 2 == 0,
                    };
                }
            }
        }
        '▲' | '▼' | '◀' | '▶' => {
            for (y, row) in g.iter_mut().enumerate().skip(3).take(10) {
                let t = y - 3;
                for (x, px) in row.iter_mut().enumerate() {
                    let (along, across) = match c {
                        '▲' => (t as f64, x as f64),
                        '▼' => (9.0 - t as f64, x as f64),
                        '◀' => (x as f64 * 1.2, t as f64 * 0.8),
                        _ => ((7 - x) as f64 * 1.2, t as f64 * 0.8),
                    };
                    *px = (across - 3.5).abs() <= along * 0.4;
                }
            }
        }
        _ => return None,
    }
    Some(g)
}

/// The glyph of a symbol (a hollow box when nothing draws it).
fn glyph(sym: &str) -> Glyph {
    let Some(c) = sym.chars().next() else {
        return [[false; CELL_W]; CELL_H];
    };
    if let Some(g) = ('\u{2800}'..='\u{28ff}')
        .contains(&c)
        .then(|| braille((c as u32 - 0x2800) as u8))
        .or_else(|| shape(c))
    {
        return g;
    }
    let mapped = match c {
        '—' | '━' => '─',
        '←' => '<',
        '→' => '>',
        '↑' => '^',
        '↓' => 'v',
        '·' => '.',
        '⚠' => '!',
        '…' => '.',
        c => c,
    };
    let fonts = [
        font8x8::BASIC_FONTS.get(mapped),
        font8x8::LATIN_FONTS.get(mapped),
        font8x8::BOX_FONTS.get(mapped),
        font8x8::BLOCK_FONTS.get(mapped),
        font8x8::GREEK_FONTS.get(mapped),
    ];
    match fonts.into_iter().flatten().next() {
        Some(rows8) => from_font(rows8),
        None => {
            let mut g = [[false; CELL_W]; CELL_H];
            for (y, row) in g.iter_mut().enumerate().skip(3).take(10) {
                for (x, px) in row.iter_mut().enumerate().skip(1).take(6) {
                    *px = y == 3 || y == 12 || x == 1 || x == 6;
                }
            }
            g
        }
    }
}

/// The RGB pixels of `buf`: width and height in pixels, then the bytes.
pub fn pixels(buf: &Buffer) -> (usize, usize, Vec<u8>) {
    let (w, h) = (
        buf.area.width as usize * CELL_W,
        buf.area.height as usize * CELL_H,
    );
    let mut data = vec![0u8; w * h * 3];
    for (cy, row) in rows(buf).enumerate() {
        for (cx, cell) in row.iter().enumerate() {
            let l = look(cell);
            let g = glyph(cell.symbol());
            for (py, grow) in g.iter().enumerate() {
                for (px, &on) in grow.iter().enumerate() {
                    let c: Rgb = if on { l.fg } else { l.bg };
                    let i = ((cy * CELL_H + py) * w + cx * CELL_W + px) * 3;
                    data[i..i + 3].copy_from_slice(&c);
                }
            }
        }
    }
    (w, h, data)
}

/// Encodes `buf` as a PNG file's bytes.
///
/// # Errors
/// The PNG encoder failed (an empty buffer, which PNG cannot hold).
pub fn encode(buf: &Buffer) -> Result<Vec<u8>, ::png::EncodingError> {
    let (w, h, data) = pixels(buf);
    let mut out = Vec::new();
    {
        let mut enc = ::png::Encoder::new(&mut out, w as u32, h as u32);
        enc.set_color(::png::ColorType::Rgb);
        enc.set_depth(::png::BitDepth::Eight);
        let mut writer = enc.write_header()?;
        writer.write_image_data(&data)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::layout::Rect;
    use ratatui::style::{Color, Style};

    #[test]
    fn letters_blocks_and_braille_have_pixels_and_spaces_none() {
        let count = |g: &Glyph| g.iter().flatten().filter(|&&p| p).count();
        assert!(count(&glyph("A")) > 10);
        assert_eq!(count(&glyph("█")), CELL_W * CELL_H);
        assert_eq!(count(&glyph("⣿")), 8 * 4);
        assert_eq!(count(&glyph(" ")), 0);
        assert!(count(&glyph("●")) > 10);
        assert!(count(&glyph("▲")) > 5);
    }

    #[test]
    fn a_buffer_encodes_as_a_png_of_the_right_size() {
        let mut buf = Buffer::empty(Rect::new(0, 0, 3, 2));
        buf.set_string(0, 0, "█", Style::new().fg(Color::Rgb(10, 20, 30)));
        let (w, h, data) = pixels(&buf);
        assert_eq!((w, h), (24, 32));
        assert_eq!(&data[0..3], &[10, 20, 30]);
        let png = encode(&buf).unwrap();
        assert_eq!(&png[1..4], b"PNG");
    }
}
