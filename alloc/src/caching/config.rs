//! `AllocatorConfig`: the caching allocator's settings, parsed from PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF` syntax, and the size-rounding rule they drive.
//!
//! The syntax and the checks follow PyTorch's `CUDAAllocatorConfig::parseArgs` (2.x): the string
//! is split into tokens (`,` `:` `[` `]` and runs of anything else, whitespace ignored), then read
//! as `key:value` pairs separated by commas. `roundup_power2_divisions` also takes a list
//! `[256:1,512:2,>:8]` whose keys are sizes in MB (powers of two) naming the bucket
//! `log2(key)`; the first key also fills every lower bucket and `>` fills from the last named
//! bucket itself to the end (PyTorch's quirk, matched here and announced with a warning).
//!
//! [`AllocatorConfig::round_size`] is PyTorch's `round_size`: below [`MIN_BLOCK_SIZE`] a request
//! becomes 512 bytes; with `d` divisions for the request's power-of-two bucket (`d > 1` and the
//! request above `512 * d`) it rounds up to the next `1/d` step between powers of two; else to a
//! multiple of 512.

use std::fmt;

use crate::caching::allocator::MAX_REQUEST;
use crate::snapshot::Value;

/// Smallest block: every request rounds up to a multiple of this (PyTorch's `kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest rounded request served from the small pool (`kSmallSize`, 1 MiB).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size for small-pool requests (`kSmallBuffer`, 2 MiB).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Segment size for requests of 1 MiB up to [`MIN_LARGE_ALLOC`] (`kLargeBuffer`, 20 MiB); also
/// the default slack an oversize request may waste (`max_non_split_rounding_mb`).
pub const LARGE_BUFFER: u64 = 20 << 20;
/// From this rounded size on, a segment is the request rounded up to [`ROUND_LARGE`]
/// (`kMinLargeAlloc`, 10 MiB).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounding of large segments (`kRoundLarge`, 2 MiB).
pub const ROUND_LARGE: u64 = 2 << 20;
/// Number of power-of-two buckets `roundup_power2_divisions` configures: 1 MiB .. 32 GiB and up.
pub const ROUNDUP_BUCKETS: usize = 16;
/// log2 of the first bucket's start (1 MiB).
const FIRST_BUCKET_LOG2: u32 = 20;
/// One MiB, the unit of the `*_mb` settings.
const MIB: u64 = 1 << 20;
/// Smallest accepted `max_split_size_mb` and `max_non_split_rounding_mb` (the large buffer, 20).
pub const MIN_SPLIT_SIZE_MB: u64 = LARGE_BUFFER / MIB;
/// Largest `max_split_size_mb` and `max_non_split_rounding_mb` kept: [`MAX_REQUEST`] (128 TiB)
/// in MiB. A larger value is clamped to it, as PyTorch clamps it (to `SIZE_MAX` / 1 MiB):
/// every request is below it, so a larger value could change nothing, and its byte count
/// still fits the `max_split_size` figure of `memory_stats()` (an `i64`).
pub const MAX_SPLIT_SIZE_MB: u64 = MAX_REQUEST / MIB;
/// Largest accepted `pinned_num_register_threads` (PyTorch's `pinned_max_register_threads`).
pub const MAX_PINNED_REGISTER_THREADS: u64 = 128;
/// Environment variable read first by [`AllocatorConfig::from_env`].
pub const ENV_VAR: &str = "ALLOCVIEW_ALLOC_CONF";
/// PyTorch's variable, read when [`ENV_VAR`] is unset.
pub const PYTORCH_ENV_VAR: &str = "PYTORCH_CUDA_ALLOC_CONF";

/// Every key the parser accepts, for error messages.
pub const VALID_KEYS: &str = "max_split_size_mb, max_non_split_rounding_mb, \
garbage_collection_threshold, roundup_power2_divisions, expandable_segments, \
release_lock_on_cudamalloc, backend, pinned_use_cuda_host_register, pinned_num_register_threads, \
pinned_use_background_threads, pinned_reserve_segment_size_mb, graph_capture_record_stream_reuse";

