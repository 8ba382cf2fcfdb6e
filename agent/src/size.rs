//! Sizes as people write them on a command line or in an environment variable: `16GiB`,
//! `512MiB`, `1.5 GiB`, `16GB`, `8000000000`. Binary units (`KiB` ... `PiB`, and the bare `K`
//! ... `P` that PyTorch users mean the same way) are powers of 1024; decimal ones (`KB` ...
//! `PB`) powers of 1000. The one parser of sizes for every command and setting.

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;
const PIB: u64 = 1 << 50;

/// Why a size string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Nothing was given.
    #[error("empty size: give a number of bytes or a number with a unit, e.g. 16GiB")]
    Empty,
    /// The number part does not parse.
    #[error(
        "bad size {0:?}: expected a number of bytes or a number with a unit (B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB), e.g. 16GiB or 512MiB"
    )]
    BadNumber(String),
    /// The unit is unknown.
    #[error(
        "bad size {input:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB or PB)"
    )]
    BadUnit {
        /// The whole input.
        input: String,
        /// The unit part.
        unit: String,
    },
    /// The value does not fit in 64 bits or is negative.
    #[error("bad size {0:?}: out of range")]
    OutOfRange(String),
}

/// Parses a size: plain bytes (`8000000000`, `1_000`), or a number and a unit, binary (`KiB`,
/// `MiB`, `GiB`, `TiB`, `PiB`, also `K`/`M`/`G`/`T`/`P`) or decimal (`KB`, `MB`, `GB`, `TB`,
/// `PB`), case insensitive, with an optional space and fraction (`1.5 GiB`): every unit
/// `human_bytes` and the dashboard write reads back.
///
/// # Errors
/// [`SizeError`] naming what is wrong with the input.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    if num.is_empty() {
        return Err(SizeError::BadNumber(input.to_string()));
    }
    let unit = unit.trim();
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => TIB,
        "p" | "pib" => PIB,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        _ => {
            return Err(SizeError::BadUnit {
                input: input.to_string(),
                unit: unit.to_string(),
            });
        }
    };
    if num.contains('.') {
        let v: f64 = num
            .parse()
            .map_err(|_| SizeError::BadNumber(input.to_string()))?;
        let total = v * multiplier as f64;
        if !total.is_finite() || total < 0.0 || total >= u64::MAX as f64 {
            return Err(SizeError::OutOfRange(input.to_string()));
        }
        Ok(total.round() as u64)
    } else {
        let v: u64 = num
            .parse()
            .map_err(|_| SizeError::OutOfRange(input.to_string()))?;
        v.checked_mul(multiplier)
            .ok_or_else(|| SizeError::OutOfRange(input.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_size("16GiB"), Ok(16 * GIB));
        assert_eq!(parse_size("512MiB"), Ok(512 * MIB));
        assert_eq!(parse_size("8000000000"), Ok(8_000_000_000));
        assert_eq!(parse_size("1.5 GiB"), Ok(3 * GIB / 2));
        assert_eq!(parse_size("2gb"), Ok(2_000_000_000));
        assert_eq!(parse_size("1_024"), Ok(1024));
        assert_eq!(parse_size("1PiB"), Ok(PIB));
        assert_eq!(parse_size("2 pb"), Ok(2_000_000_000_000_000));
    }

    #[test]
    fn bad_sizes_are_clear_errors() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert!(matches!(parse_size("GiB"), Err(SizeError::BadNumber(_))));
        let e = parse_size("16 parsecs").unwrap_err();
        assert!(e.to_string().contains("unknown unit \"parsecs\""), "{e}");
        assert!(matches!(
            parse_size("99999999999TiB"),
            Err(SizeError::OutOfRange(_))
        ));
        assert!(matches!(parse_size("1.2.3"), Err(SizeError::BadNumber(_))));
    }
}
