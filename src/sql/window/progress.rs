//! The progress marker of a windowed pipeline (ADR 0068): one small JSON object under the
//! source's `progress_path`, saying up to which point windows were emitted and delivered.
//!
//! ```json
//! {"version":1,"pipeline":"demo.clicks-sub--page_counts--3f2a9c1e","frontier_ns":1764756000000000000,"recorded_at":"2026-12-03T10:00:00Z"}
//! ```
//!
//! It is written whole each time (an object store's put replaces an object atomically), only
//! after the windows it covers were delivered, and before any of their messages is settled.

use std::sync::Arc;
use std::time::Duration;

use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::object_store::path::Path as StorePath;
use datafusion::object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};

use crate::error::{Error, Result};
use crate::options::event_time::ProgressLocation;

/// The marker's format version.
const VERSION: u32 = 1;

/// What the marker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The format version.
    pub version: u32,
    /// The pipeline it belongs to.
    pub pipeline: String,
    /// Every window that ends at or before this (ns since the epoch) was delivered; `None`
    /// before the first window.
    pub frontier_ns: Option<i64>,
    /// When the marker was written (RFC 3339, UTC).
    pub recorded_at: String,
    /// The statement's watermark when it was written (ns): rows up to it had been read. A
    /// message that moved it may be acknowledged since (filtered out, say), so the next run
    /// starts from it rather than from what it reads again.
    pub watermark_ns: Option<i64>,
    /// Whether the run that wrote it ended gracefully: `false` while a run is going, so a
    /// marker that still says so after a run means that run was killed.
    pub clean: bool,
    /// The run that wrote it (a process-unique id), so a second run of the same pipeline
    /// (a replica) can tell that the marker is kept by another; `None` in markers written
    /// before runs were named.
    pub run: Option<String>,
    /// Rows found late whose dead letters may not be stored or whose messages may not be
    /// acknowledged yet, as (message id, release ns): a message named here is late in any
    /// later run too, even one that recomputes its window (ADR 0068). Usually empty.
    pub late: Vec<(String, i64)>,
}

impl Progress {
    fn to_json(&self) -> Vec<u8> {
        serde_json::json!({
            "version": self.version,
            "pipeline": self.pipeline,
            "frontier_ns": self.frontier_ns,
            "recorded_at": self.recorded_at,
            "clean": self.clean,
            "watermark_ns": self.watermark_ns,
            "run": self.run,
            "late": self.late.iter().map(|(id, r)| serde_json::json!([id, r])).collect::<Vec<_>>(),
        })
        .to_string()
        .into_bytes()
    }

    fn from_json(bytes: &[u8]) -> std::result::Result<Self, String> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let field = |name: &str| value.get(name).ok_or(format!("no '{name}'"));
        let text = |name: &str| -> std::result::Result<String, String> {
            field(name)?
                .as_str()
                .map(str::to_string)
                .ok_or(format!("'{name}' is not a string"))
        };
        let version = field("version")?
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or("'version' is not a number")?;
        let frontier_ns = match field("frontier_ns")? {
            serde_json::Value::Null => None,
            v => Some(v.as_i64().ok_or("'frontier_ns' is not an integer")?),
        };
        Ok(Progress {
            version,
            pipeline: text("pipeline")?,
            frontier_ns,
            recorded_at: text("recorded_at")?,
            clean: field("clean")?
                .as_bool()
                .ok_or("'clean' is not a boolean")?,
            watermark_ns: match value.get("watermark_ns") {
                None | Some(serde_json::Value::Null) => None,
                Some(v) => Some(v.as_i64().ok_or("'watermark_ns' is not an integer")?),
            },
            run: match value.get("run") {
                None | Some(serde_json::Value::Null) => None,
                Some(v) => Some(v.as_str().ok_or("'run' is not a string")?.to_string()),
            },
            late: match value.get("late") {
                None | Some(serde_json::Value::Null) => Vec::new(),
                Some(v) => v
                    .as_array()
                    .ok_or("'late' is not a list")?
                    .iter()
                    .map(|e| {
                        match (
                            e.get(0).and_then(|i| i.as_str()),
                            e.get(1).and_then(|r| r.as_i64()),
                        ) {
                            (Some(id), Some(release)) => Ok((id.to_string(), release)),
                            _ => Err("an entry of 'late' is not [message id, release]".to_string()),
                        }
                    })
                    .collect::<std::result::Result<_, _>>()?,
            },
        })
    }

    /// How long ago it was written, by this machine's clock (`None` when `recorded_at` does
    /// not parse).
    fn age(&self) -> Option<Duration> {
        let at = chrono::DateTime::parse_from_rfc3339(&self.recorded_at).ok()?;
        let now = chrono::Utc::now();
        (now - at.with_timezone(&chrono::Utc))
            .to_std()
            .ok()
            .or(Some(Duration::ZERO))
    }
}