/// A configuration string or builder value that cannot be used. Each message names the
/// setting (or the text) at fault as written, and what would have been accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A key the allocator does not know.
    #[error("unknown allocator setting \"{key}\"; valid settings: {valid}")]
    UnknownKey {
        /// The key as written.
        key: String,
        /// The keys that are accepted.
        valid: &'static str,
    },
    /// A value out of range or of the wrong form.
    #[error("invalid value \"{value}\" for {key}: expected {expected}")]
    InvalidValue {
        /// The setting.
        key: String,
        /// The value as written.
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// A setting with its `:` but nothing after it (`max_split_size_mb:`).
    #[error("{key} has no value after ':': expected {expected}")]
    MissingValue {
        /// The setting.
        key: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// A setting name without the `:` and value after it (`bogus`, `expandable_segments True`).
    #[error("\"{setting}\": expected KEY:VALUE (a ':' after \"{key}\")")]
    MissingColon {
        /// The whole setting as written (up to the next comma).
        setting: String,
        /// The name it starts with.
        key: String,
    },
    /// A setting that starts with punctuation where its name should be (`:5`, `[1]`).
    #[error("\"{setting}\": expected KEY:VALUE (a setting name before \"{found}\")")]
    MissingKey {
        /// The whole setting as written (up to the next comma).
        setting: String,
        /// What stands where the name should.
        found: String,
    },
    /// Nothing between two commas, or before the first (`a:1,,b:2`, `,a:1`). One comma at the
    /// very end is accepted, as PyTorch accepts it.
    #[error("the {} setting is empty: expected KEY:VALUE between the commas", ordinal(*.number))]
    EmptySetting {
        /// Which setting, counting from 1.
        number: usize,
    },
    /// More after a setting's value than the value (`a:True b:30`: a comma forgotten).
    #[error("\"{setting}\": expected ',' after \"{after}\" (one KEY:VALUE per setting)")]
    MissingComma {
        /// The whole setting as written (up to the next comma).
        setting: String,
        /// The setting and value read before the unexpected text.
        after: String,
    },
    /// A `[` list that the string ends inside.
    #[error("{key}: the list \"{list}\" has no closing ']'")]
    UnclosedList {
        /// The setting.
        key: String,
        /// The list as written.
        list: String,
    },
    /// An item of a `[...]` list that is not `SIZE_MB:DIVISIONS` (`[256]`, `[:2]`,
    /// `[256:1 512:2]`).
    #[error(
        "{key}: list item {} is not SIZE_MB:DIVISIONS (e.g. 256:2, or >:8 for every larger size)",
        quoted_item(.item)
    )]
    ListItem {
        /// The setting.
        key: String,
        /// The item as written (up to the next `,` or `]`).
        item: String,
    },
}

/// `1st`, `2nd`, `3rd`, `4th`, ..., `11th`, `21st`: a setting's place in words.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// A list item in quotes, or `(empty)` for one with no text at all.
fn quoted_item(item: &str) -> String {
    if item.is_empty() {
        "(empty)".into()
    } else {
        format!("\"{item}\"")
    }
}

/// Expected forms, named once.
const EXPECT_SPLIT_MB: &str = "an integer number of MiB, at least 20";
const EXPECT_THRESHOLD: &str = "a number strictly between 0 and 1";
const EXPECT_BOOL: &str = "True or False";
const EXPECT_DIVISIONS: &str = "0 or a power of two, either one value (roundup_power2_divisions:4) \
or a list [256:1,512:2,>:8] whose keys are power-of-two sizes in MB or '>'";
const EXPECT_BACKEND: &str = "native (cudaMallocAsync is not supported by allocview)";
const EXPECT_THREADS: &str = "a power of two no larger than 128";
const EXPECT_POSITIVE: &str = "a positive integer";

/// The caching allocator's settings. [`Default`] is PyTorch's defaults (no `max_split_size`,
/// no garbage collection, no rounding divisions, no expandable segments).
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    max_split_size: Option<u64>,
    max_non_split_rounding: u64,
    garbage_collection_threshold: f64,
    expandable_segments: bool,
    release_lock_on_cudamalloc: bool,
    roundup_power2_divisions: [u64; ROUNDUP_BUCKETS],
    pinned_num_register_threads: u64,
    pinned_use_cuda_host_register: bool,
    pinned_use_background_threads: bool,
    pinned_reserve_segment_size_mb: u64,
    graph_capture_record_stream_reuse: bool,
    source: String,
    warnings: Vec<String>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            max_non_split_rounding: LARGE_BUFFER,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            release_lock_on_cudamalloc: false,
            roundup_power2_divisions: [0; ROUNDUP_BUCKETS],
            pinned_num_register_threads: 1,
            pinned_use_cuda_host_register: false,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            graph_capture_record_stream_reuse: false,
            source: String::new(),
            warnings: Vec::new(),
        }
    }
}

/// The bucket of `roundup_power2_divisions` a size falls in: `floor(log2(size)) - 20`, clamped to
/// `0..16` (so every size below 2 MiB uses bucket 0).
#[inline]
pub fn roundup_bucket(size: u64) -> usize {
    let log = 63 - size.max(1).leading_zeros();
    (log.saturating_sub(FIRST_BUCKET_LOG2) as usize).min(ROUNDUP_BUCKETS - 1)
}

