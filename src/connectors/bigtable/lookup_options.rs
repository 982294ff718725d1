//! The options of a Bigtable table read by lookup joins (`lookup_cache_rows`,
//! `lookup_cache_ttl`; see `docs/bigtable.md`, "Lookup joins", and ADR 0078).

use std::time::Duration;

use super::lookup::CacheSettings;
use crate::error::Result;
use crate::options::{
    Bound, DefaultValue, OptionGroup, OptionKind, OptionSpec, ParsedOptions, Redact,
};

/// Default time a cached lookup row is trusted.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(60);
/// Most rows a lookup cache may hold.
pub const MAX_CACHE_ROWS: i64 = 10_000_000;

/// `lookup_cache_rows`.
pub static LOOKUP_CACHE_ROWS: OptionSpec = OptionSpec {
    name: "lookup_cache_rows",
    group: OptionGroup::Reader,
    kind: OptionKind::Int,
    default: DefaultValue::Int(0),
    bound: Bound::IntRange {
        min: 0,
        max: MAX_CACHE_ROWS,
    },
    cross_rule: "",
    example: "100000",
    description: "When a lookup join reads this table, keep up to this many keys (rows found and keys found absent) in memory, least recently used evicted first, so that a key seen again within `lookup_cache_ttl` is not read again. `0` (the default) reads every input batch's keys from Bigtable.",
    redact: Redact::None,
};

/// `lookup_cache_ttl`.
pub static LOOKUP_CACHE_TTL: OptionSpec = OptionSpec {
    name: "lookup_cache_ttl",
    group: OptionGroup::Reader,
    kind: OptionKind::Duration,
    default: DefaultValue::Duration(DEFAULT_CACHE_TTL),
    bound: Bound::AtLeastMillis,
    cross_rule: "",
    example: "5m",
    description: "How long a lookup join trusts a cached row (or a key cached as absent) before it reads the key again: a row changed in Bigtable is seen at most this late. Used only when `lookup_cache_rows` is above 0.",
    redact: Redact::None,
};

/// The lookup options, in the order the reference lists them.
pub static SPECS: [&OptionSpec; 2] = [&LOOKUP_CACHE_ROWS, &LOOKUP_CACHE_TTL];

/// The lookup cache a declaration asks for (`None`: no cache).
pub fn from_parsed(p: &ParsedOptions) -> Result<Option<CacheSettings>> {
    let rows = p.int(&LOOKUP_CACHE_ROWS)?.unwrap_or(0);
    let ttl = p.duration(&LOOKUP_CACHE_TTL)?;
    if rows == 0 {
        return Ok(None);
    }
    Ok(Some(CacheSettings {
        rows: usize::try_from(rows).unwrap_or(usize::MAX),
        ttl: ttl.unwrap_or(DEFAULT_CACHE_TTL),
    }))
}
