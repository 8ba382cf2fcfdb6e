//! What a `--config` means against a recording: the recorded allocator settings with the keys
//! given changed (each key given overrides the recorded one, the others stay as recorded), or,
//! when the string starts with the word [`DEFAULTS_WORD`], PyTorch's defaults with the keys
//! given. So `--config max_split_size_mb:128` on a file recorded with
//! `expandable_segments:True` keeps expandable segments, `--config defaults` is PyTorch's
//! defaults, and `--config defaults,max_split_size_mb:128` is the defaults with that one key.

use allocview_alloc::caching::{AllocatorConfig, ConfigError};
use allocview_alloc::snapshot::Snapshot;

/// The word that starts a `--config` from PyTorch's defaults instead of the recorded settings.
pub const DEFAULTS_WORD: &str = "defaults";

/// How [`recorded_settings_text`] shows settings equal to PyTorch's defaults.
pub const PYTORCH_DEFAULTS: &str = "PyTorch defaults";

/// How [`recorded_settings_text`] shows a file without `allocator_settings`.
pub const NOT_RECORDED: &str = "not recorded (PyTorch defaults assumed)";

/// Marks a what-if column whose settings come out equal to the recorded ones.
pub const AS_RECORDED_MARK: &str = " (as recorded)";

/// Why a `--config` could not be composed with the recorded settings.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ComposeError {
    /// The settings given do not parse.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// [`DEFAULTS_WORD`] (in any case) somewhere but first, where it would mean nothing.
    #[error(
        "\"{word}\" can only come first (it starts from PyTorch's defaults instead of the \
         recorded settings): write \"{suggestion}\""
    )]
    DefaultsNotFirst {
        /// The word as written.
        word: String,
        /// The same settings with the word first, once, in lower case.
        suggestion: String,
    },
}

/// The settings `given` asks for against `recorded` (see the module docs).
///
/// # Errors
/// [`ComposeError::Config`] when `given` (or the combination) does not parse;
/// [`ComposeError::DefaultsNotFirst`] when the word [`DEFAULTS_WORD`] is written anywhere but
/// first (or in another case, as `Defaults`).
pub fn compose(recorded: &AllocatorConfig, given: &str) -> Result<AllocatorConfig, ComposeError> {
    let mut items = top_level_items(given);
    let from_defaults = items.first().is_some_and(|first| first == DEFAULTS_WORD);
    if from_defaults {
        items.remove(0);
    }
    if let Some(word) = items.iter().find(|i| i.eq_ignore_ascii_case(DEFAULTS_WORD)) {
        let rest: Vec<&str> = items
            .iter()
            .filter(|i| !i.eq_ignore_ascii_case(DEFAULTS_WORD))
            .map(String::as_str)
            .collect();
        return Err(ComposeError::DefaultsNotFirst {
            word: word.clone(),
            suggestion: std::iter::once(DEFAULTS_WORD)
                .chain(rest)
                .collect::<Vec<_>>()
                .join(","),
        });
    }
    // Check the string given on its own first, so that its errors name its own text.
    let own = items.join(",");
    AllocatorConfig::parse(&own)?;
    let given_keys: Vec<String> = items.iter().map(|i| key_of(i)).collect();
    let base = if from_defaults {
        String::new()
    } else {
        recorded.to_conf_string()
    };
    let mut merged: Vec<String> = top_level_items(&base)
        .into_iter()
        .filter(|i| !given_keys.contains(&key_of(i)))
        .collect();
    merged.extend(items);
    Ok(AllocatorConfig::parse(&merged.join(","))?)
}

/// Whether two configs make the device allocator behave the same (the settings PyTorch's
/// syntax renders; pinned-memory keys do not touch the device).
pub fn same_settings(a: &AllocatorConfig, b: &AllocatorConfig) -> bool {
    a.to_conf_string() == b.to_conf_string()
}