/// Segment size for a rounded request (PyTorch's `get_allocation_size`): at most 1 MiB -> 2 MiB;
/// below 10 MiB -> 20 MiB; else rounded up to 2 MiB.
#[inline]
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// The page an expandable segment of the small (`small`) or the large pool maps at a time:
/// PyTorch's `kSmallBuffer` (2 MiB) or `kLargeBuffer` (20 MiB).
#[inline]
pub fn expandable_page(small: bool) -> u64 {
    if small { SMALL_BUFFER } else { LARGE_BUFFER }
}

impl AllocatorConfig {
    /// A builder with typed setters, starting from the defaults.
    pub fn builder() -> AllocatorConfigBuilder {
        AllocatorConfigBuilder {
            config: AllocatorConfig::default(),
            max_split_size_mb: None,
            max_non_split_rounding_mb: None,
        }
    }

    /// Parses PyTorch's syntax, e.g.
    /// `max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.6,expandable_segments:True`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting (or the text as written) and the valid forms: an
    /// unknown key, a missing or bad value (`max_split_size_mb` below 20, a threshold not
    /// strictly between 0 and 1, a bool other than True/False, bad divisions), or text that is
    /// not `KEY:VALUE[,KEY:VALUE...]` (no `:`, no name, an empty setting, a missing comma, a
    /// malformed or unclosed `[...]` list). A single trailing comma is accepted, as PyTorch
    /// accepts it.
    pub fn parse(s: &str) -> Result<AllocatorConfig, ConfigError> {
        let tokens = tokenize(s);
        let mut p = Parser {
            src: s,
            tokens,
            i: 0,
            warnings: Vec::new(),
        };
        let mut c = AllocatorConfig {
            source: s.to_string(),
            ..AllocatorConfig::default()
        };
        let mut number = 0;
        while p.i < p.tokens.len() {
            number += 1;
            let start = p.i;
            let key = p.key(number)?;
            if p.peek() != Some(":") {
                return Err(ConfigError::MissingColon {
                    setting: p.setting_from(start).to_string(),
                    key,
                });
            }
            p.i += 1;
            match key.as_str() {
                "max_split_size_mb" => {
                    let mb = p.integer(&key, EXPECT_SPLIT_MB)?;
                    c.max_split_size = Some(split_mb_to_bytes(&key, mb)?);
                }
                "max_non_split_rounding_mb" => {
                    let mb = p.integer(&key, EXPECT_SPLIT_MB)?;
                    c.max_non_split_rounding = split_mb_to_bytes(&key, mb)?;
                }
                "garbage_collection_threshold" => {
                    let word = p.value(&key, EXPECT_THRESHOLD)?;
                    c.garbage_collection_threshold = parse_threshold(&key, &word)?;
                }
                "expandable_segments" => c.expandable_segments = p.boolean(&key)?,
                "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                    c.release_lock_on_cudamalloc = p.boolean(&key)?
                }
                "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                    c.pinned_use_cuda_host_register = p.boolean(&key)?
                }
                "pinned_use_background_threads" => {
                    c.pinned_use_background_threads = p.boolean(&key)?
                }
                "graph_capture_record_stream_reuse" => {
                    c.graph_capture_record_stream_reuse = p.boolean(&key)?
                }
                "pinned_num_register_threads" => {
                    let n = p.integer(&key, EXPECT_THREADS)?;
                    c.pinned_num_register_threads = register_threads(&key, n)?;
                }
                "pinned_reserve_segment_size_mb" => {
                    let n = p.integer(&key, EXPECT_POSITIVE)?;
                    if n == 0 {
                        return Err(invalid(&key, "0".into(), EXPECT_POSITIVE));
                    }
                    c.pinned_reserve_segment_size_mb = n;
                }
                "backend" => {
                    let word = p.value(&key, EXPECT_BACKEND)?;
                    if word != "native" {
                        return Err(invalid(&key, word, EXPECT_BACKEND));
                    }
                }
                "roundup_power2_divisions" => {
                    c.roundup_power2_divisions = p.divisions(&key)?;
                }
                _ => {
                    return Err(ConfigError::UnknownKey {
                        key,
                        valid: VALID_KEYS,
                    });
                }
            }
            match p.peek() {
                None => {}
                Some(",") => p.i += 1,
                Some(_) => {
                    return Err(ConfigError::MissingComma {
                        setting: p.setting_from(start).to_string(),
                        after: p.text(start, p.i).to_string(),
                    });
                }
            }
        }
        c.warnings = p.warnings;
        Ok(c)
    }

    /// Reads `ALLOCVIEW_ALLOC_CONF`, falling back to `PYTORCH_CUDA_ALLOC_CONF`, else the default.
    ///
    /// # Errors
    /// As [`parse`](Self::parse), for whichever variable was used.
    pub fn from_env() -> Result<AllocatorConfig, ConfigError> {
        match AllocatorConfig::env_setting() {
            Some((_, s)) => AllocatorConfig::parse(&s),
            None => Ok(AllocatorConfig::default()),
        }
    }

    /// The variable [`from_env`](Self::from_env) reads and its value, if either is set: for
    /// error messages that name where a bad setting came from.
    pub fn env_setting() -> Option<(&'static str, String)> {
        [ENV_VAR, PYTORCH_ENV_VAR]
            .into_iter()
            .find_map(|var| std::env::var(var).ok().map(|s| (var, s)))
    }

    /// PyTorch's `round_size`: the block size a request of `size` bytes gets.
    #[inline]
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        let divisions = self.roundup_power2_divisions[roundup_bucket(size)];
        if divisions > 1 && size > MIN_BLOCK_SIZE.saturating_mul(divisions) {
            roundup_power2_next_division(size, divisions)
        } else {
            size.div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE)
        }
    }

    /// `max_split_size` in bytes; `None` = unlimited (blocks of any size may be split).
    pub fn max_split_size(&self) -> Option<u64> {
        self.max_split_size
    }

    /// `max_split_size` in bytes with unlimited as `u64::MAX` (PyTorch's `SIZE_MAX`).
    pub fn max_split_size_or_max(&self) -> u64 {
        self.max_split_size.unwrap_or(u64::MAX)
    }

    /// How much larger than an oversize request a cached oversize block may be (bytes).
    pub fn max_non_split_rounding(&self) -> u64 {
        self.max_non_split_rounding
    }

    /// `garbage_collection_threshold` (0 = off).
    pub fn garbage_collection_threshold(&self) -> f64 {
        self.garbage_collection_threshold
    }

    /// Whether new segments are expandable.
    pub fn expandable_segments(&self) -> bool {
        self.expandable_segments
    }

    /// `release_lock_on_cudamalloc` (recorded; allocview keeps its lock across device calls).
    pub fn release_lock_on_cudamalloc(&self) -> bool {
        self.release_lock_on_cudamalloc
    }

    /// Divisions per bucket (bucket `i` covers sizes from `2^i` MiB; 0 = off).
    pub fn roundup_power2_divisions(&self) -> [u64; ROUNDUP_BUCKETS] {
        self.roundup_power2_divisions
    }

    /// `pinned_num_register_threads` (host allocator setting; no effect here).
    pub fn pinned_num_register_threads(&self) -> u64 {
        self.pinned_num_register_threads
    }

    /// `pinned_use_cuda_host_register` (host allocator setting; no effect here).
    pub fn pinned_use_cuda_host_register(&self) -> bool {
        self.pinned_use_cuda_host_register
    }

    /// `pinned_use_background_threads` (host allocator setting; no effect here).
    pub fn pinned_use_background_threads(&self) -> bool {
        self.pinned_use_background_threads
    }

    /// `pinned_reserve_segment_size_mb` (host allocator setting, 0 when unset; no effect here).
    pub fn pinned_reserve_segment_size_mb(&self) -> u64 {
        self.pinned_reserve_segment_size_mb
    }

    /// `graph_capture_record_stream_reuse` (accepted and reported; no effect here).
    pub fn graph_capture_record_stream_reuse(&self) -> bool {
        self.graph_capture_record_stream_reuse
    }

    /// The string this config was parsed from (or rendered from the builder's settings).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Warnings from parsing: PyTorch quirks the settings follow that the string may not mean
    /// (a `>` in a `roundup_power2_divisions` list also overriding the last named bucket).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// PyTorch's `allocator_settings` dict, with the keys in the order PyTorch 2.2+ writes them.
    pub fn to_settings(&self) -> Vec<(String, Value)> {
        let divisions = (0..ROUNDUP_BUCKETS)
            .map(|i| {
                (
                    Value::Str((1u64 << i).to_string()),
                    Value::Int(self.roundup_power2_divisions[i] as i64),
                )
            })
            .collect();
        vec![
            (PYTORCH_ENV_VAR.into(), Value::Str(self.source.clone())),
            (
                "max_split_size".into(),
                Value::Int(self.max_split_size.map_or(-1, |b| b as i64)),
            ),
            (
                "garbage_collection_threshold".into(),
                Value::Float(self.garbage_collection_threshold),
            ),
            (
                "expandable_segments".into(),
                Value::Bool(self.expandable_segments),
            ),
            (
                "pinned_num_register_threads".into(),
                Value::Int(self.pinned_num_register_threads as i64),
            ),
            (
                "release_lock_on_cudamalloc".into(),
                Value::Bool(self.release_lock_on_cudamalloc),
            ),
            (
                "pinned_use_cuda_host_register".into(),
                Value::Bool(self.pinned_use_cuda_host_register),
            ),
            ("roundup_power2_divisions".into(), Value::Dict(divisions)),
        ]
    }

    /// Renders the non-default settings that drive the device allocator in PyTorch's syntax:
    /// parsing it gives a config that allocates the same way. The host allocator's `pinned_*`
    /// keys and `graph_capture_record_stream_reuse`, which change nothing here, are left out,
    /// so two configs that behave alike render alike; [`source`](Self::source) keeps the
    /// string as given. (`==` compares every setting and the source text too.)
    ///
    /// # Examples
    /// ```
    /// use allocview_alloc::caching::AllocatorConfig;
    ///
    /// let c = AllocatorConfig::parse(" expandable_segments : True, pinned_num_register_threads:8")
    ///     .unwrap();
    /// assert_eq!(c.to_conf_string(), "expandable_segments:True");
    /// assert_eq!(c.pinned_num_register_threads(), 8);
    /// let again = AllocatorConfig::parse(&c.to_conf_string()).unwrap();
    /// assert_eq!(again.to_conf_string(), c.to_conf_string());
    /// ```
    pub fn to_conf_string(&self) -> String {
        self.device_conf_parts().join(",")
    }

    /// The `KEY:VALUE` items of [`to_conf_string`](Self::to_conf_string).
    fn device_conf_parts(&self) -> Vec<String> {
        let mut parts: Vec<String> = Vec::new();
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if self.max_non_split_rounding != LARGE_BUFFER {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding / MIB
            ));
        }
        if self.garbage_collection_threshold > 0.0 {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if self.roundup_power2_divisions != [0; ROUNDUP_BUCKETS] {
            let items: Vec<String> = (0..ROUNDUP_BUCKETS)
                .map(|i| format!("{}:{}", 1u64 << i, self.roundup_power2_divisions[i]))
                .collect();
            parts.push(format!("roundup_power2_divisions:[{}]", items.join(",")));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if self.release_lock_on_cudamalloc {
            parts.push("release_lock_on_cudamalloc:True".into());
        }
        parts
    }

    /// The non-default settings [`to_conf_string`](Self::to_conf_string) leaves out, as
    /// `KEY:VALUE` items.
    fn host_conf_parts(&self) -> Vec<String> {
        let d = AllocatorConfig::default();
        let flag = |key: &str, on: bool| on.then(|| format!("{key}:True"));
        [
            (self.pinned_num_register_threads != d.pinned_num_register_threads).then(|| {
                format!(
                    "pinned_num_register_threads:{}",
                    self.pinned_num_register_threads
                )
            }),
            flag(
                "pinned_use_cuda_host_register",
                self.pinned_use_cuda_host_register,
            ),
            flag(
                "pinned_use_background_threads",
                self.pinned_use_background_threads,
            ),
            (self.pinned_reserve_segment_size_mb != d.pinned_reserve_segment_size_mb).then(|| {
                format!(
                    "pinned_reserve_segment_size_mb:{}",
                    self.pinned_reserve_segment_size_mb
                )
            }),
            flag(
                "graph_capture_record_stream_reuse",
                self.graph_capture_record_stream_reuse,
            ),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl fmt::Display for AllocatorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_conf_string())
    }
}

