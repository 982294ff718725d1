//! Windows over a subscription (ADR 0068) against the Pub/Sub and Bigtable emulators: counts
//! and sums per key per window land in Bigtable equal to a recomputation of the same input,
//! late rows follow the failure policy, the progress marker records the frontier, and what the
//! statement acknowledged is checked with an independent pull.

use std::collections::BTreeMap;
use std::time::Duration;

use gcloud_sdk::google::pubsub::v1::PubsubMessage;

use crate::pubsub_source::Fixture;
use crate::support::bigtable::Bigtable;

/// 2025-12-01T00:00:00Z in seconds.
const T0: i64 = 1_764_547_200;

fn event(user: &str, seconds: i64, v: i64) -> PubsubMessage {
    let ts = chrono::DateTime::from_timestamp(T0 + seconds, 0)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    PubsubMessage {
        data: serde_json::json!({ "user": user, "ts": ts, "v": v })
            .to_string()
            .into(),
        ..Default::default()
    }
}

/// The minute (as `HH:MM`) a time `seconds` after T0 falls in.
fn minute(seconds: i64) -> String {
    let start = chrono::DateTime::from_timestamp(T0 + seconds - seconds.rem_euclid(60), 0).unwrap();
    start.format("%H:%M").to_string()
}

fn source_sql(f: &Fixture, progress: &std::path::Path, extra: &[(&str, &str)]) -> String {
    let folder = progress.display().to_string();
    let mut options = vec![
        ("format", "json"),
        ("event_time_field", "ts"),
        ("allowed_lateness", "20s"),
        ("progress_path", folder.as_str()),
    ];
    options.extend_from_slice(extra);
    f.source_sql("clicks", "user VARCHAR, ts TIMESTAMP, v BIGINT", &options)
}

/// The Bigtable table `counts` of the per-minute counts ([`COUNTS_INSERT`]) on `table`.
fn counts_sql(bt: &Bigtable, table: &str) -> String {
    bt.create_sql(
        "counts",
        "k VARCHAR, views VARCHAR, total VARCHAR",
        table,
        &[("row_key", "k"), ("column_family", "c")],
    )
}

/// Counts and sums per user and minute of `clicks` into `counts`, keyed `user#HH:MM`.
const COUNTS_INSERT: &str = "INSERT INTO counts
    SELECT user || '#' || to_char(minute, '%H:%M'), CAST(n AS VARCHAR), CAST(s AS VARCHAR)
    FROM (SELECT user, date_bin(INTERVAL '1 minute', ts) AS minute, count(*) AS n, sum(v) AS s
          FROM clicks GROUP BY user, date_bin(INTERVAL '1 minute', ts))";

/// Every dead letter stored under `dead`.
fn letters(dead: &std::path::Path) -> Vec<serde_json::Value> {
    let mut letters = Vec::new();
    for entry in std::fs::read_dir(dead).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        letters.extend(
            text.lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()),
        );
    }
    letters
}

/// Reads the Bigtable table back as row key → (count, sum).
async fn landed(bt: &Bigtable, table: &str) -> BTreeMap<String, (String, String)> {
    let rows = bt.read(table).await;
    rows.iter()
        .map(|(key, cells)| {
            let cell = |q: &str| {
                let c = cells
                    .iter()
                    .find(|c| c.qualifier == q.as_bytes())
                    .unwrap_or_else(|| panic!("cell {q} of {}", String::from_utf8_lossy(key)));
                String::from_utf8(c.value.clone()).unwrap()
            };
            (
                String::from_utf8(key.to_vec()).unwrap(),
                (cell("views"), cell("total")),
            )
        })
        .collect()
}

