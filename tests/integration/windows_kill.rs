//! Windows that stay exact through SIGKILLs (issue 33, ADR 0068), against the in-memory
//! subscription of the null StreamingPull server (ADR 0075), whose leases lapse within seconds
//! and whose lapsed messages come back at once, as the service's do. (The Pub/Sub emulator hands
//! a killed reader's messages back in blocks of 100 every 15-60 s, longer than the hold after an
//! unclean stop: `windows::a_windowed_pipeline_killed_with_sigkill_twice_ends_with_exact_windows`
//! shows what that does.) The output is the real Bigtable emulator, read back with the test's
//! own Bigtable client and with Google's Python client, which must agree; the expected windows
//! are a batch recomputation of the same input in DataFusion.
//!
//! Two pipelines run side by side, each on its own subscription of the same events: one-minute
//! tumbling counts and sums per user, and five-minute windows every minute (`hop`). Both are
//! killed together at every kill point; some kill points are the moment a marker records a new
//! frontier (a window just delivered, its acknowledgements going out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray, TimestampNanosecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use gcp_sql::bench::null_server::{
    FeedOptions, NullServer, NullServerOptions, NullService, Payload,
};

use crate::a_pubsub_source_kill::{in_memory_stats, kill, killed_logs, spawn};
use crate::support::bigtable::Bigtable;
use crate::support::{text, unique};

/// 2025-12-01T00:00:00Z in seconds.
const T0: i64 = 1_764_547_200;
/// The simulated event time the input spans.
const SPAN_S: i64 = 30 * 60;
/// The allowed lateness of the pipelines.
const LATENESS_S: i64 = 20;
/// Every this many messages, one is ten minutes older than its neighbours: later than the
/// lateness, so it is late.
const LATE_EVERY: u64 = 2_500;
/// Every this many messages (not late), one is 15 s older than its neighbours: out of order
/// within the lateness.
const DISORDER_EVERY: u64 = 7;
/// The longest lease the in-memory server grants: a killed run's messages come back this soon.
/// The 10 s the source asks for (its `ack_deadline`), as the service grants it: the source
/// extends a held message's lease every third of that, and a shorter cap leaves a loaded
/// machine too little margin for the kill tests' accounting (a lease that lapses while its
/// message is held has it delivered again; the run holds the copy with its first delivery, as
/// `a_message_delivered_again_while_its_windows_hold_it_is_counted_once` shows).
const LEASE: Duration = Duration::from_secs(10);

/// One input event.
#[derive(Debug, Clone)]
struct Event {
    user: &'static str,
    ts_s: i64,
    v: i64,
    late: bool,
}

/// Message `n` of `total`: the users take turns, event time goes from T0 over SPAN_S, a few are
/// out of order, fewer are late; the last one, at minute 40, closes every window.
fn event(n: u64, total: u64) -> Event {
    let user = ["ann", "bob", "cy", "dee"][(n % 4) as usize];
    if n + 1 == total {
        return Event {
            user: "zed",
            ts_s: T0 + 40 * 60,
            v: 0,
            late: false,
        };
    }
    let mut ts_s = T0 + (n as i64 * SPAN_S) / total as i64;
    let late = n > 0 && n.is_multiple_of(LATE_EVERY) && ts_s - 600 >= T0;
    if late {
        ts_s -= 600;
    } else if n.is_multiple_of(DISORDER_EVERY) && ts_s - 15 >= T0 {
        ts_s -= 15;
    }
    Event {
        user,
        ts_s,
        v: n as i64,
        late,
    }
}

fn payload(n: u64, total: u64) -> Vec<u8> {
    let e = event(n, total);
    let ts = chrono::DateTime::from_timestamp(e.ts_s, 0)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    serde_json::json!({ "id": n, "user": e.user, "ts": ts, "v": e.v })
        .to_string()
        .into_bytes()
}

