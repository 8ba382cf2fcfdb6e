//! `allocview export IN [--to json|pickle] -o OUT`: converts a snapshot between PyTorch's
//! pickle and allocview's JSON. A pickle export is consistent the way PyTorch's tools check it:
//! every segment's blocks tile it (checked; an input that does not is refused), and its
//! allocated, active and requested sizes are the sums of its blocks (recomputed on write).
//!
//! One table ([`EXTENSIONS`]) maps output extensions to formats. Without `--to`, the format is
//! the one the output's extension names (`.json`, `.pickle`, `.pkl`, any case); an output with
//! no such extension is refused with the list of known ones. With `--to`, an output name whose
//! extension names the other format (`--to json -o out.pickle`) is refused before anything is
//! read or written: a file's name never lies about its format. An extension naming no format
//! (`--to json -o out.snapshot`) is the user's choice. An output that is the input file (by
//! any name) is refused: a post-mortem's only copy is never rewritten.

use std::path::Path;

use allocview_agent::pytorch;
use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_agent::summary::render::counted;

use super::summary::progress::load_snapshot;
use crate::cli::{ExportArgs, ExportFormat};

/// Runs the command.
///
/// # Errors
/// The output format is unknown (no `--to` and an extension naming no format) or contradicts
/// the output's extension, the input cannot be read, its segments do not tile (pickle export), or the output cannot be
/// written.
pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let wanted = output_format(args)?;
    if crate::output::same_file(&args.input, &args.out) {
        anyhow::bail!(
            "{}: the output is the input file; give -o another name (export never rewrites its \
             input)",
            args.out.display()
        );
    }
    let snapshot = load_snapshot(&args.input)?;
    if wanted == FileFormat::Pickle {
        pytorch::check_tiling(&snapshot).map_err(|e| {
            anyhow::anyhow!(
                "{}: cannot export as a PyTorch pickle, blocks must tile their segment: {e}",
                args.input.display()
            )
        })?;
    }
    snapshot_file::save(&args.out, &snapshot, wanted)
        .map_err(|e| anyhow::anyhow!("cannot write {e}"))?;
    let bytes = std::fs::metadata(&args.out).map(|m| m.len()).unwrap_or(0);
    let entries = snapshot.device_traces.iter().map(Vec::len).sum::<usize>();
    eprintln!(
        "wrote {} ({}, {}): {}, {}",
        args.out.display(),
        crate::units::bytes(bytes),
        format_name(wanted),
        counted(snapshot.segments.len() as u64, "segment", "segments"),
        counted(entries as u64, "trace entry", "trace entries")
    );
    Ok(())
}

/// The format `--to` names (each format's `--to` value is its extension).
fn format_of(to: ExportFormat) -> FileFormat {
    match to {
        ExportFormat::Json => FileFormat::Json,
        ExportFormat::Pickle => FileFormat::Pickle,
    }
}

/// The output format: `--to` where given (refusing an output name whose extension names the
/// other format), else the format the output's extension names.
///
/// # Errors
/// `--to` and the extension disagree, or there is no `--to` and the extension names no format.
fn output_format(args: &ExportArgs) -> anyhow::Result<FileFormat> {
    let named = format_named_by(&args.out);
    let Some(to) = args.to else {
        return named.ok_or_else(|| {
            let found = match args.out.extension() {
                Some(ext) => format!("its extension `.{}` names no format", ext.to_string_lossy()),
                None => "it has no extension".to_string(),
            };
            anyhow::anyhow!(
                "{}: cannot tell the output format: {found}; give it one of the extensions {}, \
                 or pass --to json|pickle",
                args.out.display(),
                known_extensions(),
            )
        });
    };
    let wanted = format_of(to);
    if let Some(named) = named
        && named != wanted
    {
        // `--to` spells each format as its extension.
        let (to, other) = (wanted.extension(), named.extension());
        anyhow::bail!(
            "{}: the extension says {} but --to {to} was given; name the output `.{to}` or pass \
             --to {other}",
            args.out.display(),
            format_name(named),
        );
    }
    Ok(wanted)
}

/// Output extensions (lowercase) and the format each names: the one mapping `export` uses both
/// to infer a format and to refuse a name that contradicts `--to`.
pub const EXTENSIONS: [(&str, FileFormat); 3] = [
    ("json", FileFormat::Json),
    ("pickle", FileFormat::Pickle),
    ("pkl", FileFormat::Pickle),
];

/// The known extensions in words: `.json, .pickle or .pkl`.
fn known_extensions() -> String {
    let names: Vec<String> = EXTENSIONS.iter().map(|(e, _)| format!(".{e}")).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.concat(),
    }
}

/// The format an output file's extension names (case-insensitive), if it names one.
fn format_named_by(path: &Path) -> Option<FileFormat> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    EXTENSIONS
        .iter()
        .find(|(e, _)| *e == ext)
        .map(|&(_, format)| format)
}

/// A format in words.
fn format_name(f: FileFormat) -> &'static str {
    match f {
        FileFormat::Json => "allocview JSON",
        FileFormat::Pickle => "PyTorch pickle",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_formats_own_extension_names_that_format() {
        for format in [FileFormat::Json, FileFormat::Pickle] {
            let out = Path::new("out").with_extension(format.extension());
            assert_eq!(format_named_by(&out), Some(format));
            let upper = Path::new("out").with_extension(format.extension().to_uppercase());
            assert_eq!(format_named_by(&upper), Some(format));
        }
        assert_eq!(format_named_by(Path::new("out.snapshot")), None);
        assert_eq!(format_named_by(Path::new("out")), None);
    }

    #[test]
    fn the_known_extensions_read_as_a_list() {
        assert_eq!(known_extensions(), ".json, .pickle or .pkl");
    }
}