/// Where one pipeline's marker is, and the store that holds it.
#[derive(Debug, Clone)]
pub struct Marker {
    store: Arc<dyn ObjectStore>,
    location: StorePath,
    /// The marker's URL, for messages.
    url: String,
    pipeline: String,
    may_create: bool,
    /// This run's id, written in every marker it writes.
    run: String,
}

/// How often a run refreshes its marker while it goes, so another run of the same pipeline can
/// tell it is alive.
pub const REFRESH_EVERY: Duration = Duration::from_secs(2);

/// A marker that says a run is going, unwritten for this long, belongs to a run that is gone
/// (killed): four refreshes missed.
pub const STALE_AFTER: Duration = Duration::from_secs(8);

/// After a run first writes its marker, it reads it back this much later, before it emits
/// anything: a second run that started at the same moment has written its own by then.
pub const CONFIRM_AFTER: Duration = Duration::from_secs(1);

impl Marker {
    /// The marker of `pipeline` in `at`, through the session's object stores (a default
    /// runtime, with `file://` only, when `None`).
    pub fn open(
        at: &ProgressLocation,
        pipeline: &str,
        runtime: Option<&Arc<RuntimeEnv>>,
    ) -> Result<Self> {
        let folder = &at.folder;
        let url = format!("{}/{pipeline}.json", folder.as_str().trim_end_matches('/'));
        let fail = |message: String| Error::Progress {
            marker: url.clone(),
            message,
        };
        let store_url = ObjectStoreUrl::parse(&folder[..url::Position::BeforePath])
            .map_err(|e| fail(e.to_string()))?;
        let runtime = runtime
            .cloned()
            .unwrap_or_else(|| Arc::new(RuntimeEnv::default()));
        let store = runtime
            .object_store(&store_url)
            .map_err(|e| fail(format!("no object store is registered for it: {e}")))?;
        if folder.scheme() == "file" {
            std::fs::create_dir_all(folder.path())
                .map_err(|e| fail(format!("the folder cannot be created: {e}")))?;
        }
        let path = format!("{}/{pipeline}.json", folder.path().trim_end_matches('/'));
        let location = StorePath::from_url_path(&path).map_err(|e| fail(e.to_string()))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        Ok(Marker {
            store,
            location,
            url,
            pipeline: pipeline.to_string(),
            may_create: at.may_create,
            run: format!("{:x}-{nanos:x}", std::process::id()),
        })
    }