/// PyTorch's `roundup_power2_next_division`: powers of two stay; else the next multiple of
/// `floor_pow2(size) / divisions` (or the next power of two when that step is 0).
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let rounded_floor = size & !(step - 1);
    if rounded_floor == size {
        size
    } else {
        rounded_floor.saturating_add(step)
    }
}

/// A `max_split_size_mb` / `max_non_split_rounding_mb` value in bytes: at least
/// [`MIN_SPLIT_SIZE_MB`], else an error; above [`MAX_SPLIT_SIZE_MB`], clamped to it.
fn split_mb_to_bytes(key: &str, mb: u64) -> Result<u64, ConfigError> {
    if mb < MIN_SPLIT_SIZE_MB {
        return Err(invalid(key, mb.to_string(), EXPECT_SPLIT_MB));
    }
    Ok(mb.min(MAX_SPLIT_SIZE_MB) * MIB)
}

/// A `pinned_num_register_threads` value, once checked: a power of two, at most
/// [`MAX_PINNED_REGISTER_THREADS`].
fn register_threads(key: &str, n: u64) -> Result<u64, ConfigError> {
    if !n.is_power_of_two() || n > MAX_PINNED_REGISTER_THREADS {
        return Err(invalid(key, n.to_string(), EXPECT_THREADS));
    }
    Ok(n)
}