/// The pipeline of `kind` ("tumble" or "hop") reading `subscription` on `server` into Bigtable.
fn pipeline(
    kind: &str,
    subscription: &str,
    server: &str,
    progress: &Path,
    dead: &Path,
    (table, bigtable): (&str, &str),
    last: bool,
) -> String {
    // A run that drains stops after 8 s without a message; a stream idle for 3 s stops
    // holding the watermark back before that (the default, 30 s, would leave the last windows
    // to whichever stream read the closing event, run after run).
    let idle = if last {
        ", stop_after_idle = '8s', idle_timeout = '3s'"
    } else {
        ""
    };
    let (window, key, version) = match kind {
        "tumble" => (
            "date_bin(INTERVAL '1 minute', ts)",
            "to_char(w, '%H:%M')",
            "w + INTERVAL '1 minute'",
        ),
        _ => (
            "hop(INTERVAL '1 minute', INTERVAL '5 minutes')",
            "to_char(w['start'], '%H:%M')",
            "w['end']",
        ),
    };
    format!(
        "CREATE TABLE clicks (id BIGINT, user VARCHAR, ts TIMESTAMP, v BIGINT)
           WITH (connector = 'pubsub', subscription = '{subscription}', emulator_host = '{server}',
                 format = 'json', event_time_field = 'ts', allowed_lateness = '{LATENESS_S}s',
                 progress_path = '{progress}', progress_start = 'new',
                 failure_policy = 'dead_letter', dead_letter_path = 'file://{dead}',
                 parallel_pull_count = 2, max_outstanding_messages = 500,
                 ack_deadline = '10s'{idle});
         CREATE TABLE counts (k VARCHAR, views VARCHAR, total VARCHAR, version TIMESTAMP)
           WITH (connector = 'bigtable', table = '{table}', emulator_host = '{bigtable}',
                 row_key = 'k', column_family = 'c', timestamp_column = 'version');
         INSERT INTO counts
         SELECT '{kind}:' || user || '#' || {key}, CAST(n AS VARCHAR), CAST(s AS VARCHAR), {version}
         FROM (SELECT user, {window} AS w, count(*) AS n, sum(v) AS s
               FROM clicks WHERE user <> 'zed' GROUP BY user, {window});\n",
        progress = progress.display(),
        dead = dead.display(),
    )
}

/// The expected windows: the on-time events recomputed in DataFusion (tumbling, by `date_bin`)
/// and by enumeration (each event's five hopping windows), as key → (count, sum).
async fn recompute(total: u64) -> BTreeMap<String, (String, String)> {
    let events: Vec<Event> = (0..total)
        .map(|n| event(n, total))
        .filter(|e| !e.late && e.user != "zed")
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("user", DataType::Utf8, false),
        Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), false),
        Field::new("v", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(events.iter().map(|e| e.user))),
            Arc::new(TimestampNanosecondArray::from_iter_values(
                events.iter().map(|e| e.ts_s * 1_000_000_000),
            )),
            Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.v))),
        ],
    )
    .unwrap();
    let ctx = SessionContext::new();
    ctx.register_table(
        "clicks",
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap()),
    )
    .unwrap();
    let rows = ctx
        .sql(
            "SELECT 'tumble:' || user || '#' || to_char(date_bin(INTERVAL '1 minute', ts), '%H:%M') AS k,
                    CAST(count(*) AS VARCHAR) AS n, CAST(sum(v) AS VARCHAR) AS s
             FROM clicks GROUP BY user, date_bin(INTERVAL '1 minute', ts)",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut expected = BTreeMap::new();
    for b in rows {
        // (DataFusion may answer in any string type; read each as Utf8.)
        let text = |i: usize| {
            datafusion::arrow::compute::cast(b.column(i), &DataType::Utf8)
                .unwrap()
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .clone()
        };
        let (k, n, s) = (text(0), text(1), text(2));
        for i in 0..b.num_rows() {
            expected.insert(
                k.value(i).to_string(),
                (n.value(i).to_string(), s.value(i).to_string()),
            );
        }
    }
    let mut hops: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for e in &events {
        let last = e.ts_s - e.ts_s.rem_euclid(60);
        for k in 0..5 {
            let start = chrono::DateTime::from_timestamp(last - k * 60, 0).unwrap();
            let entry = hops
                .entry(format!("hop:{}#{}", e.user, start.format("%H:%M")))
                .or_default();
            entry.0 += 1;
            entry.1 += e.v;
        }
    }
    for (k, (n, s)) in hops {
        expected.insert(k, (n.to_string(), s.to_string()));
    }
    expected
}