    /// The marker's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn fail(&self, message: impl Into<String>) -> Error {
        Error::Progress {
            marker: self.url.clone(),
            message: message.into(),
        }
    }

    /// This run's id (in every marker it writes).
    pub fn run(&self) -> &str {
        &self.run
    }

    /// Reads the marker: `None` when it does not exist; an error when it cannot be read, is
    /// not a marker of this format, or belongs to another pipeline.
    async fn read(&self) -> Result<Option<Progress>> {
        let found = match self.store.get(&self.location).await {
            Ok(found) => found,
            Err(datafusion::object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.fail(format!("it cannot be read: {e}"))),
        };
        let bytes = found
            .bytes()
            .await
            .map_err(|e| self.fail(format!("it cannot be read: {e}")))?;
        let progress = Progress::from_json(&bytes)
            .map_err(|e| self.fail(format!("it is not a progress marker: {e}")))?;
        if progress.version != VERSION {
            return Err(self.fail(format!(
                "its version is {}; this build reads version {VERSION}",
                progress.version
            )));
        }
        if progress.pipeline != self.pipeline {
            return Err(self.fail(format!(
                "it belongs to pipeline '{}', not '{}'",
                progress.pipeline, self.pipeline
            )));
        }
        Ok(Some(progress))
    }

    /// Reads the marker when a run starts. A missing marker is created (with no frontier) when
    /// `progress_start = 'new'`, and is an error otherwise; a marker of another pipeline or
    /// format is an error.
    ///
    /// A marker that says another run is going (not `clean`, written by another run) is
    /// watched: if that run refreshes it, it is alive, and this run is refused (a windowed
    /// pipeline runs as one process); once it went [`STALE_AFTER`] unwritten, that run is
    /// gone (killed) and this one takes over.
    pub async fn start(&self) -> Result<Progress> {
        let Some(mut progress) = self.read().await? else {
            if self.may_create {
                let progress = self.progress(None, None, true, &[]);
                self.write(&progress).await?;
                return Ok(progress);
            }
            return Err(self.fail(
                "it does not exist. If this is the pipeline's first run, add \
                 progress_start = 'new' to the source table's options (and drop it after the \
                 first run); if the pipeline ran before, its marker was deleted: windows whose \
                 messages were partly acknowledged would be computed again from part of them, \
                 so restore the marker, or seek the subscription past the windows already \
                 written before starting it as new",
            ));
        };
        loop {
            let Some(other) = progress
                .run
                .clone()
                .filter(|r| !progress.clean && *r != self.run)
            else {
                return Ok(progress);
            };
            let age = progress.age().unwrap_or(STALE_AFTER);
            if age >= STALE_AFTER {
                tracing::warn!(
                    marker = %self.url,
                    run = %other,
                    "the run that kept this marker last wrote it {age:?} ago: it is gone, this run takes over"
                );
                return Ok(progress);
            }
            tokio::time::sleep((STALE_AFTER - age).min(Duration::from_secs(1))).await;
            let again = self
                .read()
                .await?
                .ok_or_else(|| self.fail("it was deleted while this run started"))?;
            if again.run != progress.run || again.recorded_at != progress.recorded_at {
                if again.clean {
                    // It ended gracefully meanwhile: start from what it left.
                    progress = again;
                    continue;
                }
                return Err(self.another_run(again.run.as_deref().unwrap_or("?")));
            }
            progress = again;
        }
    }

    fn another_run(&self, other: &str) -> Error {
        self.fail(format!(
            "another run of this pipeline (run {other}) keeps it and is going: a windowed \
             pipeline runs as one process, since a window needs every message of its keys and \
             Pub/Sub spreads a subscription's messages over every reader. Stop the other run, \
             or run this one on another subscription (this run read nothing)"
        ))
    }

    /// Reads the marker back after this run wrote it: an error naming the other run when a
    /// run of the same pipeline wrote it since.
    pub async fn confirm(&self) -> Result<()> {
        match self.read().await? {
            Some(p) if p.run.as_deref().is_some_and(|r| r != self.run) => {
                Err(self.another_run(p.run.as_deref().unwrap_or("?")))
            }
            Some(_) => Ok(()),
            None => Err(self.fail("it was deleted while the run was going")),
        }
    }

    fn progress(
        &self,
        frontier_ns: Option<i64>,
        watermark_ns: Option<i64>,
        clean: bool,
        late: &[(String, i64)],
    ) -> Progress {
        Progress {
            version: VERSION,
            pipeline: self.pipeline.clone(),
            frontier_ns,
            watermark_ns,
            clean,
            run: Some(self.run.clone()),
            late: late.to_vec(),
            recorded_at: chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now())
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        }
    }

    /// Records that every window ending at or before `frontier_ns` was delivered, by a run
    /// still going. Refused when another run of the pipeline wrote the marker since this one
    /// last did ([`confirm`](Self::confirm)).
    /// `late` are the late rows whose messages may still come back ([`Progress::late`]).
    pub async fn record(
        &self,
        frontier_ns: Option<i64>,
        watermark_ns: Option<i64>,
        late: &[(String, i64)],
    ) -> Result<()> {
        self.confirm().await?;
        self.write(&self.progress(frontier_ns, watermark_ns, false, late))
            .await
    }

    /// Takes the marker for this run as it starts: records what it says, as this run's.
    /// `late` are the late rows the previous run left ([`Progress::late`]): kept until this run
    /// has seen them again or they cannot come back.
    pub async fn claim(
        &self,
        frontier_ns: Option<i64>,
        watermark_ns: Option<i64>,
        late: &[(String, i64)],
    ) -> Result<()> {
        self.write(&self.progress(frontier_ns, watermark_ns, false, late))
            .await
    }

    /// Records that the run ended gracefully, every window ending at or before
    /// `frontier_ns` delivered.
    pub async fn close(&self, frontier_ns: Option<i64>, watermark_ns: Option<i64>) -> Result<()> {
        self.confirm().await?;
        self.write(&self.progress(frontier_ns, watermark_ns, true, &[]))
            .await
    }

    async fn write(&self, progress: &Progress) -> Result<()> {
        self.store
            .put(&self.location, PutPayload::from(progress.to_json()))
            .await
            .map_err(|e| self.fail(format!("it cannot be written: {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(dir: &std::path::Path, may_create: bool) -> ProgressLocation {
        ProgressLocation {
            folder: url::Url::from_directory_path(dir).unwrap(),
            may_create,
        }
    }

    #[tokio::test]
    async fn a_missing_marker_is_refused_unless_the_run_is_new() {
        let dir = tempfile::tempdir().unwrap();
        let strict = Marker::open(&at(dir.path(), false), "p--t--1", None).unwrap();
        let refused = strict.start().await.unwrap_err().to_string();
        assert!(refused.contains("p--t--1.json"), "{refused}");
        assert!(refused.contains("progress_start = 'new'"), "{refused}");

        let new = Marker::open(&at(dir.path(), true), "p--t--1", None).unwrap();
        assert_eq!(new.start().await.unwrap().frontier_ns, None);
        new.record(Some(42), Some(50), &[("m-1".into(), 40)])
            .await
            .unwrap();
        // Read as a marker (starting from it would wait for the run that wrote it to go).
        let read = strict.read().await.unwrap().unwrap();
        assert_eq!(
            (read.frontier_ns, read.watermark_ns, read.clean),
            (Some(42), Some(50), false)
        );
        assert_eq!(read.late, vec![("m-1".to_string(), 40)]);
        let raw = std::fs::read_to_string(dir.path().join("p--t--1.json")).unwrap();
        assert!(raw.contains("\"frontier_ns\":42"), "{raw}");
        assert!(raw.contains("\"late\":[[\"m-1\",40]]"), "{raw}");
    }

    #[tokio::test]
    async fn a_second_run_of_a_pipeline_is_refused_while_the_first_keeps_its_marker() {
        let dir = tempfile::tempdir().unwrap();
        let first = Marker::open(&at(dir.path(), true), "p", None).unwrap();
        first.start().await.unwrap();
        first.claim(None, None, &[]).await.unwrap();
        let second = Marker::open(&at(dir.path(), true), "p", None).unwrap();
        assert_ne!(first.run(), second.run());
        let starting = tokio::spawn(async move { second.start().await });
        // The first run refreshes its marker, as its keeper does while it goes.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        first.record(Some(7), Some(9), &[]).await.unwrap();
        let refused = starting.await.unwrap().unwrap_err().to_string();
        assert!(
            refused.contains("another run of this pipeline"),
            "{refused}"
        );
        assert!(refused.contains(first.run()), "{refused}");
        assert!(refused.contains("p.json"), "{refused}");
    }

    #[tokio::test]
    async fn a_marker_left_by_a_killed_run_is_taken_over_and_the_old_run_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let old = chrono::Utc::now() - chrono::Duration::seconds(60);
        std::fs::write(
            dir.path().join("p.json"),
            format!(
                r#"{{"version":1,"pipeline":"p","frontier_ns":5,"watermark_ns":6,"recorded_at":"{}","clean":false,"run":"killed"}}"#,
                old.to_rfc3339()
            ),
        )
        .unwrap();
        let next = Marker::open(&at(dir.path(), false), "p", None).unwrap();
        let progress = next.start().await.unwrap();
        assert_eq!((progress.frontier_ns, progress.clean), (Some(5), false));
        assert_eq!(progress.run.as_deref(), Some("killed"));
        next.claim(Some(5), Some(6), &[]).await.unwrap();
        next.confirm().await.unwrap();

        // Two runs that claimed it at the same moment: the one whose claim was overwritten
        // gives way, and cannot write it again.
        let other = Marker::open(&at(dir.path(), false), "p", None).unwrap();
        other.claim(Some(5), Some(6), &[]).await.unwrap();
        let e = next.confirm().await.unwrap_err().to_string();
        assert!(e.contains(other.run()), "{e}");
        assert!(next.record(Some(8), None, &[]).await.is_err());
        other.confirm().await.unwrap();
        other.record(Some(8), None, &[]).await.unwrap();
    }

    #[tokio::test]
    async fn a_marker_of_another_pipeline_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.json"),
            r#"{"version":1,"pipeline":"b","frontier_ns":1,"recorded_at":"x","clean":true}"#,
        )
        .unwrap();
        let m = Marker::open(&at(dir.path(), false), "a", None).unwrap();
        let e = m.start().await.unwrap_err().to_string();
        assert!(e.contains("pipeline 'b'"), "{e}");
        std::fs::write(dir.path().join("a.json"), "not json").unwrap();
        let e = m.start().await.unwrap_err().to_string();
        assert!(e.contains("not a progress marker"), "{e}");
    }
}