fn invalid(key: &str, value: String, expected: &'static str) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.to_string(),
        value,
        expected,
    }
}

fn parse_threshold(key: &str, word: &str) -> Result<f64, ConfigError> {
    match word.parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(invalid(key, word.to_string(), EXPECT_THRESHOLD)),
    }
}

/// One token of the string, with where it stands (byte offsets) for error messages that
/// quote the text as written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    text: String,
    start: usize,
    end: usize,
}

/// Splits like PyTorch's `lexArgs`: `,` `:` `[` `]` are tokens of their own, whitespace
/// separates, anything else accumulates.
fn tokenize(s: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut cur: Option<usize> = None;
    let flush = |out: &mut Vec<Token>, cur: &mut Option<usize>, end: usize| {
        if let Some(start) = cur.take() {
            out.push(Token {
                text: s[start..end].to_string(),
                start,
                end,
            });
        }
    };
    for (at, ch) in s.char_indices() {
        match ch {
            ',' | ':' | '[' | ']' => {
                flush(&mut out, &mut cur, at);
                out.push(Token {
                    text: ch.to_string(),
                    start: at,
                    end: at + ch.len_utf8(),
                });
            }
            c if c.is_whitespace() => flush(&mut out, &mut cur, at),
            _ => {
                cur.get_or_insert(at);
            }
        }
    }
    flush(&mut out, &mut cur, s.len());
    out
}

