//! The progress marker of a windowed pipeline (ADR 0068): one small JSON object under the
//! source's `progress_path`, saying up to which point windows were emitted and delivered.
//!
//! ```json
//! {"version":1,"pipeline":"demo.clicks-sub--page_counts--3f2a9c1e","frontier_ns":1764756000000000000,"recorded_at":"2026-12-03T10:00:00Z"}
//! ```
//!
//! It is written whole each time (an object store's put replaces an object atomically), only
//! after the windows it covers were delivered, and before any of their messages is settled.
//!
//! Beside it, in `<pipeline>.covered/`, are the **covered sets**: for each recent frontier, the
//! fingerprints of the messages its record let go of ([`CoveredSet`]). The marker lists the
//! frontiers whose sets are kept (`covered`); a set is written before the marker that lists it
//! and deleted after the marker that no longer does, so a listed set always exists.

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
    /// The covered sets kept beside the marker, by frontier: a message in one was counted in
    /// a recorded window (or dead-lettered) and may come back because a kill interrupted its
    /// acknowledgement. A set a run inherited carries the wall-clock time (ms since the epoch)
    /// until which runs keep it ([`Listed`]). `None` in markers written before covered sets
    /// were kept: then every message of a window at or before the frontier is taken as
    /// covered.
    pub covered: Option<Vec<Listed>>,
}