/// One-minute tumbling counts and sums per user, into Bigtable: the result equals a
/// recomputation of the same input (out-of-order rows within the lateness included), every
/// message of an emitted window is acknowledged, the message of the window still open when
/// the statement stops comes back, and the marker records the frontier. A second run then
/// meets rows published for windows already emitted: under `dead_letter` they are stored with
/// the reason `late` and acknowledged, and Bigtable is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbling_counts_per_key_equal_a_recomputation_and_late_rows_are_dead_lettered() {
    let f = Fixture::new("win").await;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("win");
    bt.create_table(&table, &["c"]).await;
    let progress = tempfile::tempdir().unwrap();
    let dead = tempfile::tempdir().unwrap();

    // Six minutes of events for three users, every seventh one 15 s out of order (within the
    // 20 s lateness), then one event at minute 20 that closes every earlier window.
    let mut messages = Vec::new();
    let mut expected: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for i in 0..360i64 {
        let user = ["ann", "bob", "cy"][(i % 3) as usize];
        let at = if i % 7 == 0 && i > 20 { i - 15 } else { i };
        messages.push(event(user, at, i));
        let e = expected
            .entry(format!("{user}#{}", minute(at)))
            .or_default();
        e.0 += 1;
        e.1 += i;
    }
    let closing = event("zed", 20 * 60, 0);
    messages.push(closing);
    // Published after the closing event: rows for minutes already emitted (late).
    messages.push(event("ann", 30, 1000));
    messages.push(event("bob", 125, 1000));
    let ids = f.publish(messages).await;
    let closing_id = ids[ids.len() - 3].clone();

    let sink = counts_sql(&bt, &table);
    let insert = COUNTS_INSERT;
    let dead_url = format!("file://{}", dead.path().display());
    let policy = [
        ("failure_policy", "dead_letter"),
        ("dead_letter_path", dead_url.as_str()),
    ];
    let mut first_options = vec![("progress_start", "new")];
    first_options.extend(policy);
    let source = source_sql(&f, progress.path(), &first_options);
    let explaining = crate::pubsub_source::sql_context(50);
    gcp_sql::sql::run(&explaining, &format!("{source}; {sink}"))
        .await
        .expect("the tables");
    let explain = crate::support::explain(&explaining, insert).await;
    assert!(
        explain.contains("WindowAggregateExec: window=date_bin(60s")
            && explain.contains("event_time=ts")
            && explain.contains("watermark=min over 1 stream(s) of subscription"),
        "{explain}"
    );
    // Batches of 50 messages: a batch's rows fall in different windows, and each message is
    // acknowledged as its own window is recorded.
    let ctx = crate::pubsub_source::sql_context(50);
    let out = gcp_sql::sql::run(&ctx, &format!("{source}; {sink}; {insert}"))
        .await
        .expect("the windowed INSERT");
    let count = out[0]
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::UInt64Array>()
        .unwrap()
        .value(0);
    let want: BTreeMap<String, (String, String)> = expected
        .iter()
        .map(|(k, (n, s))| (k.clone(), (n.to_string(), s.to_string())))
        .collect();
    assert_eq!(count, want.len() as u64, "one row per user and minute");
    assert_eq!(
        landed(&bt, &table).await,
        want,
        "equal to the recomputation"
    );

    // The two late rows were dead-lettered with their reason.
    let letters = letters(dead.path());
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert!(
        letters
            .iter()
            .all(|l| l.to_string().contains("late") && l.to_string().contains("1000")),
        "{letters:?}"
    );

    // Everything but the open window's message was acknowledged; that one was handed back
    // (the emulator re-offers a message nacked on an open stream after a lease).
    let left = f.pull_until_back(&[&closing_id]).await;
    assert_eq!(
        left,
        vec![closing_id],
        "only the open window's message is back"
    );

    // The marker says how far windows were delivered: the close point of the last round.
    let markers: Vec<_> = std::fs::read_dir(progress.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(markers.len(), 1, "{markers:?}");
    let marker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&markers[0]).unwrap()).unwrap();
    let frontier = marker["frontier_ns"].as_i64().unwrap();
    assert_eq!(frontier, (T0 + 20 * 60 - 20) * 1_000_000_000, "{marker}");

    // A second run (the marker exists; no progress_start), as after a kill that interrupted
    // acknowledgements of recorded windows. It meets `ann`@61 and `cy`@300, stood in for by
    // new messages that a covered set beside the marker names (as the first run would have
    // stored them, in the format ADR 0068 gives), and `bob`@180, a row of a recorded window
    // that no set names. The two are acknowledged without being counted; the third is late,
    // not taken for a redelivery: dead-lettered. Bigtable is unchanged. The run reads a new
    // subscription of the topic, with the marker renamed for it: on the emulator, messages
    // published after a windowed run can reach the next stream of the same subscription 10 s
    // and more late (docs/service_facts.md).
    let g = f.subscribe_again("again").await;
    let old_id = f.subscription.rsplit('/').next().unwrap();
    let new_id = g.subscription.rsplit('/').next().unwrap();
    let marker_path = markers[0].with_file_name(
        markers[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(old_id, new_id),
    );
    std::fs::remove_file(&markers[0]).unwrap();
    let mut marker = marker;
    marker["pipeline"] =
        serde_json::json!(marker["pipeline"].as_str().unwrap().replace(old_id, new_id));
    let again = f
        .publish(vec![
            event("ann", 61, 5),
            event("cy", 300, 5),
            event("bob", 180, 6),
        ])
        .await;
    let end_ns = |s: i64| (T0 + s - s.rem_euclid(60) + 60) * 1_000_000_000;
    let mut set = b"GSQLCOV1".to_vec();
    for (id, at) in [(&again[0], 61), (&again[1], 300)] {
        set.extend_from_slice(&end_ns(at).to_le_bytes());
        set.extend_from_slice(&1u32.to_le_bytes());
        set.extend_from_slice(&gcp_sql::sql::window::seen::fingerprint(id).to_le_bytes());
    }
    let sets = marker_path.with_extension("covered");
    std::fs::create_dir_all(&sets).unwrap();
    std::fs::write(sets.join(format!("{frontier}.bin")), set).unwrap();
    marker["covered"] = serde_json::json!([frontier]);
    std::fs::write(&marker_path, marker.to_string()).unwrap();
    let dead_again = tempfile::tempdir().unwrap();
    let dead_again_url = format!("file://{}", dead_again.path().display());
    let ctx = crate::pubsub_source::sql_context(50);
    gcp_sql::sql::run(
        &ctx,
        &format!(
            "{}; {sink}; {insert}",
            source_sql(
                &g,
                progress.path(),
                &[
                    ("failure_policy", "dead_letter"),
                    ("dead_letter_path", dead_again_url.as_str()),
                ]
            )
        ),
    )
    .await
    .expect("the second run");
    assert_eq!(
        landed(&bt, &table).await,
        want,
        "covered and late rows changed nothing"
    );
    let late_again = self::letters(dead_again.path());
    assert_eq!(late_again.len(), 1, "{late_again:?}");
    assert!(
        late_again[0]["error_class"] == "late"
            && late_again[0]["row"]["user"] == "bob"
            && late_again[0]["row"]["v"] == 6,
        "only the row no covered set names is late: {late_again:?}"
    );
    assert!(
        g.left_over_after_deadline().await.is_empty(),
        "the covered rows and the late one were acknowledged"
    );
}