/// The recorded settings in one line: their non-default keys in PyTorch's syntax,
/// [`PYTORCH_DEFAULTS`], or [`NOT_RECORDED`] for a file without `allocator_settings`; a file
/// whose settings do not parse says why.
pub fn recorded_settings_text(snapshot: &Snapshot) -> String {
    if snapshot.allocator_settings.is_none() {
        return NOT_RECORDED.to_string();
    }
    match crate::replay::recorded_config(snapshot) {
        Ok(c) => settings_text(&c),
        Err(why) => format!("not readable ({why})"),
    }
}

/// `config` in one line: its non-default keys, or [`PYTORCH_DEFAULTS`].
pub fn settings_text(config: &AllocatorConfig) -> String {
    let s = config.to_conf_string();
    if s.is_empty() {
        PYTORCH_DEFAULTS.to_string()
    } else {
        s
    }
}

/// `s` split at the commas outside brackets, each item trimmed, empty ones left out.
fn top_level_items(s: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut cur = String::new();
    for ch in s.chars() {
        match ch {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    items.push(cur);
    items
        .into_iter()
        .map(|i| i.trim().to_string())
        .filter(|i| !i.is_empty())
        .collect()
}

/// The key of a `key:value` item, with PyTorch's aliases for HIP folded into the CUDA names.
fn key_of(item: &str) -> String {
    let key = item.split(':').next().unwrap_or("").trim();
    match key {
        "release_lock_on_hipmalloc" => "release_lock_on_cudamalloc".to_string(),
        "pinned_use_hip_host_register" => "pinned_use_cuda_host_register".to_string(),
        k => k.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expandable() -> AllocatorConfig {
        AllocatorConfig::parse("expandable_segments:True").unwrap()
    }

    #[test]
    fn a_config_changes_only_the_keys_it_gives() {
        let c = compose(&expandable(), "max_split_size_mb:128").unwrap();
        assert!(c.expandable_segments());
        assert_eq!(c.max_split_size(), Some(128 << 20));
        let off = compose(&expandable(), "expandable_segments:False").unwrap();
        assert!(!off.expandable_segments());
        assert!(same_settings(
            &compose(&expandable(), "").unwrap(),
            &expandable()
        ));
    }

    #[test]
    fn the_word_defaults_starts_from_pytorch_s_defaults() {
        let d = compose(&expandable(), "defaults").unwrap();
        assert!(same_settings(&d, &AllocatorConfig::default()));
        let d = compose(&expandable(), " defaults , max_split_size_mb:128").unwrap();
        assert!(!d.expandable_segments());
        assert_eq!(d.max_split_size(), Some(128 << 20));
    }

    #[test]
    fn lists_in_brackets_stay_one_item_and_errors_name_the_given_text() {
        let rec = AllocatorConfig::parse("roundup_power2_divisions:[256:1,>:4]").unwrap();
        let c = compose(&rec, "roundup_power2_divisions:2").unwrap();
        assert_eq!(c.roundup_power2_divisions(), [2; 16]);
        assert!(compose(&rec, "nonsense:1").is_err());
    }

    #[test]
    fn the_word_defaults_anywhere_but_first_is_refused_with_the_string_to_write() {
        for (given, word, suggestion) in [
            (
                "expandable_segments:True,defaults",
                "defaults",
                "defaults,expandable_segments:True",
            ),
            ("defaults,defaults", "defaults", "defaults"),
            ("Defaults", "Defaults", "defaults"),
            (
                "max_split_size_mb:128, DEFAULTS ,expandable_segments:True",
                "DEFAULTS",
                "defaults,max_split_size_mb:128,expandable_segments:True",
            ),
        ] {
            let err = compose(&expandable(), given).unwrap_err();
            assert_eq!(
                err,
                ComposeError::DefaultsNotFirst {
                    word: word.into(),
                    suggestion: suggestion.into()
                },
                "{given}"
            );
            let text = err.to_string();
            assert!(
                text.contains("can only come first") && text.contains(suggestion),
                "{text}"
            );
        }
    }
}