struct Parser<'a> {
    src: &'a str,
    tokens: Vec<Token>,
    i: usize,
    warnings: Vec<String>,
}

const PUNCT: [&str; 4] = [",", ":", "[", "]"];

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.i).map(|t| t.text.as_str())
    }

    /// The text of tokens `from..to` as written (whitespace inside kept).
    fn text(&self, from: usize, to: usize) -> &str {
        match (
            self.tokens.get(from),
            to.checked_sub(1).and_then(|l| self.tokens.get(l)),
        ) {
            (Some(a), Some(b)) if from < to => &self.src[a.start..b.end],
            _ => "",
        }
    }

    /// Index of the first token from `from` on that `stop` accepts outside brackets (or the
    /// end).
    fn scan(&self, from: usize, stop: impl Fn(&str) -> bool) -> usize {
        let mut depth = 0usize;
        let mut j = from;
        while let Some(t) = self.tokens.get(j) {
            match t.text.as_str() {
                t if depth == 0 && stop(t) => break,
                "[" => depth += 1,
                "]" => depth = depth.saturating_sub(1),
                _ => {}
            }
            j += 1;
        }
        j
    }

    /// The setting that starts at token `from`, as written: up to the next comma outside
    /// brackets.
    fn setting_from(&self, from: usize) -> &str {
        self.text(from, self.scan(from, |t| t == ","))
    }

    /// The next token when it is a word (not punctuation), taken.
    fn word(&mut self) -> Option<String> {
        let t = self.peek().filter(|t| !PUNCT.contains(t))?.to_string();
        self.i += 1;
        Some(t)
    }

    /// A setting's name; `number` counts the settings, for an empty one.
    fn key(&mut self, number: usize) -> Result<String, ConfigError> {
        if let Some(w) = self.word() {
            return Ok(w);
        }
        match self.peek() {
            Some(",") => Err(ConfigError::EmptySetting { number }),
            found => Err(ConfigError::MissingKey {
                setting: self.setting_from(self.i).to_string(),
                found: found.unwrap_or_default().to_string(),
            }),
        }
    }

    /// The value after `key:`, one word: none there is [`ConfigError::MissingValue`],
    /// punctuation an [`ConfigError::InvalidValue`] quoting the rest of the setting.
    fn value(&mut self, key: &str, expected: &'static str) -> Result<String, ConfigError> {
        if let Some(w) = self.word() {
            return Ok(w);
        }
        match self.peek() {
            None | Some(",") => Err(ConfigError::MissingValue {
                key: key.to_string(),
                expected,
            }),
            Some(_) => Err(invalid(
                key,
                self.setting_from(self.i).to_string(),
                expected,
            )),
        }
    }

    fn integer(&mut self, key: &str, expected: &'static str) -> Result<u64, ConfigError> {
        let w = self.value(key, expected)?;
        w.parse::<u64>().map_err(|_| invalid(key, w, expected))
    }

    fn boolean(&mut self, key: &str) -> Result<bool, ConfigError> {
        let w = self.value(key, EXPECT_BOOL)?;
        match w.as_str() {
            "True" => Ok(true),
            "False" => Ok(false),
            _ => Err(invalid(key, w, EXPECT_BOOL)),
        }
    }

    /// One word of a list item, else the item is malformed.
    fn item_word(&mut self, key: &str, item_start: usize) -> Result<String, ConfigError> {
        self.word().ok_or_else(|| self.list_item(key, item_start))
    }

    /// The list item starting at token `from` is malformed (or the list is not closed).
    fn list_item(&self, key: &str, from: usize) -> ConfigError {
        let end = self.scan(from, |t| t == "," || t == "]");
        if end >= self.tokens.len() {
            return self.unclosed(key);
        }
        ConfigError::ListItem {
            key: key.to_string(),
            item: self.text(from, end).to_string(),
        }
    }

    /// The list that starts at the last `[` is not closed.
    fn unclosed(&self, key: &str) -> ConfigError {
        let open = self.tokens[..self.i.min(self.tokens.len())]
            .iter()
            .rposition(|t| t.text == "[")
            .unwrap_or(0);
        ConfigError::UnclosedList {
            key: key.to_string(),
            list: self.text(open, self.tokens.len()).to_string(),
        }
    }

    fn divisions(&mut self, key: &str) -> Result<[u64; ROUNDUP_BUCKETS], ConfigError> {
        let mut out = [0u64; ROUNDUP_BUCKETS];
        if self.peek() != Some("[") {
            let d = self.integer(key, EXPECT_DIVISIONS)?;
            if d != 0 && !d.is_power_of_two() {
                return Err(invalid(key, d.to_string(), EXPECT_DIVISIONS));
            }
            return Ok([d; ROUNDUP_BUCKETS]);
        }
        self.i += 1;
        let mut first = true;
        let mut last_index = 0usize;
        let mut named_any = false;
        loop {
            match self.peek() {
                Some("]") => {
                    self.i += 1;
                    break;
                }
                None => return Err(self.unclosed(key)),
                Some(_) => {}
            }
            let item_start = self.i;
            let k = self.item_word(key, item_start)?;
            if self.peek() != Some(":") {
                return Err(self.list_item(key, item_start));
            }
            self.i += 1;
            let v = self.item_word(key, item_start)?;
            let v = v
                .parse::<u64>()
                .ok()
                .filter(|v| *v == 0 || v.is_power_of_two())
                .ok_or_else(|| invalid(key, format!("{k}:{v}"), EXPECT_DIVISIONS))?;
            if k == ">" {
                if named_any {
                    tracing::warn!(
                        bucket_mb = 1u64 << last_index,
                        divisions = v,
                        "roundup_power2_divisions: '>' also overrides the last named bucket \
                         ({} MB), as PyTorch does",
                        1u64 << last_index
                    );
                    self.warnings.push(format!(
                        "roundup_power2_divisions: '>:{v}' also sets the last named bucket \
                         ({} MB) to {v}, as PyTorch does",
                        1u64 << last_index
                    ));
                }
                out[last_index..].fill(v);
            } else {
                let mb = k
                    .parse::<u64>()
                    .ok()
                    .filter(|m| m.is_power_of_two())
                    .ok_or_else(|| invalid(key, format!("{k}:{v}"), EXPECT_DIVISIONS))?;
                let index = ((63 - mb.leading_zeros()) as usize).min(ROUNDUP_BUCKETS - 1);
                if first {
                    out[..index].fill(v);
                    first = false;
                }
                out[index] = v;
                last_index = index;
                named_any = true;
            }
            match self.peek() {
                Some("]") => {}
                Some(",") => self.i += 1,
                None => return Err(self.unclosed(key)),
                Some(_) => return Err(self.list_item(key, item_start)),
            }
        }
        Ok(out)
    }
}

