//! Event time, watermarks and the progress marker of a source that feeds windows (ADR 0068):
//! options any source can take, named after Arroyo's and Flink's where they have one.
//!
//! - `event_time_field` (Arroyo's name): the `TIMESTAMP` column whose value places a row in a
//!   window; by default the source's publish-time column.
//! - `allowed_lateness` (the name of Flink's window setting): how far behind the greatest event
//!   time a partition has delivered a window may still receive rows; a window is emitted once
//!   the watermark passes its end plus this.
//! - `idle_timeout` (after Flink's `table.exec.source.idle-timeout`; Arroyo's `idle_micros`): a
//!   partition that delivered no row for this long stops holding the watermark back.
//! - `progress_path`: the folder (`file://`, `gs://`, `s3://`, or a local path) of the progress
//!   marker; `progress_start = 'new'` lets a first run create it.
//!
//! ```
//! use std::time::Duration;
//! use gcp_sql::options::event_time::EventTimeOptions;
//!
//! let opts = EventTimeOptions::default();
//! assert_eq!(opts.allowed_lateness, Duration::ZERO);
//! assert_eq!(opts.idle_timeout, Duration::from_secs(30));
//! assert!(opts.progress.is_none());
//! ```

use std::time::Duration;

use super::{Bound, DefaultValue, OptionGroup, OptionKind, OptionSpec, ParsedOptions, Redact};
use crate::error::{Error, Result};

/// Default of `idle_timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// `event_time_field`.
pub static EVENT_TIME_FIELD: OptionSpec = OptionSpec {
    name: "event_time_field",
    group: OptionGroup::Reader,
    kind: OptionKind::Column,
    default: DefaultValue::Unset("the column `publish_time_column` names"),
    bound: Bound::None,
    cross_rule: "a `TIMESTAMP` column of the table",
    example: "event_time",
    description: "The column whose time places a row in a window (its event time). Arroyo's name for it. Without it, the publish time is the event time, which needs `publish_time_column`.",
    redact: Redact::None,
};

/// `allowed_lateness`.
pub static ALLOWED_LATENESS: OptionSpec = OptionSpec {
    name: "allowed_lateness",
    group: OptionGroup::Reader,
    kind: OptionKind::Duration,
    default: DefaultValue::Duration(Duration::ZERO),
    bound: Bound::None,
    cross_rule: "a window's width plus this must be shorter than `max_lease_duration`",
    example: "30s",
    description: "How long after a window's end (in event time) rows may still arrive for it: a window is emitted once, when the watermark passes its end plus this. A row for a window already emitted is late and follows `failure_policy`. Flink's name for the same bound (Flink fires again for late rows; this source emits a window once).",
    redact: Redact::None,
};

/// `idle_timeout`.
pub static IDLE_TIMEOUT: OptionSpec = OptionSpec {
    name: "idle_timeout",
    group: OptionGroup::Reader,
    kind: OptionKind::Duration,
    default: DefaultValue::Duration(DEFAULT_IDLE_TIMEOUT),
    bound: Bound::AtLeastMillis,
    cross_rule: "",
    example: "1m",
    description: "A stream that delivered no row for this long (wall-clock time) stops holding the watermark back, so windows still close when one stream of several goes quiet. Flink's `table.exec.source.idle-timeout`.",
    redact: Redact::None,
};

/// `progress_path`.
pub static PROGRESS_PATH: OptionSpec = OptionSpec {
    name: "progress_path",
    group: OptionGroup::Reader,
    kind: OptionKind::Text,
    default: DefaultValue::Unset("a windowed INSERT from the table is refused"),
    bound: Bound::NotEmpty,
    cross_rule: "needed by a windowed INSERT",
    example: "file:///var/lib/gcp-sql/progress",
    description: "The folder of the progress marker of windowed pipelines that read this table: a few bytes per pipeline saying how far windows were emitted and delivered, the only state a window needs (ADR 0068). `file:///...`, a local path, or `gs://` / `s3://` with a registered store.",
    redact: Redact::None,
};

/// `progress_start`.
pub static PROGRESS_START: OptionSpec = OptionSpec {
    name: "progress_start",
    group: OptionGroup::Reader,
    kind: OptionKind::Enum(&["existing", "new"]),
    default: DefaultValue::Text("existing"),
    bound: Bound::None,
    cross_rule: "",
    example: "new",
    description: "`new` lets the first run of a windowed pipeline create its progress marker. Without it a missing marker fails the statement, naming the marker: a deleted marker would let partly acknowledged windows be computed again from part of their messages. Drop it after the first run.",
    redact: Redact::None,
};

/// The event-time options, in the order the reference lists them.
pub static SPECS: [&OptionSpec; 5] = [
    &EVENT_TIME_FIELD,
    &ALLOWED_LATENESS,
    &IDLE_TIMEOUT,
    &PROGRESS_PATH,
    &PROGRESS_START,
];

/// Where a pipeline's progress marker lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressLocation {
    /// The folder, as a URL (`file:///...`, `gs://bucket/...`, `s3://bucket/...`).
    pub folder: url::Url,
    /// Whether a missing marker may be created (`progress_start = 'new'`).
    pub may_create: bool,
}