/// Bigtable's rows as key → (views, total).
async fn landed(bt: &Bigtable, table: &str) -> BTreeMap<String, (String, String)> {
    bt.read(table)
        .await
        .iter()
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

/// The frontier a pipeline's marker records, if any.
fn frontier(progress: &Path) -> Option<i64> {
    let entry = std::fs::read_dir(progress)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| e.path().extension().is_some_and(|x| x == "json"))?;
    let text = std::fs::read_to_string(entry.path()).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["frontier_ns"].as_i64()
}

/// The run that holds a pipeline's marker, if any (a new run writes its own id once it has
/// claimed the marker, before it reads).
fn claim(progress: &Path) -> Option<String> {
    let entry = std::fs::read_dir(progress)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| e.path().extension().is_some_and(|x| x == "json"))?;
    let text = std::fs::read_to_string(entry.path()).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["run"]
        .as_str()
        .map(str::to_string)
}

/// The events dead-lettered under `dead` (every completed object), by their `v` (the event's
/// number; the window's input keeps only the columns it aggregates).
fn dead_lettered(dead: &Path) -> Vec<u64> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dead).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            let letter: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(id) = letter["row"]["v"].as_u64() {
                ids.push(id);
            }
        }
    }
    ids
}

struct Side {
    kind: &'static str,
    subscription: String,
    progress: tempfile::TempDir,
    dead: tempfile::TempDir,
    running: PathBuf,
    last: PathBuf,
}