/// A message the marker names as late (an earlier run found it late and was killed before its
/// letter was stored or its message acknowledged) is late in the next run too, although its
/// window is open there: dead-lettered, not counted (ADR 0068, "A late row interrupted by a
/// kill"). The killed run is simulated by editing the marker a graceful run left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_marker_names_as_late_is_late_in_the_next_run_wherever_its_window_is() {
    let f = Fixture::new("win-late-id").await;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("win-late-id");
    bt.create_table(&table, &["c"]).await;
    let progress = tempfile::tempdir().unwrap();
    let dead = tempfile::tempdir().unwrap();
    let sink = counts_sql(&bt, &table);
    // `zed`'s events only move the watermark: filtered out after the source saw their event
    // time, they are acknowledged, so neither run hands a message back. The emulator offers a
    // message handed back at the end of a run again only in its own time (up to a lease plus
    // a minute, docs/service_facts.md): the second run would meet it at an unknown point, in
    // its window or late.
    let insert = COUNTS_INSERT.replace(
        "FROM clicks GROUP BY",
        "FROM clicks WHERE user <> 'zed' GROUP BY",
    );
    let dead_url = format!("file://{}", dead.path().display());
    let policy = [
        ("failure_policy", "dead_letter"),
        ("dead_letter_path", dead_url.as_str()),
    ];

    // A first run, which ends gracefully: windows of minutes 0 and 1, closed by minute 10.
    f.publish(vec![
        event("ann", 5, 1),
        event("ann", 65, 2),
        event("zed", 10 * 60, 0),
    ])
    .await;
    let mut first = vec![("progress_start", "new")];
    first.extend(policy);
    gcp_sql::sql::run(
        &crate::pubsub_source::sql_context(50),
        &format!(
            "{}; {sink}; {insert}",
            source_sql(&f, progress.path(), &first)
        ),
    )
    .await
    .expect("the first run");
    let marker_path = std::fs::read_dir(progress.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .expect("the marker");
    let mut marker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&marker_path).unwrap()).unwrap();
    assert_eq!(marker["late"], serde_json::json!([]), "{marker}");

    // The second run reads a new subscription of the same topic, its marker the first run's
    // under the new subscription's name: on the emulator, messages published after a windowed
    // run reached the next stream of the same subscription 10 to 20 s late on a quiet machine
    // and not within a 65 s hold under CI's load (docs/service_facts.md), while a subscription
    // no stream has read delivers at once.
    let g = f.subscribe_again("after").await;
    let old_id = f.subscription.rsplit('/').next().unwrap();
    let new_id = g.subscription.rsplit('/').next().unwrap();
    let old_marker = marker_path.clone();
    let marker_path = old_marker.with_file_name(
        old_marker
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(old_id, new_id),
    );
    let pipeline = marker["pipeline"].as_str().unwrap().replace(old_id, new_id);
    marker["pipeline"] = serde_json::json!(pipeline);
    std::fs::remove_file(&old_marker).unwrap();
    // The covered sets the marker lists go with it.
    let old_sets = old_marker.with_extension("covered");
    if old_sets.exists() {
        std::fs::rename(&old_sets, marker_path.with_extension("covered")).unwrap();
    }

    // Minute 25: `x` (v 7) and `y` (v 8), then minute 40 to close it.
    let ids = f
        .publish(vec![
            event("ann", 25 * 60 + 1, 7),
            event("ann", 25 * 60 + 2, 8),
            event("zed", 40 * 60, 0),
        ])
        .await;
    // As a run killed just after it found `x` late would have left the marker.
    let release_ns = (T0 + 26 * 60) * 1_000_000_000;
    marker["late"] = serde_json::json!([[ids[0], release_ns]]);
    marker["clean"] = serde_json::json!(false);
    marker["run"] = serde_json::json!("killed");
    marker["recorded_at"] = serde_json::json!(
        (chrono::Utc::now() - chrono::Duration::seconds(60))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
    std::fs::write(&marker_path, marker.to_string()).unwrap();

    gcp_sql::sql::run(
        &crate::pubsub_source::sql_context(50),
        &format!(
            "{}; {sink}; {insert}",
            source_sql(&g, progress.path(), &policy)
        ),
    )
    .await
    .expect("the run after the simulated kill");

    let landed = landed(&bt, &table).await;
    assert_eq!(
        landed.get("ann#00:25"),
        Some(&("1".to_string(), "8".to_string())),
        "x is not counted: {landed:?}"
    );
    let letters = letters(dead.path());
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = letters[0].to_string();
    assert!(
        letter.contains("an earlier run found it late") && letters[0]["row"]["v"] == 7,
        "{letter}"
    );
    let marker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&marker_path).unwrap()).unwrap();
    assert_eq!(
        (&marker["late"], &marker["clean"]),
        (&serde_json::json!([]), &serde_json::json!(true)),
        "{marker}"
    );
    assert!(
        g.left_over_after_deadline().await.is_empty(),
        "x was acknowledged once its letter was stored, y once its window landed, zed's as filtered"
    );
}