/// Typed setters for an [`AllocatorConfig`], one per key of the settings string;
/// [`build`](Self::build) checks the same rules as [`AllocatorConfig::parse`].
///
/// # Examples
/// ```
/// use allocview_alloc::caching::AllocatorConfig;
///
/// let c = AllocatorConfig::builder()
///     .max_split_size_mb(256)
///     .expandable_segments(true)
///     .pinned_num_register_threads(8)
///     .build()
///     .unwrap();
/// assert_eq!(c.max_split_size(), Some(256 << 20));
/// assert_eq!(c.source(), "max_split_size_mb:256,expandable_segments:True,pinned_num_register_threads:8");
/// // The same settings as the string, which also parses back to them.
/// assert_eq!(AllocatorConfig::parse(c.source()).unwrap(), c);
/// // Out-of-range values are the same errors as in a string.
/// let e = AllocatorConfig::builder().max_split_size_mb(10).build().unwrap_err();
/// assert!(e.to_string().contains("max_split_size_mb"));
/// ```
#[derive(Debug, Clone)]
pub struct AllocatorConfigBuilder {
    config: AllocatorConfig,
    /// `max_split_size_mb` as given (checked, then turned into bytes, by `build`).
    max_split_size_mb: Option<u64>,
    /// `max_non_split_rounding_mb` as given.
    max_non_split_rounding_mb: Option<u64>,
}

/// The builder from PyTorch's defaults, as [`AllocatorConfig::builder`].
impl Default for AllocatorConfigBuilder {
    fn default() -> Self {
        AllocatorConfig::builder()
    }
}

