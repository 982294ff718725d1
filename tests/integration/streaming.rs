//! Streaming `INSERT`s against the real Pub/Sub emulator: an unbounded CSV source on a FIFO the
//! test feeds line by line while the statement runs, flush points heard through the session's
//! [`StatementControl`], and a graceful stop that delivers every line read.
//!
//! Run: `cargo test --test integration streaming::`.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gcp_sql::core::StopKind;
use gcp_sql::core::run::FlushPoint;
use gcp_sql::sql::StatementControl;

use crate::support::{PubSubAdmin, exec, ids};

/// A FIFO in a fresh directory, removed with it.
struct Fifo {
    dir: PathBuf,
    path: PathBuf,
}

impl Fifo {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(crate::support::unique(name));
        std::fs::create_dir_all(&dir).expect("fifo dir");
        let path = dir.join("input.csv");
        let c = CString::new(path.as_os_str().as_bytes()).expect("path");
        // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0, "mkfifo {}", path.display());
        Fifo { dir, path }
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_fed_line_by_line_flows_live_and_a_graceful_stop_delivers_every_line_once() {
    const LINES: i64 = 60;
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin.topic_with_subscription("stream", "fifo", false).await;
    let fifo = Fifo::new("fifo");

    let points: Arc<Mutex<Vec<FlushPoint>>> = Arc::default();
    let seen = points.clone();
    let control = StatementControl::new().with_observer(move |p| {
        seen.lock().unwrap().push(p.clone());
    });
    let ctx = gcp_sql::sql::new_context_with_control(&control);
    // An unbounded CSV source emits a batch once it has `batch_size` rows: a trickle needs a
    // small one, set before the table is declared (docs/streaming.md).
    exec(&ctx, "SET datafusion.execution.batch_size = 1").await;
    exec(
        &ctx,
        &format!(
            "CREATE UNBOUNDED EXTERNAL TABLE lines (id BIGINT, name VARCHAR) STORED AS CSV \
             LOCATION '{}' OPTIONS ('format.has_header' 'false')",
            fifo.path().display()
        ),
    )
    .await;
    exec(
        &ctx,
        &format!(
            "CREATE TABLE live (id BIGINT, name VARCHAR) WITH (connector = 'pubsub', \
             emulator_host = '{}', topic = '{topic}', batch_delay_threshold = '10ms', \
             flush_interval = '500ms')",
            admin.host
        ),
    )
    .await;
    let insert = tokio::spawn({
        let ctx = ctx.clone();
        async move { gcp_sql::sql::run(&ctx, "INSERT INTO live SELECT id, name FROM lines").await }
    });

    // The writer side of the FIFO, fed from a thread: its open blocks until the reader opens.
    let path = fifo.path().to_path_buf();
    let (fed_tx, mut fed_rx) = tokio::sync::mpsc::unbounded_channel::<i64>();
    let (go_on_tx, go_on_rx) = std::sync::mpsc::channel::<()>();
    let feeder = std::thread::spawn(move || {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open the fifo for writing");
        for id in 1..=LINES {
            writeln!(file, "{id},name-{id}").expect("write a line");
            file.flush().expect("flush the line");
            let _ = fed_tx.send(id);
            if id == LINES / 2 {
                // Wait until the test has read back the first half while the input is open.
                let _ = go_on_rx.recv();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The FIFO stays open until the test has stopped the statement.
        file
    });

    // Half the lines written, the input still open: they are readable from the topic.
    let mut fed = 0;
    while fed < LINES / 2 {
        tokio::select! {
            id = fed_rx.recv() => fed = id.expect("the feeder runs"),
            _ = tokio::time::sleep(Duration::from_secs(30)) => {
                if insert.is_finished() {
                    panic!("the INSERT ended early: {:?}", insert.await);
                }
                panic!("the feeder is stuck at line {fed}");
            }
        }
    }
    let first = admin.pull_all(&subscription, (LINES / 2) as usize).await;
    assert_eq!(
        ids(&first, "id").into_iter().collect::<BTreeSet<_>>(),
        (1..=LINES / 2).collect::<BTreeSet<_>>()
    );
    assert!(!insert.is_finished(), "the INSERT is still running");
    go_on_tx.send(()).expect("the feeder waits");
    while fed < LINES {
        fed = fed_rx.recv().await.expect("the feeder runs");
    }
    // Flush points after the last line: everything read is resolved, over the writers.
    let wait_for_point = async {
        loop {
            if rows_at_last_points(&points.lock().unwrap()) == LINES as u64 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait_for_point)
        .await
        .expect("a flush point covers every line");

    control.stop(StopKind::Drain, "stop requested by the test");
    let batches = tokio::time::timeout(Duration::from_secs(60), insert)
        .await
        .expect("the stop ends the statement")
        .expect("joined")
        .expect("a drained stop succeeds");
    let count = arrow::util::pretty::pretty_format_batches(&batches)
        .expect("format")
        .to_string();
    assert!(count.contains(&format!("| {LINES} ")), "{count}");
    assert_eq!(control.stopped(), Some(StopKind::Drain));
    drop(feeder.join().expect("the feeder ends"));

    // Every line exactly once, over both reads.
    let rest = admin
        .pull_all(&subscription, (LINES - LINES / 2) as usize)
        .await;
    let mut all = ids(&first, "id");
    all.extend(ids(&rest, "id"));
    all.sort_unstable();
    assert_eq!(all, (1..=LINES).collect::<Vec<_>>());

    // Each writer's flush points, in order, the k-th made no earlier than k intervals after the
    // writer started; at each, nothing it had read is unresolved.
    let points = points.lock().unwrap();
    let writers = points.first().map_or(0, |p| p.writers);
    assert!(writers >= 1);
    for writer in 0..writers {
        let own: Vec<&FlushPoint> = points.iter().filter(|p| p.writer == writer).collect();
        assert!(own.len() >= 2, "writer {writer}: {own:?}");
        for pair in own.windows(2) {
            assert_eq!(pair[1].sequence, pair[0].sequence + 1);
            assert!(pair[1].elapsed > pair[0].elapsed, "{pair:?}");
            assert!(pair[1].rows_read >= pair[0].rows_read);
        }
        for p in &own {
            let k = u32::try_from(p.sequence).expect("a few points");
            assert!(p.elapsed >= Duration::from_millis(500) * k, "{p:?}");
        }
    }
    for p in points.iter() {
        assert_eq!(p.counts.in_flight, 0);
        assert_eq!(p.counts.acknowledged, p.rows_read);
    }
}

/// The rows read as of each writer's latest flush point, added up.
fn rows_at_last_points(points: &[FlushPoint]) -> u64 {
    let mut last: std::collections::BTreeMap<usize, u64> = std::collections::BTreeMap::new();
    for p in points {
        last.insert(p.writer, p.rows_read);
    }
    last.values().sum()
}

/// An endless source: a batch of 5 rows every 50 ms, `id` from 1; row `id` names topic
/// `topics[id % topics.len()]` for its first `spread` rows, then `topics[0]` only.
#[derive(Debug)]
struct Spread {
    schema: arrow::datatypes::SchemaRef,
    topics: Vec<String>,
    spread: i64,
}

impl datafusion::physical_plan::streaming::PartitionStream for Spread {
    fn schema(&self) -> &arrow::datatypes::SchemaRef {
        &self.schema
    }

    fn execute(
        &self,
        _ctx: Arc<datafusion::execution::TaskContext>,
    ) -> datafusion::execution::SendableRecordBatchStream {
        let schema = self.schema.clone();
        let topics = self.topics.clone();
        let spread = self.spread;
        let stream = futures::stream::unfold(1i64, move |next| {
            let schema = schema.clone();
            let topics = topics.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let ids: Vec<i64> = (next..next + 5).collect();
                let dests: Vec<String> = ids
                    .iter()
                    .map(|id| {
                        if *id <= spread {
                            topics[(*id as usize) % topics.len()].clone()
                        } else {
                            topics[0].clone()
                        }
                    })
                    .collect();
                let batch = arrow::array::RecordBatch::try_new(
                    schema,
                    vec![
                        Arc::new(arrow::array::Int64Array::from(ids)),
                        Arc::new(arrow::array::StringArray::from(dests)),
                    ],
                )
                .map_err(datafusion::error::DataFusionError::from);
                Some((batch, next + 5))
            }
        });
        Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                self.schema.clone(),
                stream,
            ),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_row_topic_over_many_topics_releases_the_idle_ones_at_flush_points_while_running() {
    use arrow::datatypes::{DataType, Field, Schema};
    use gcp_sql::core::metrics::names;

    const TOPICS: usize = 12;
    let admin = PubSubAdmin::connect().await;
    let mut topics = Vec::new();
    for n in 0..TOPICS {
        let topic = format!(
            "projects/evict/topics/{}",
            crate::support::unique(&format!("t{n}"))
        );
        admin.create_topic(&topic).await;
        topics.push(topic);
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("dest", DataType::Utf8, false),
    ]));
    let control = StatementControl::new();
    let ctx = gcp_sql::sql::new_context_with_control(&control);
    ctx.register_table(
        "spread",
        Arc::new(
            datafusion::catalog::streaming::StreamingTable::try_new(
                schema.clone(),
                vec![Arc::new(Spread {
                    schema,
                    topics: topics.clone(),
                    // Every topic gets rows for about the first second, then only the first.
                    spread: 100,
                })],
            )
            .expect("a streaming table")
            .with_infinite_table(true),
        ),
    )
    .expect("register the source");
    exec(
        &ctx,
        &format!(
            "CREATE TABLE routed (id BIGINT, dest VARCHAR) WITH (connector = 'pubsub', \
             emulator_host = '{}', topic_column = 'dest', batch_delay_threshold = '10ms', \
             flush_interval = '200ms', destination_idle_timeout = '500ms', sink_parallelism = '1')",
            admin.host
        ),
    )
    .await;
    let plan = gcp_sql::sql::statement_to_dataframe(
        &ctx,
        "INSERT INTO routed SELECT id, dest FROM spread",
    )
    .await
    .expect("plan")
    .create_physical_plan()
    .await
    .expect("physical plan");
    let running = tokio::spawn(datafusion::physical_plan::collect(
        plan.clone(),
        ctx.task_ctx(),
    ));
    let metric = |name: &str| -> usize {
        let mut pending = vec![plan.clone()];
        let mut total = 0;
        while let Some(node) = pending.pop() {
            if let Some(v) = node.metrics().and_then(|m| m.sum_by_name(name)) {
                total += v.as_usize();
            }
            pending.extend(node.children().into_iter().cloned());
        }
        total
    };
    // The topics that went quiet are released at the flush points, the statement still
    // running; the one that keeps getting rows stays.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while metric(names::DESTINATIONS_RELEASED) < TOPICS - 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "released {} of {} idle topics",
            metric(names::DESTINATIONS_RELEASED),
            TOPICS - 1
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!running.is_finished(), "the statement keeps running");
    assert!(metric(names::FLUSH_POINTS) >= 2);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        metric(names::DESTINATIONS_RELEASED),
        TOPICS - 1,
        "the busy topic is never idle"
    );
    control.stop(StopKind::Drain, "done");
    running
        .await
        .expect("joined")
        .expect("a drained stop succeeds");
}
