//! Byte counts as people write them: `80GiB`, `512MiB`, `1.5 GiB`, `16GB`, `8000000000`.
//!
//! Binary units (`KiB`, `MiB`, `GiB`, `TiB`, and the bare `K`, `M`, `G`, `T` that PyTorch users
//! mean the same way) are powers of 1024; SI units (`KB`, `MB`, `GB`, `TB`) are powers of 1000.

/// A byte count that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad byte count `{input}`: {problem} (write e.g. `80GiB`, `512MiB` or plain bytes)")]
pub struct BytesError {
    /// What was given.
    pub input: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// Unit suffixes and their multipliers, longest first so `GiB` wins over `B`.
const UNITS: [(&str, u64); 13] = [
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("K", 1 << 10),
    ("M", 1 << 20),
    ("G", 1 << 30),
    ("T", 1 << 40),
    ("B", 1),
];

/// Parses a byte count.
///
/// # Errors
/// [`BytesError`] naming the input for an empty string, an unknown unit, a number that is not
/// one, or a value that does not fit in 64 bits.
///
/// # Examples
/// ```
/// use allocview_agent::replay::parse_bytes;
/// assert_eq!(parse_bytes("80GiB").unwrap(), 80 << 30);
/// assert_eq!(parse_bytes("1.5 KiB").unwrap(), 1536);
/// assert_eq!(parse_bytes("4096").unwrap(), 4096);
/// ```
pub fn parse_bytes(input: &str) -> Result<u64, BytesError> {
    let err = |problem| BytesError {
        input: input.to_string(),
        problem,
    };
    let s: String = input.trim().chars().filter(|c| *c != '_').collect();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = (&s[..split], s[split..].trim());
    if number.is_empty() {
        return Err(err("no number"));
    }
    let multiplier = if unit.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(u, _)| u.eq_ignore_ascii_case(unit) && (u.len() > 1 || unit.len() == 1))
            .map(|&(_, m)| m)
            .ok_or_else(|| err("unknown unit"))?
    };
    if let Ok(n) = number.parse::<u64>() {
        return n.checked_mul(multiplier).ok_or_else(|| err("too large"));
    }
    let f: f64 = number.parse().map_err(|_| err("not a number"))?;
    let bytes = f * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err("too large"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_si_units_and_plain_bytes_parse() {
        assert_eq!(parse_bytes("80GiB"), Ok(80 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("512mib"), Ok(512 << 20));
        assert_eq!(parse_bytes("16GB"), Ok(16_000_000_000));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("8_000_000_000"), Ok(8_000_000_000));
        assert_eq!(parse_bytes(" 1.5 GiB "), Ok(3 << 29));
        assert_eq!(parse_bytes("100B"), Ok(100));
    }

    #[test]
    fn bad_byte_counts_are_errors_naming_the_input() {
        let e = parse_bytes("12XB").unwrap_err();
        assert!(e.to_string().contains("`12XB`"));
        assert_eq!(e.problem, "unknown unit");
        assert_eq!(parse_bytes("").unwrap_err().problem, "empty");
        assert_eq!(parse_bytes("GiB").unwrap_err().problem, "no number");
        assert_eq!(parse_bytes("1.2.3MiB").unwrap_err().problem, "not a number");
        assert_eq!(
            parse_bytes("99999999999TiB").unwrap_err().problem,
            "too large"
        );
    }
}