/// Runs both pipelines over `total` events, killed `kills` times (the first and every third
/// kill the moment a marker records a new frontier, the others at a random point once the run
/// reads), then to their end; checks Bigtable against the
/// recomputation and the dead letters against the late events.
/// Returns each pipeline's redeliveries on the server.
async fn windows_survive_kills(
    total: u64,
    kills: usize,
    lose_lease_every: Option<u64>,
) -> Vec<u64> {
    let server = NullServer::start(
        "127.0.0.1:0".parse().unwrap(),
        NullServerOptions::new(
            NullService::PubSubSubscribe,
            FeedOptions {
                messages: total,
                max_ack_deadline: Some(LEASE),
                lose_lease_every,
                payload: Some(Payload::new(move |n| payload(n, total))),
                ..FeedOptions::default()
            },
        ),
    )
    .await
    .unwrap();
    let host = server.addr().to_string();
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("win-kills");
    bt.create_table(&table, &["c"]).await;
    let home = tempfile::tempdir().unwrap();
    let mut sides = Vec::new();
    for kind in ["tumble", "hop"] {
        let subscription = format!(
            "projects/kill-tests/subscriptions/{}",
            unique(&format!("win-{kind}"))
        );
        let progress = tempfile::tempdir().unwrap();
        let dead = tempfile::tempdir().unwrap();
        let running = home.path().join(format!("{kind}-running.sql"));
        let last = home.path().join(format!("{kind}-last.sql"));
        for (path, is_last) in [(&running, false), (&last, true)] {
            std::fs::write(
                path,
                pipeline(
                    kind,
                    &subscription,
                    &host,
                    progress.path(),
                    dead.path(),
                    (&table, &bt.host),
                    is_last,
                ),
            )
            .unwrap();
        }
        sides.push(Side {
            kind,
            subscription,
            progress,
            dead,
            running,
            last,
        });
    }

    let mut when = Vec::new();
    for k in 0..kills {
        let claimed_before = claim(sides[0].progress.path());
        let children: Vec<_> = sides
            .iter()
            .map(|s| spawn(home.path(), &s.running, true))
            .collect();
        // The run reads once it has claimed the marker (after a kill, once the killed run's
        // marker went stale).
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        while claim(sides[0].progress.path()) == claimed_before
            && tokio::time::Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let before = frontier(sides[0].progress.path());
        let at_frontier = k % 3 == 0;
        if at_frontier {
            // The moment the tumbling marker moves: a window was just delivered and its
            // messages' acknowledgements are going out. (After a kill no window is emitted for
            // the hold, twice the ack deadline plus 5 s.)
            let until = tokio::time::Instant::now() + Duration::from_secs(90);
            while frontier(sides[0].progress.path()) == before
                && tokio::time::Instant::now() < until
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        } else {
            // A point of its own, 0.5 to 4 s into the reading.
            let ms = 500 + fastrand::u64(..3_500);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        for child in children {
            kill(child);
        }
        let frontier_now = frontier(sides[0].progress.path());
        when.push(format!(
            "kill {}: {}, tumbling frontier at minute {:?}",
            k + 1,
            if at_frontier {
                "as a frontier was recorded"
            } else {
                "at a random point"
            },
            frontier_now.map(|f| (f / 1_000_000_000 - T0) / 60)
        ));
    }
    for w in &when {
        eprintln!("{w}");
    }
    // What the killed runs logged (warnings and errors only, by default): a run that stalls
    // usually says why.
    let keep_logs = std::env::var_os("WINDOWS_KILL_LOGS_TO");
    for (name, log) in killed_logs(home.path()) {
        if let Some(dir) = &keep_logs {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(Path::new(dir).join(&name), &log).unwrap();
        }
        let lines: Vec<&str> = log.lines().collect();
        if lines.len() > 2 && keep_logs.is_none() {
            eprintln!(
                "{name}: {} line(s) on stderr, the last: {}",
                lines.len(),
                lines.last().copied().unwrap_or_default()
            );
        }
    }

    let expected = recompute(total).await;
    for run in 1..=4 {
        let children: Vec<_> = sides
            .iter()
            .map(|s| spawn(home.path(), &s.last, false))
            .collect();
        for (side, child) in sides.iter().zip(children) {
            let output = tokio::task::spawn_blocking(move || child.wait_with_output())
                .await
                .unwrap()
                .unwrap();
            let stderr = text(&output.stderr);
            assert!(output.status.success(), "{}: {stderr}", side.kind);
            // The summaries and the window lines; every line with WINDOWS_KILL_ALL_LINES set.
            let all = std::env::var_os("WINDOWS_KILL_ALL_LINES").is_some();
            eprintln!(
                "final run {run} of {}: {}",
                side.kind,
                stderr
                    .lines()
                    .filter(|l| all || l.starts_with("Source: ") || l.contains("windows"))
                    .collect::<Vec<_>>()
                    .join("\n    ")
            );
        }
        // Done once every window landed and every message was acknowledged (a message a
        // killed run leased comes back when its lease lapses, maybe after a run ended).
        let now = landed(&bt, &table).await;
        let acked = sides
            .iter()
            .all(|s| in_memory_stats(&server, &s.subscription).acked == total);
        if acked && expected.keys().all(|k| now.contains_key(k)) {
            break;
        }
    }
    let now = landed(&bt, &table).await;
    // What is checked below is also what Google's own client reads.
    assert_eq!(
        bt.read_with_python(&table),
        bt.read(&table).await,
        "Google's Python Bigtable client reads the table as the test's client does"
    );
    if let Some(dir) = std::env::var_os("WINDOWS_KILL_LOGS_TO") {
        for side in &sides {
            for (what, from) in [
                ("progress", side.progress.path()),
                ("dead", side.dead.path()),
            ] {
                let to = Path::new(&dir).join(format!("{}-{what}", side.kind));
                let _ = std::process::Command::new("cp")
                    .arg("-r")
                    .arg(from)
                    .arg(&to)
                    .status();
            }
        }
    }
    for side in &sides {
        let stats = in_memory_stats(&server, &side.subscription);
        assert_eq!(
            stats.acked, total,
            "{}: every message acknowledged on the server ({stats:?})",
            side.kind
        );
    }

    // The accounting of every window and every late event, per pipeline.
    let mut redelivered = Vec::new();
    let late: BTreeSet<u64> = (0..total).filter(|&n| event(n, total).late).collect();
    for side in &sides {
        let letters = dead_lettered(side.dead.path());
        let unique_letters: BTreeSet<u64> = letters.iter().copied().collect();
        assert!(
            unique_letters.is_subset(&late),
            "{}: only late rows are dead-lettered: {:?}",
            side.kind,
            unique_letters.difference(&late).collect::<Vec<_>>()
        );
        let prefix = format!("{}:", side.kind);
        let mut counted: BTreeSet<u64> = BTreeSet::new();
        let keys: BTreeSet<&String> = expected
            .keys()
            .chain(now.keys())
            .filter(|k| k.starts_with(&prefix))
            .collect();
        for k in keys {
            let want = expected
                .get(k)
                .map(|(n, s)| (n.parse::<i64>().unwrap(), s.parse::<i64>().unwrap()));
            let got = now
                .get(k)
                .map(|(n, s)| (n.parse::<i64>().unwrap(), s.parse::<i64>().unwrap()));
            let Some(got) = got else {
                panic!("window {k} is missing (expected {want:?})");
            };
            let want = want.unwrap_or((0, 0));
            if got == want {
                continue;
            }
            // A difference is only ever late events of this window that were not
            // dead-lettered, counted because a kill had them come back to a window that was
            // being recomputed (ADR 0068, "A late row interrupted by a kill").
            let candidates: Vec<u64> = late
                .iter()
                .copied()
                .filter(|&n| {
                    !unique_letters.contains(&n)
                        && windows_of(side.kind, &event(n, total)).contains(k)
                })
                .collect();
            let explained = (0u32..1 << candidates.len()).find_map(|mask| {
                let chosen: Vec<u64> = (0..candidates.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| candidates[i])
                    .collect();
                let add = (
                    chosen.len() as i64,
                    chosen.iter().map(|&n| event(n, total).v).sum::<i64>(),
                );
                ((want.0 + add.0, want.1 + add.1) == got).then_some(chosen)
            });
            let chosen = explained.unwrap_or_else(|| {
                panic!(
                    "window {k} landed wrong: {got:?} where its on-time events make {want:?} \
                     (late events of it not dead-lettered: {candidates:?})"
                )
            });
            counted.extend(chosen);
        }
        let both: Vec<_> = counted.intersection(&unique_letters).collect();
        assert!(
            both.is_empty(),
            "{}: late events both counted and dead-lettered: {both:?}",
            side.kind
        );
        let neither = late.len() - counted.len() - unique_letters.len();
        let stats = in_memory_stats(&server, &side.subscription);
        eprintln!(
            "{}: {} late event(s): {} dead-lettered ({} letter(s)), {} counted in a window \
             (read before it closed, or recomputed after a kill), {} neither; {} deliveries, {} leases \
             lapsed; {}",
            side.kind,
            late.len(),
            unique_letters.len(),
            letters.len(),
            counted.len(),
            neither,
            stats.delivered,
            stats.expired,
            side.subscription
        );
        // No late event is lost: each is dead-lettered, or counted in a window that was
        // computed again after a kill (read before that window closed). A kill leaves none
        // acknowledged as covered, since only the messages of a recorded window's covered
        // set are (ADR 0068, "A late row interrupted by a kill").
        assert_eq!(
            neither, 0,
            "{}: every late event counted or dead-lettered",
            side.kind
        );
        if kills == 0 {
            // Without a kill nothing is left to chance: no letter twice.
            assert_eq!(
                letters.len(),
                unique_letters.len(),
                "{}: every late event dead-lettered once",
                side.kind
            );
        }
        redelivered.push(stats.redelivered);
    }
    redelivered
}

/// The keys of the windows (of pipeline `kind`) an event belongs to.
fn windows_of(kind: &str, e: &Event) -> Vec<String> {
    let last = e.ts_s - e.ts_s.rem_euclid(60);
    let starts: Vec<i64> = if kind == "tumble" {
        vec![last]
    } else {
        (0..5).map(|k| last - k * 60).collect()
    };
    starts
        .into_iter()
        .map(|start| {
            let start = chrono::DateTime::from_timestamp(start, 0).unwrap();
            format!("{kind}:{}#{}", e.user, start.format("%H:%M"))
        })
        .collect()
}

/// The CI size: 4,000 events, two kills (one as a frontier is recorded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbling_and_hopping_windows_stay_exact_through_two_sigkills() {
    windows_survive_kills(4_000, 2, None).await;
}

/// The issue's size: 200,000 events over 30 simulated minutes, ten kills (several minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "200,000 events and ten kills take several minutes; the result is in docs/benchmarks.md"]
async fn tumbling_and_hopping_windows_stay_exact_through_ten_sigkills() {
    windows_survive_kills(200_000, 10, None).await;
}

/// Pub/Sub delivers at least once: here the server loses the first lease of every 20th
/// message after 50 ms, whatever the source extends it to, so each of them comes back while
/// its windows still hold the first copy, or just after they were recorded. Every window is
/// still exact, every late event dead-lettered once, and the server saw the redeliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_delivered_again_while_its_windows_hold_it_is_counted_once() {
    let redelivered = windows_survive_kills(4_000, 0, Some(20)).await;
    assert!(
        redelivered.iter().all(|&n| n > 0),
        "the server delivered messages again during the run: {redelivered:?}"
    );
}