impl AllocatorConfigBuilder {
    /// `max_split_size_mb` (at least 20; above [`MAX_SPLIT_SIZE_MB`] counts as it).
    pub fn max_split_size_mb(mut self, mb: u64) -> Self {
        self.max_split_size_mb = Some(mb);
        self
    }

    /// `max_non_split_rounding_mb` (at least 20; above [`MAX_SPLIT_SIZE_MB`] counts as it).
    pub fn max_non_split_rounding_mb(mut self, mb: u64) -> Self {
        self.max_non_split_rounding_mb = Some(mb);
        self
    }

    /// `garbage_collection_threshold` (strictly between 0 and 1).
    pub fn garbage_collection_threshold(mut self, t: f64) -> Self {
        self.config.garbage_collection_threshold = t;
        self
    }

    /// `expandable_segments`.
    pub fn expandable_segments(mut self, on: bool) -> Self {
        self.config.expandable_segments = on;
        self
    }

    /// `release_lock_on_cudamalloc`.
    pub fn release_lock_on_cudamalloc(mut self, on: bool) -> Self {
        self.config.release_lock_on_cudamalloc = on;
        self
    }

    /// `roundup_power2_divisions:N` for every bucket (0 or a power of two).
    pub fn roundup_power2_divisions(mut self, d: u64) -> Self {
        self.config.roundup_power2_divisions = [d; ROUNDUP_BUCKETS];
        self
    }

    /// Divisions per bucket (bucket `i` covers sizes from `2^i` MiB).
    pub fn roundup_power2_divisions_per_bucket(mut self, d: [u64; ROUNDUP_BUCKETS]) -> Self {
        self.config.roundup_power2_divisions = d;
        self
    }

    /// `pinned_num_register_threads` (a power of two, at most
    /// [`MAX_PINNED_REGISTER_THREADS`]; host allocator setting, no effect here).
    pub fn pinned_num_register_threads(mut self, n: u64) -> Self {
        self.config.pinned_num_register_threads = n;
        self
    }

    /// `pinned_use_cuda_host_register` (host allocator setting, no effect here).
    pub fn pinned_use_cuda_host_register(mut self, on: bool) -> Self {
        self.config.pinned_use_cuda_host_register = on;
        self
    }

    /// `pinned_use_background_threads` (host allocator setting, no effect here).
    pub fn pinned_use_background_threads(mut self, on: bool) -> Self {
        self.config.pinned_use_background_threads = on;
        self
    }

    /// `pinned_reserve_segment_size_mb` (0, the default, leaves it unset; host allocator
    /// setting, no effect here).
    pub fn pinned_reserve_segment_size_mb(mut self, mb: u64) -> Self {
        self.config.pinned_reserve_segment_size_mb = mb;
        self
    }

    /// `graph_capture_record_stream_reuse` (accepted and reported; no effect here).
    pub fn graph_capture_record_stream_reuse(mut self, on: bool) -> Self {
        self.config.graph_capture_record_stream_reuse = on;
        self
    }

    /// Checks the settings and returns the config, whose [`source`](AllocatorConfig::source)
    /// is the settings in PyTorch's syntax.
    ///
    /// # Errors
    /// [`ConfigError::InvalidValue`] naming the first setting out of range.
    pub fn build(self) -> Result<AllocatorConfig, ConfigError> {
        let mut c = self.config;
        if let Some(mb) = self.max_split_size_mb {
            c.max_split_size = Some(split_mb_to_bytes("max_split_size_mb", mb)?);
        }
        if let Some(mb) = self.max_non_split_rounding_mb {
            c.max_non_split_rounding = split_mb_to_bytes("max_non_split_rounding_mb", mb)?;
        }
        let t = c.garbage_collection_threshold;
        if t != 0.0 && !(t > 0.0 && t < 1.0) {
            return Err(invalid(
                "garbage_collection_threshold",
                t.to_string(),
                EXPECT_THRESHOLD,
            ));
        }
        if let Some(d) = c
            .roundup_power2_divisions
            .iter()
            .find(|d| **d != 0 && !d.is_power_of_two())
        {
            return Err(invalid(
                "roundup_power2_divisions",
                d.to_string(),
                EXPECT_DIVISIONS,
            ));
        }
        register_threads("pinned_num_register_threads", c.pinned_num_register_threads)?;
        let mut parts = c.device_conf_parts();
        parts.extend(c.host_conf_parts());
        c.source = parts.join(",");
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_splits_punctuation_and_skips_whitespace() {
        let texts: Vec<String> = tokenize("a:1, b : [2:3,>:4]")
            .into_iter()
            .map(|t| t.text)
            .collect();
        assert_eq!(
            texts,
            vec![
                "a", ":", "1", ",", "b", ":", "[", "2", ":", "3", ",", ">", ":", "4", "]"
            ]
        );
    }
}