/// Extra source options, the INSERT, and what its refusal must say.
type Refusal = (
    Vec<(&'static str, &'static str)>,
    &'static str,
    &'static [&'static str],
);

/// Each refusal names what to write instead, before anything is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_that_cannot_be_exact_are_refused_at_planning_with_what_to_write() {
    let f = Fixture::new("win-refuse").await;
    let progress = tempfile::tempdir().unwrap();
    let sink = format!(
        "CREATE EXTERNAL TABLE out (k VARCHAR, n BIGINT) STORED AS PUBSUB LOCATION '{}' \
         OPTIONS ('emulator_host' '{}', 'format' 'json')",
        f.topic, f.host
    );
    let cases: Vec<Refusal> = vec![
        (
            vec![],
            "INSERT INTO out SELECT user, count(*) FROM clicks GROUP BY user",
            &["without a window", "date_bin(INTERVAL '1 minute'"],
        ),
        (
            vec![],
            "INSERT INTO out SELECT user, count(*) FROM clicks \
             GROUP BY user, date_bin(INTERVAL '1 minute', other)",
            &["over 'other'", "event time of subscription", "is 'ts'"],
        ),
        (
            vec![],
            "INSERT INTO out SELECT user, count(*) FROM clicks \
             GROUP BY user, hop(INTERVAL '2 minutes', INTERVAL '5 minutes')",
            &["whole multiple of its slide"],
        ),
        (
            vec![("max_lease_duration", "1m")],
            "INSERT INTO out SELECT user, count(*) FROM clicks \
             GROUP BY user, date_bin(INTERVAL '1 minute', ts)",
            &["max_lease_duration", "raise max_lease_duration"],
        ),
    ];
    for (extra, insert, needles) in cases {
        let ctx = crate::pubsub_source::sql_context(50);
        let folder = progress.path().display().to_string();
        let mut options = vec![
            ("format", "json"),
            ("event_time_field", "ts"),
            ("allowed_lateness", "5s"),
            ("progress_path", folder.as_str()),
        ];
        options.extend(extra);
        let source = f.source_sql(
            "clicks",
            "user VARCHAR, ts TIMESTAMP, other TIMESTAMP",
            &options,
        );
        let err = gcp_sql::sql::run(&ctx, &format!("{source}; {sink}; {insert}"))
            .await
            .expect_err(insert)
            .to_string();
        for needle in needles {
            assert!(
                err.contains(needle),
                "{insert}: wanted '{needle}' in: {err}"
            );
        }
    }
    // No progress_path: refused, naming the option.
    let ctx = crate::pubsub_source::sql_context(50);
    let source = f.source_sql(
        "clicks",
        "user VARCHAR, ts TIMESTAMP",
        &[("format", "json"), ("event_time_field", "ts")],
    );
    let err = gcp_sql::sql::run(
        &ctx,
        &format!(
            "{source}; {sink}; INSERT INTO out SELECT user, count(*) FROM clicks \
             GROUP BY user, tumble(INTERVAL '1 minute')"
        ),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("progress_path") && err.contains("progress_start = 'new'"),
        "{err}"
    );
    // A missing marker without progress_start = 'new' fails before a message is read.
    let ids = f.publish(vec![event("ann", 1, 1)]).await;
    let ctx = crate::pubsub_source::sql_context(50);
    let folder = progress.path().display().to_string();
    let source = f.source_sql(
        "clicks",
        "user VARCHAR, ts TIMESTAMP",
        &[
            ("format", "json"),
            ("event_time_field", "ts"),
            ("progress_path", folder.as_str()),
        ],
    );
    let err = gcp_sql::sql::run(
        &ctx,
        &format!(
            "{source}; {sink}; INSERT INTO out SELECT user, count(*) FROM clicks \
             GROUP BY user, tumble(INTERVAL '1 minute')"
        ),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("progress marker file://") && err.contains("does not exist"),
        "{err}"
    );
    let back: Vec<String> = f
        .left_over_after_deadline()
        .await
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    assert_eq!(back, ids, "nothing was taken");
}