/// A covered set the marker lists: its frontier (ns), and for a set inherited from an earlier
/// run, until when (ms since the epoch) it is kept. Written as `F` or `[F, until]`.
pub type Listed = (i64, Option<i64>);

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
            "covered": self.covered.as_ref().map(|c| {
                c.iter()
                    .map(|(f, until)| match until {
                        None => serde_json::json!(f),
                        Some(u) => serde_json::json!([f, u]),
                    })
                    .collect::<Vec<_>>()
            }),
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
            covered: match value.get("covered") {
                None | Some(serde_json::Value::Null) => None,
                Some(v) => Some(
                    v.as_array()
                        .ok_or("'covered' is not a list")?
                        .iter()
                        .map(|e| match (e.as_i64(), e.get(0), e.get(1)) {
                            (Some(f), _, _) => Ok((f, None)),
                            (None, Some(f), Some(u)) => match (f.as_i64(), u.as_i64()) {
                                (Some(f), Some(u)) => Ok((f, Some(u))),
                                _ => Err("an entry of 'covered' is not [frontier, until]"),
                            },
                            _ => Err(
                                "an entry of 'covered' is neither a frontier nor [frontier, until]",
                            ),
                        })
                        .collect::<std::result::Result<_, _>>()?,
                ),
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

/// The fingerprints of the messages one frontier's record let go of, by release: what a run
/// that restarts after a kill acknowledges as covered, and nothing else (ADR 0068).
///
/// Stored as `GSQLCOV1`, then per release its value (i64), its count (u32) and that many
/// fingerprints (u128), all little-endian: 16 bytes a message.
pub type CoveredSet = Vec<(i64, Vec<u128>)>;

const COVERED_MAGIC: &[u8; 8] = b"GSQLCOV1";

/// A covered set being written: encoded as it is gathered, so that storing one costs its 16
/// bytes a message once, not a copy of the fingerprints as well.
#[derive(Debug, Clone)]
pub struct CoveredBytes {
    bytes: Vec<u8>,
    messages: usize,
}

impl CoveredBytes {
    /// An empty set, with room for `messages` fingerprints under `releases` releases.
    pub fn with_capacity(releases: usize, messages: usize) -> Self {
        let mut bytes = Vec::with_capacity(8 + 12 * releases + 16 * messages);
        bytes.extend_from_slice(COVERED_MAGIC);
        CoveredBytes { bytes, messages: 0 }
    }

    /// Adds the messages `ids` under `release` (at most `u32::MAX` of them per call).
    pub fn push(&mut self, release: i64, ids: impl ExactSizeIterator<Item = u128>) {
        let n = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        self.bytes.extend_from_slice(&release.to_le_bytes());
        self.bytes.extend_from_slice(&n.to_le_bytes());
        for id in ids.take(n as usize) {
            self.bytes.extend_from_slice(&id.to_le_bytes());
        }
        self.messages += n as usize;
    }

    /// How many messages it names.
    pub fn messages(&self) -> usize {
        self.messages
    }
}

impl From<&CoveredSet> for CoveredBytes {
    fn from(set: &CoveredSet) -> Self {
        let n = set.iter().map(|(_, ids)| ids.len()).sum();
        let mut out = CoveredBytes::with_capacity(set.len(), n);
        for (release, ids) in set {
            out.push(*release, ids.iter().copied());
        }
        out
    }
}

fn decode_covered(bytes: &[u8]) -> std::result::Result<CoveredSet, String> {
    let rest = bytes
        .strip_prefix(COVERED_MAGIC.as_slice())
        .ok_or("it does not start with GSQLCOV1")?;
    let mut set = Vec::new();
    let mut at = 0usize;
    let short = || format!("it ends early ({} bytes)", bytes.len());
    while at < rest.len() {
        let head = rest.get(at..at + 12).ok_or_else(short)?;
        let release = i64::from_le_bytes(head[..8].try_into().unwrap_or_default());
        let count = u32::from_le_bytes(head[8..].try_into().unwrap_or_default()) as usize;
        at += 12;
        let body = rest.get(at..at + 16 * count).ok_or_else(short)?;
        let ids = body
            .chunks_exact(16)
            .map(|c| u128::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        at += 16 * count;
        set.push((release, ids));
    }
    Ok(set)
}

/// Where one pipeline's marker is, and the store that holds it.
#[derive(Debug, Clone)]
pub struct Marker {
    store: Arc<dyn ObjectStore>,
    location: StorePath,
    /// The folder of its covered sets.
    covered: StorePath,
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
        let covered = StorePath::from_url_path(format!(
            "{}/{pipeline}.covered",
            folder.path().trim_end_matches('/')
        ))
        .map_err(|e| fail(e.to_string()))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        Ok(Marker {
            store,
            location,
            covered,
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
                let progress = self.progress(None, None, true, &[], &[]);
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
        covered: &[Listed],
    ) -> Progress {
        Progress {
            version: VERSION,
            pipeline: self.pipeline.clone(),
            frontier_ns,
            watermark_ns,
            clean,
            run: Some(self.run.clone()),
            late: late.to_vec(),
            covered: Some(covered.to_vec()),
            recorded_at: chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now())
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        }
    }

    /// Records that every window ending at or before `frontier_ns` was delivered, by a run
    /// still going. Refused when another run of the pipeline wrote the marker since this one
    /// last did ([`confirm`](Self::confirm)).
    /// `late` are the late rows whose messages may still come back ([`Progress::late`]);
    /// `covered` the frontiers whose covered sets are kept ([`Progress::covered`]).
    pub async fn record(
        &self,
        frontier_ns: Option<i64>,
        watermark_ns: Option<i64>,
        late: &[(String, i64)],
        covered: &[Listed],
    ) -> Result<()> {
        self.confirm().await?;
        self.write(&self.progress(frontier_ns, watermark_ns, false, late, covered))
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
        covered: &[Listed],
    ) -> Result<()> {
        self.write(&self.progress(frontier_ns, watermark_ns, false, late, covered))
            .await
    }

    /// Records that the run ended gracefully, every window ending at or before
    /// `frontier_ns` delivered. The covered sets still kept stay listed: the next run may
    /// start within their time.
    pub async fn close(
        &self,
        frontier_ns: Option<i64>,
        watermark_ns: Option<i64>,
        covered: &[Listed],
    ) -> Result<()> {
        self.confirm().await?;
        self.write(&self.progress(frontier_ns, watermark_ns, true, &[], covered))
            .await
    }

    fn covered_location(&self, frontier_ns: i64) -> StorePath {
        self.covered.clone().join(format!("{frontier_ns}.bin"))
    }

    fn covered_url(&self, frontier_ns: i64) -> String {
        format!(
            "{}.covered/{frontier_ns}.bin",
            self.url.trim_end_matches(".json")
        )
    }

    /// Stores the covered set of `frontier_ns`, before the marker that records the frontier
    /// (and lists the set) is written.
    pub async fn write_covered(&self, frontier_ns: i64, set: CoveredBytes) -> Result<()> {
        self.store
            .put(
                &self.covered_location(frontier_ns),
                PutPayload::from(set.bytes),
            )
            .await
            .map_err(|e| {
                self.fail(format!(
                    "the covered set {} cannot be written: {e}",
                    self.covered_url(frontier_ns)
                ))
            })?;
        Ok(())
    }

    /// Reads a covered set the marker lists: an error when it is missing or unreadable (the
    /// messages it names would otherwise be taken as late).
    pub async fn read_covered(&self, frontier_ns: i64) -> Result<CoveredSet> {
        let url = self.covered_url(frontier_ns);
        let bytes = match self.store.get(&self.covered_location(frontier_ns)).await {
            Ok(found) => found.bytes().await,
            Err(e) => Err(e),
        }
        .map_err(|e| match e {
            datafusion::object_store::Error::NotFound { .. } => self.fail(format!(
                "the covered set {url} it lists is missing: the messages of windows it recorded \
                 whose acknowledgements a kill interrupted cannot be told from late ones. \
                 Restore the set, or seek the subscription past the recorded windows"
            )),
            e => self.fail(format!("the covered set {url} cannot be read: {e}")),
        })?;
        decode_covered(&bytes)
            .map_err(|e| self.fail(format!("the covered set {url} is not one: {e}")))
    }

    /// Deletes the covered sets of these frontiers (after a marker that no longer lists them
    /// was written). A set already gone is no error.
    pub async fn delete_covered(&self, frontiers: &[i64]) -> Result<()> {
        for f in frontiers {
            match self.store.delete(&self.covered_location(*f)).await {
                Ok(()) | Err(datafusion::object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(self.fail(format!(
                        "the covered set {} cannot be deleted: {e}",
                        self.covered_url(*f)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Deletes the covered sets the marker does not list (left by a run killed between a
    /// set's write and its marker's); returns how many.
    pub async fn sweep_covered(&self, listed: &[Listed]) -> Result<usize> {
        use futures::TryStreamExt as _;
        let found: Vec<_> = self
            .store
            .list(Some(&self.covered))
            .try_collect()
            .await
            .map_err(|e| self.fail(format!("its covered sets cannot be listed: {e}")))?;
        let mut stale = Vec::new();
        for object in found {
            let frontier = object
                .location
                .filename()
                .and_then(|n| n.strip_suffix(".bin"))
                .and_then(|n| n.parse::<i64>().ok());
            if let Some(f) = frontier.filter(|f| !listed.iter().any(|(l, _)| l == f)) {
                stale.push(f);
            }
        }
        self.delete_covered(&stale).await?;
        Ok(stale.len())
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
        new.record(
            Some(42),
            Some(50),
            &[("m-1".into(), 40)],
            &[(42, None), (30, Some(1_700_000_000_000))],
        )
        .await
        .unwrap();
        // Read as a marker (starting from it would wait for the run that wrote it to go).
        let read = strict.read().await.unwrap().unwrap();
        assert_eq!(
            (read.frontier_ns, read.watermark_ns, read.clean),
            (Some(42), Some(50), false)
        );
        assert_eq!(read.late, vec![("m-1".to_string(), 40)]);
        assert_eq!(
            read.covered,
            Some(vec![(42, None), (30, Some(1_700_000_000_000))])
        );
        let raw = std::fs::read_to_string(dir.path().join("p--t--1.json")).unwrap();
        assert!(raw.contains("\"frontier_ns\":42"), "{raw}");
        assert!(raw.contains("\"late\":[[\"m-1\",40]]"), "{raw}");
        assert!(raw.contains("\"covered\":[42,[30,1700000000000]]"), "{raw}");
    }

    #[tokio::test]
    async fn a_second_run_of_a_pipeline_is_refused_while_the_first_keeps_its_marker() {
        let dir = tempfile::tempdir().unwrap();
        let first = Marker::open(&at(dir.path(), true), "p", None).unwrap();
        first.start().await.unwrap();
        first.claim(None, None, &[], &[]).await.unwrap();
        let second = Marker::open(&at(dir.path(), true), "p", None).unwrap();
        assert_ne!(first.run(), second.run());
        let starting = tokio::spawn(async move { second.start().await });
        // The first run refreshes its marker, as its keeper does while it goes.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        first.record(Some(7), Some(9), &[], &[]).await.unwrap();
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
        // Written before covered sets were kept: every message at or before 5 is covered.
        assert_eq!(progress.covered, None);
        assert_eq!(progress.run.as_deref(), Some("killed"));
        next.claim(Some(5), Some(6), &[], &[]).await.unwrap();
        next.confirm().await.unwrap();

        // Two runs that claimed it at the same moment: the one whose claim was overwritten
        // gives way, and cannot write it again.
        let other = Marker::open(&at(dir.path(), false), "p", None).unwrap();
        other.claim(Some(5), Some(6), &[], &[]).await.unwrap();
        let e = next.confirm().await.unwrap_err().to_string();
        assert!(e.contains(other.run()), "{e}");
        assert!(next.record(Some(8), None, &[], &[]).await.is_err());
        other.confirm().await.unwrap();
        other.record(Some(8), None, &[], &[]).await.unwrap();
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

    #[test]
    fn a_malformed_covered_list_is_refused_naming_the_field() {
        let base = r#"{"version":1,"pipeline":"p","frontier_ns":1,"recorded_at":"x","clean":true"#;
        for (covered, says) in [
            (r#""covered":5"#, "'covered' is not a list"),
            (
                r#""covered":["x"]"#,
                "neither a frontier nor [frontier, until]",
            ),
            (r#""covered":[[5,"x"]]"#, "not [frontier, until]"),
        ] {
            let e = Progress::from_json(format!("{base},{covered}}}").as_bytes()).unwrap_err();
            assert!(e.contains(says), "{covered}: {e}");
        }
        let ok = Progress::from_json(format!("{base},\"covered\":[5,[6,7]]}}").as_bytes()).unwrap();
        assert_eq!(ok.covered, Some(vec![(5, None), (6, Some(7))]));
    }

    #[tokio::test]
    async fn covered_sets_round_trip_and_the_marker_lists_the_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let m = Marker::open(&at(dir.path(), true), "p", None).unwrap();
        m.start().await.unwrap();
        let set: CoveredSet = vec![
            (60, vec![1, u128::MAX, 7 << 100]),
            (120, vec![]),
            (-5, vec![3]),
        ];
        m.write_covered(120, CoveredBytes::from(&set))
            .await
            .unwrap();
        assert_eq!(m.read_covered(120).await.unwrap(), set);
        let raw = std::fs::read(dir.path().join("p.covered/120.bin")).unwrap();
        assert_eq!(raw.len(), 8 + 3 * 12 + 4 * 16, "16 bytes a message");

        // A set the marker does not list (a run killed between the two writes) is swept; a
        // listed one stays.
        m.write_covered(180, CoveredBytes::from(&vec![(180, vec![9])]))
            .await
            .unwrap();
        assert_eq!(m.sweep_covered(&[(120, None)]).await.unwrap(), 1);
        assert!(m.read_covered(120).await.is_ok());
        let gone = m.read_covered(180).await.unwrap_err().to_string();
        assert!(
            gone.contains("p.covered/180.bin") && gone.contains("missing"),
            "{gone}"
        );

        m.delete_covered(&[120, 999]).await.unwrap();
        assert!(m.read_covered(120).await.is_err());

        std::fs::write(dir.path().join("p.covered/5.bin"), b"GSQLCOV1\x01\x00").unwrap();
        let broken = m.read_covered(5).await.unwrap_err().to_string();
        assert!(broken.contains("ends early"), "{broken}");
        std::fs::write(dir.path().join("p.covered/6.bin"), b"nothing").unwrap();
        let broken = m.read_covered(6).await.unwrap_err().to_string();
        assert!(broken.contains("GSQLCOV1"), "{broken}");
    }
}