/// A source's event-time settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTimeOptions {
    /// `event_time_field`, or the publish-time column; `None` when neither is declared.
    pub column: Option<String>,
    /// `allowed_lateness`.
    pub allowed_lateness: Duration,
    /// `idle_timeout`.
    pub idle_timeout: Duration,
    /// `progress_path` and `progress_start`.
    pub progress: Option<ProgressLocation>,
}

impl Default for EventTimeOptions {
    fn default() -> Self {
        EventTimeOptions {
            column: None,
            allowed_lateness: Duration::ZERO,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            progress: None,
        }
    }
}

impl EventTimeOptions {
    /// The settings of `p`, the event-time column defaulting to `publish_time` (the source's
    /// publish-time column, if it declares one).
    pub fn from_parsed(p: &ParsedOptions, publish_time: Option<&str>) -> Result<Self> {
        let column = p
            .text(&EVENT_TIME_FIELD)?
            .or(publish_time)
            .map(str::to_string);
        let progress = match p.text(&PROGRESS_PATH)? {
            Some(text) => Some(ProgressLocation {
                folder: folder_url(text).map_err(|rule| PROGRESS_PATH.invalid(text, rule))?,
                may_create: p.text(&PROGRESS_START)? == Some("new"),
            }),
            None if p.has(&PROGRESS_START) => {
                return Err(Error::invalid(
                    PROGRESS_START.name,
                    p.text_as_written(&PROGRESS_START).unwrap_or_default(),
                    "is used with 'progress_path' only: name the folder of the progress marker",
                ));
            }
            None => None,
        };
        Ok(EventTimeOptions {
            column,
            allowed_lateness: p.duration(&ALLOWED_LATENESS)?.unwrap_or(Duration::ZERO),
            idle_timeout: p.duration(&IDLE_TIMEOUT)?.unwrap_or(DEFAULT_IDLE_TIMEOUT),
            progress,
        })
    }
}

/// The folder URL of `text`: a `file://`, `gs://` or `s3://` URL, or a local path (made
/// absolute against the working directory).
fn folder_url(text: &str) -> std::result::Result<url::Url, String> {
    let text = text.trim();
    if !text.contains("://") {
        let path = std::path::Path::new(text);
        let absolute = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(|e| format!("the working directory is unknown ({e})"))?
                .join(path)
        };
        return url::Url::from_directory_path(&absolute)
            .map_err(|()| "expected a folder path or a URL like 'file:///var/progress'".into());
    }
    let url = url::Url::parse(text).map_err(|e| {
        format!("expected a URL like 'file:///var/progress' or 'gs://bucket/progress' ({e})")
    })?;
    match url.scheme() {
        "file" if url.host_str().is_some_and(|h| !h.is_empty()) => {
            Err("a file:// URL names a local folder: 'file:///absolute/path'".into())
        }
        "file" => Ok(url),
        "gs" | "s3" if url.host_str().is_none_or(str::is_empty) => {
            Err(format!("a {}:// URL needs a bucket", url.scheme()))
        }
        "gs" | "s3" => Ok(url),
        other => Err(format!(
            "'{other}://' is not a store for the progress marker: use file://, gs:// or s3://"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::RawOptions;

    fn parse(pairs: &[(&str, &str)], publish: Option<&str>) -> Result<EventTimeOptions> {
        let raw =
            RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))?;
        let p = ParsedOptions::parse("pubsub", &SPECS, &raw)?;
        EventTimeOptions::from_parsed(&p, publish)
    }

    #[test]
    fn the_publish_time_column_is_the_event_time_unless_a_field_is_named() {
        assert_eq!(
            parse(&[], Some("pt")).unwrap().column.as_deref(),
            Some("pt")
        );
        let named = parse(&[("event_time_field", "ts")], Some("pt")).unwrap();
        assert_eq!(named.column.as_deref(), Some("ts"));
        assert_eq!(parse(&[], None).unwrap().column, None);
    }

    #[test]
    fn a_progress_folder_is_a_url_or_a_local_path() {
        let o = parse(
            &[("progress_path", "/var/p"), ("progress_start", "new")],
            None,
        )
        .unwrap();
        let at = o.progress.unwrap();
        assert_eq!(at.folder.as_str(), "file:///var/p/");
        assert!(at.may_create);
        let gs = parse(&[("progress_path", "gs://b/p")], None).unwrap();
        assert!(!gs.progress.unwrap().may_create);
        let bad = parse(&[("progress_path", "http://x/p")], None).unwrap_err();
        assert!(bad.to_string().contains("progress_path"), "{bad}");
        let lone = parse(&[("progress_start", "new")], None).unwrap_err();
        assert!(lone.to_string().contains("progress_start"), "{lone}");
    }

    #[test]
    fn lateness_and_idleness_are_durations() {
        let o = parse(&[("allowed_lateness", "5s"), ("idle_timeout", "1m")], None).unwrap();
        assert_eq!(o.allowed_lateness, Duration::from_secs(5));
        assert_eq!(o.idle_timeout, Duration::from_secs(60));
        assert!(parse(&[("idle_timeout", "0s")], None).is_err());
    }
}