/// The source of the two-stream tests: two streams, flow control of 20 messages each, a new
/// progress marker in `progress`.
fn two_streams_source(f: &Fixture, progress: &std::path::Path) -> String {
    let folder = progress.display().to_string();
    f.source_sql(
        "clicks",
        "user VARCHAR, ts TIMESTAMP, v BIGINT",
        &[
            ("format", "json"),
            ("event_time_field", "ts"),
            ("progress_path", folder.as_str()),
            ("progress_start", "new"),
            ("parallel_pull_count", "2"),
            ("max_outstanding_messages", "20"),
            // A stream that got no message for this long stops holding the watermark back
            // (well before stop_after_idle ends the statement).
            ("idle_timeout", "500ms"),
        ],
    )
}

/// Arroyo's `hop(slide, width)` and `tumble(width)`, the event time implied, over two streams
/// whose flow control (20 messages each) is far below what the open windows hold: five-minute
/// windows every minute and one-minute windows per user land in Bigtable with the window's end
/// as the cell version (a rewrite after a kill overwrites), equal to a recomputation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hopping_and_tumbling_windows_over_two_streams_are_not_stalled_by_flow_control() {
    let f = Fixture::new("win-hop").await;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("win-hop");
    bt.create_table(&table, &["c"]).await;
    let progress = tempfile::tempdir().unwrap();
    let mut messages = Vec::new();
    let mut hops: BTreeMap<(String, i64), i64> = BTreeMap::new();
    let mut minutes: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for i in 0..400i64 {
        let user = ["ann", "bob"][(i % 2) as usize];
        let at = i * 3 / 2; // ten minutes
        messages.push(event(user, at, i));
        let last = at - at.rem_euclid(60);
        for k in 0..5 {
            *hops.entry((user.to_string(), last - k * 60)).or_default() += 1;
        }
        *minutes.entry((user.to_string(), last)).or_default() += 1;
    }
    messages.push(event("zed", 30 * 60, 0));
    f.publish(messages).await;
    let source = two_streams_source(&f, progress.path());
    let sink = bt.create_sql(
        "hops",
        "k VARCHAR, version TIMESTAMP, n VARCHAR",
        &table,
        &[
            ("row_key", "k"),
            ("column_family", "c"),
            ("timestamp_column", "version"),
        ],
    );
    let insert = "INSERT INTO hops
        SELECT kind || user || '#' || to_char(w['start'], '%H:%M'), w['end'], CAST(n AS VARCHAR)
        FROM (SELECT 'hop:' AS kind, user, hop(INTERVAL '1 minute', INTERVAL '5 minutes') AS w,
                     count(*) AS n
              FROM clicks GROUP BY user, hop(INTERVAL '1 minute', INTERVAL '5 minutes'))
        WHERE user <> 'zed'";
    let ctx = crate::pubsub_source::sql_context(1);
    gcp_sql::sql::run(&ctx, &format!("{source}; {sink}; {insert}"))
        .await
        .expect("the hopping INSERT");
    let rows = bt.read(&table).await;
    let label = |prefix: &str, user: &str, start: i64| {
        let t = chrono::DateTime::from_timestamp(T0 + start, 0).unwrap();
        format!("{prefix}{user}#{}", t.format("%H:%M"))
    };
    let keys: Vec<String> = rows
        .keys()
        .map(|k| String::from_utf8_lossy(k).to_string())
        .collect();
    let left: Vec<String> = f
        .pull_now()
        .await
        .into_iter()
        .map(|m| String::from_utf8_lossy(&m.data).to_string())
        .collect();
    let marker = std::fs::read_dir(progress.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(
        rows.len(),
        hops.len(),
        "one row per user and hop window: {keys:?} {marker:?} {left:?}"
    );
    for ((user, start), n) in &hops {
        let key = label("hop:", user, *start);
        let cell = &rows[key.as_bytes()][0];
        assert_eq!(cell.value, n.to_string().as_bytes(), "{key}");
        assert_eq!(
            cell.timestamp,
            (T0 + start + 300) * 1_000_000,
            "{key}: the version is the window's end"
        );
    }

    // One-minute tumbling windows of the same events on another subscription, into the same
    // table.
    let table_rows_before = rows.len();
    let f = Fixture::new("win-tumble").await;
    let mut again = Vec::new();
    for i in 0..400i64 {
        again.push(event(["ann", "bob"][(i % 2) as usize], i * 3 / 2, i));
    }
    again.push(event("zed", 30 * 60, 0));
    f.publish(again).await;
    let progress = tempfile::tempdir().unwrap();
    let source = two_streams_source(&f, progress.path());
    let insert = "INSERT INTO hops
        SELECT 'min:' || user || '#' || to_char(w['start'], '%H:%M'), w['end'], CAST(count(*) AS VARCHAR)
        FROM (SELECT user, tumble(INTERVAL '1 minute') AS w FROM clicks WHERE user <> 'zed')
        GROUP BY user, w";
    let ctx = crate::pubsub_source::sql_context(1);
    let refused = gcp_sql::sql::run(&ctx, &format!("{source}; {sink}; {insert}")).await;
    // tumble() outside the aggregate has no event time to imply: said so, nothing read.
    let err = refused.expect_err("tumble() in a projection").to_string();
    assert!(err.contains("without a window"), "{err}");
    let insert = "INSERT INTO hops
        SELECT 'min:' || user || '#' || to_char(w['start'], '%H:%M'), w['end'], CAST(n AS VARCHAR)
        FROM (SELECT user, tumble(INTERVAL '1 minute') AS w, count(*) AS n
              FROM clicks WHERE user <> 'zed' GROUP BY user, tumble(INTERVAL '1 minute'))";
    let ctx = crate::pubsub_source::sql_context(1);
    gcp_sql::sql::run(&ctx, &format!("{source}; {sink}"))
        .await
        .expect("tables");
    gcp_sql::sql::run(&ctx, insert)
        .await
        .expect("the tumbling INSERT");
    let rows = bt.read(&table).await;
    let markers = std::fs::read_dir(progress.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(rows.len(), table_rows_before + minutes.len(), "{markers:?}");
    for ((user, start), n) in &minutes {
        let key = label("min:", user, *start);
        let cell = &rows[key.as_bytes()][0];
        assert_eq!(cell.value, n.to_string().as_bytes(), "{key}");
        assert_eq!(cell.timestamp, (T0 + start + 60) * 1_000_000, "{key}");
    }
}

/// The windowed pipeline run by the `gcp-sql` binary and killed with SIGKILL twice: once while
/// its windows were emitted but Bigtable (behind a proxy) did not answer, once the moment the
/// progress marker first recorded a frontier (its acknowledgements in flight). Then it runs to
/// its end, again as an operator would, until the killed runs' messages came back: Bigtable
/// holds exactly the counts and sums of a recomputation of the input, no window missing, extra
/// or partial.
///
/// It does not pass on the emulator. Without the hold after an unclean stop it showed the gap
/// ADR 0068 names ("disorder after a restart"): a window emitted from 4 of its 10 rows. With the
/// hold, the watermark the marker records, and the clocks gated until the marker records it,
/// every window now closes (30 of 30 in one final pass, where the closing message used to be
/// acknowledged before its watermark was recorded), but the emulator hands a killed reader's
/// messages back in blocks of 100 every 15-60 s, longer than the hold (twice the ack deadline
/// plus 5 s), so one window may still be emitted from part of its rows (6 of 10 in the last
/// run). The service redelivers within the ack deadline; a subscription server that does so
/// is issue 36's. It runs for about four minutes on the emulator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the emulator redelivers a killed reader's messages later than the hold after an unclean stop (ADR 0068); about four minutes"]
async fn a_windowed_pipeline_killed_with_sigkill_twice_ends_with_exact_windows() {
    let f = Fixture::new("win-kill").await;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("win-kill");
    bt.create_table(&table, &["c"]).await;
    let proxy = crate::support::proxy::Proxy::start(&bt.host).await;
    let progress = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();

    // Ten minutes of events, 30 a minute for three users, and one at minute 30 that closes them.
    let mut messages = Vec::new();
    let mut expected: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut sums: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for i in 0..300i64 {
        let user = ["ann", "bob", "cy"][(i % 3) as usize];
        let at = i * 2;
        messages.push(event(user, at, i));
        let e = sums.entry(format!("{user}#{}", minute(at))).or_default();
        e.0 += 1;
        e.1 += i;
    }
    for (k, (n, s)) in sums {
        expected.insert(k, (n.to_string(), s.to_string()));
    }
    messages.push(event("zed", 30 * 60, 0));
    f.publish(messages).await;

    let script = |idle: &str| {
        let source = source_sql(
            &f,
            progress.path(),
            &[
                ("progress_start", "new"),
                ("max_outstanding_messages", "20"),
            ],
        )
        .replace("stop_after_idle = '2s'", idle);
        format!(
            "{source};
             CREATE TABLE counts (k VARCHAR, views VARCHAR, total VARCHAR, version TIMESTAMP)
               WITH (connector = 'bigtable', table = '{table}', emulator_host = '{}',
                     row_key = 'k', column_family = 'c', timestamp_column = 'version');
             INSERT INTO counts
             SELECT user || '#' || to_char(minute, '%H:%M'), CAST(n AS VARCHAR), CAST(s AS VARCHAR),
                    minute + INTERVAL '1 minute'
             FROM (SELECT user, date_bin(INTERVAL '1 minute', ts) AS minute, count(*) AS n,
                          sum(v) AS s
                   FROM clicks WHERE user <> 'zed'
                   GROUP BY user, date_bin(INTERVAL '1 minute', ts));\n",
            proxy.host()
        )
    };
    let running = home.path().join("running.sql");
    let last = home.path().join("last.sql");
    std::fs::write(&running, script("stop_after_idle = '600s'")).unwrap();
    // Well past the ack deadline: the emulator re-offers a killed reader's messages lazily.
    std::fs::write(&last, script("stop_after_idle = '45s'")).unwrap();

    // Run 1: Bigtable does not answer; the windows are emitted and wait; the kill comes then.
    proxy.stall_for(Duration::from_secs(8));
    let child = crate::a_pubsub_source_kill::spawn(home.path(), &running, true);
    tokio::time::sleep(Duration::from_secs(5)).await;
    crate::a_pubsub_source_kill::kill(child);
    tokio::time::sleep(Duration::from_secs(4)).await;

    // Run 2: killed the moment the marker first records a frontier.
    let marker_frontier = || -> Option<i64> {
        let entry = std::fs::read_dir(progress.path()).ok()?.next()?.ok()?;
        let text = std::fs::read_to_string(entry.path()).ok()?;
        serde_json::from_str::<serde_json::Value>(&text).ok()?["frontier_ns"].as_i64()
    };
    let child = crate::a_pubsub_source_kill::spawn(home.path(), &running, true);
    let until = tokio::time::Instant::now() + Duration::from_secs(90);
    while marker_frontier().is_none() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    crate::a_pubsub_source_kill::kill(child);
    assert!(marker_frontier().is_some(), "run 2 recorded a frontier");

    // Then to its end, as an operator would, until every window landed (at most six runs).
    for run in 1..=6 {
        let child = crate::a_pubsub_source_kill::spawn(home.path(), &last, false);
        let output = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let stderr = crate::support::text(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        let now = landed(&bt, &table).await;
        eprintln!(
            "final run {run}: {} window row(s); {}",
            now.len(),
            stderr
                .lines()
                .find(|l| l.starts_with("Source: "))
                .unwrap_or("")
        );
        if now == expected {
            break;
        }
        // A window is never partial: what landed is a subset of the recomputation, value for
        // value.
        for (k, v) in &now {
            assert_eq!(expected.get(k), Some(v), "window {k} landed wrong or extra");
        }
    }
    assert_eq!(landed(&bt, &table).await, expected, "exact after two kills");
}

/// Two runs of one windowed pipeline (replicas, or an operator starting it twice): the second
/// is refused while the first keeps its progress marker, naming the marker and the other run,
/// and reads nothing; the first is not disturbed and its windows land whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_of_a_windowed_pipeline_is_refused_while_the_first_keeps_its_marker() {
    let f = Fixture::new("win-twice").await;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("win-twice");
    bt.create_table(&table, &["c"]).await;
    let progress = tempfile::tempdir().unwrap();
    let mut messages: Vec<_> = (0..60i64).map(|i| event("ann", i, i)).collect();
    messages.push(event("zed", 10 * 60, 0));
    f.publish(messages).await;
    let source = source_sql(&f, progress.path(), &[("progress_start", "new")])
        .replace("stop_after_idle = '2s'", "stop_after_idle = '12s'");
    let sink = bt.create_sql(
        "counts",
        "k VARCHAR, views VARCHAR",
        &table,
        &[("row_key", "k"), ("column_family", "c")],
    );
    let insert = "INSERT INTO counts
        SELECT user || '#' || to_char(minute, '%H:%M'), CAST(n AS VARCHAR)
        FROM (SELECT user, date_bin(INTERVAL '1 minute', ts) AS minute, count(*) AS n
              FROM clicks WHERE user <> 'zed' GROUP BY user, date_bin(INTERVAL '1 minute', ts))";
    let script = format!("{source}; {sink}; {insert}");
    let first = {
        let script = script.clone();
        tokio::spawn(async move {
            let ctx = crate::pubsub_source::sql_context(10);
            gcp_sql::sql::run(&ctx, &script).await
        })
    };
    // The first run has claimed the marker once it says a run is going.
    let marker = || {
        std::fs::read_dir(progress.path())
            .ok()?
            .next()?
            .ok()
            .and_then(|e| std::fs::read_to_string(e.path()).ok())
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    while !marker().is_some_and(|m| m.contains("\"clean\":false"))
        && tokio::time::Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ctx = crate::pubsub_source::sql_context(10);
    let refused = gcp_sql::sql::run(&ctx, &script)
        .await
        .expect_err("a second run of the same windowed pipeline")
        .to_string();
    assert!(
        refused.contains("another run of this pipeline"),
        "{refused}"
    );
    assert!(refused.contains("runs as one process"), "{refused}");
    assert!(refused.contains(".json"), "{refused}");
    first
        .await
        .unwrap()
        .expect("the first run is not disturbed");
    let landed = bt.read(&table).await;
    let key = format!("ann#{}", minute(0));
    assert_eq!(landed.len(), 1, "one window, whole");
    assert_eq!(landed[key.as_bytes()][0].value, b"60");
}
