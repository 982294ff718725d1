//! The integration tests, gathered in one test binary so that DataFusion and the Google clients
//! are linked once rather than once per file (as DataFusion does with its `core_integration`
//! binary).
//!
//! Each module keeps the purpose it had as a binary of its own:
//!
//! | module | what it drives |
//! |---|---|
//! | [`emulator_smoke`] | the emulator harness: each real emulator starts, answers and stops |
//! | [`pubsub_mapping`] | the Pub/Sub row mapping alone (no service) |
//! | [`pubsub_sink`] | the Pub/Sub sink against the Pub/Sub emulator |
//! | [`pubsub_transport`] | the Pub/Sub transport (the connector's core `Transport`) against the Pub/Sub emulator |
//! | [`pubsub_emulator_facts`] | what the Pub/Sub emulator does with a nack, with and without an open stream (docs/service_facts.md) |
//! | [`pubsub_faults`] | the Pub/Sub sink against a scripted fake Publisher |
//! | [`a_pubsub_source_kill`] | `pubsub_source_kill.rs`: a Pub/Sub → Bigtable run of the `gcp-sql` binary killed with SIGKILL several times loses nothing, on the emulator and on the in-memory subscription of `serve-null --service pubsub-subscribe` (ten kills, duplicates printed) |
//! | [`pubsub_replicas`] | two `gcp-sql` processes on one subscription into Bigtable share its messages; one killed with SIGKILL: every message landed, duplicates counted and bounded |
//! | [`pubsub_source`] | the Pub/Sub subscription source against the Pub/Sub emulator: rows, metadata, acknowledgements read back |
//! | [`pubsub_source_schema`] | the Pub/Sub source decoding Avro and Protobuf: fastavro's datums, the sink's messages read back, topic schemas |
//! | [`cloud_tasks_sink`] | the Cloud Tasks sink against its emulator and a scripted fake |
//! | [`cloud_tasks_schema`] | Cloud Tasks bodies in Avro and Protobuf, dispatched by the emulator and decoded by fastavro and google.protobuf |
//! | [`docs_examples`] | every SQL example of README.md and docs/*.md, run against the emulators |
//! | [`dead_letter`] | `failure_policy = 'dead_letter'` on each sink: the dead-letter topic and folder, read back |
//! | [`bigtable_sink`] | the Bigtable sink against `cbtemulator` and a scripted fake |
//! | [`bigtable_write_modes`] | the Bigtable sink's changelog (`op_column`) and write modes against `cbtemulator`, a 50,000-event changelog replayed twice, and a fake `ReadModifyWriteRow` |
//! | [`bigtable_scan`] | `SELECT` on a Bigtable table against `cbtemulator`: row-key pushdown, partitions, a resumed stream, every type read back |
//! | [`bigtable_dml`] | `DELETE` and `UPDATE` by row key against `cbtemulator`: 1,000 keys, a 10,000-key range, the rest intact; the refusals |
//! | [`bigtable_lookup`] | lookup joins on a Bigtable row key: INNER and LEFT, one `ReadRows` per batch, the cache, a subscription enriched into a sink, the refusals |
//! | [`lookup_kill`] | a lookup pipeline on the null server's in-memory subscription, killed with SIGKILL twice: every joined row landed with its profile, every message acknowledged |
//! | [`cli`] | the `gcp-sql` binary as a process |
//! | [`cli_shell`] | the `gcp-sql` shell: `SHOW TABLES`, `\d`, result formats, log colours |
//! | [`quickstart`] | `sql/quickstart.sql` on `--emulators`, and the inspection functions it reads back with |
//! | [`env_options`] | `${NAME}` in option values through the `gcp-sql` binary: expanded, escaped, unset, never echoed |
//! | [`redaction`] | the `gcp-sql` binary's logs and errors carry no row value (a fake Cloud Tasks) |
//! | [`errors_help`] | errors that help: a sink whose emulator address refuses, the Pub/Sub inspection functions on a large backlog |
//! | [`first_hour`] | what a new user meets first: `gcp-sql emulators`, errors printed once, a closed pipe, hints |
//! | [`streaming`] | unbounded INSERTs from a FIFO: live delivery, flush points, a graceful stop |
//! | [`metrics`] | the metrics and health endpoint over a subscription-into-Bigtable pipeline: scrapes checked against what landed, `/readyz` while Bigtable is black-holed |
//! | [`transport_faults`] | each sink against its real emulator behind a TCP proxy that resets, stalls and cuts connections |
//! | [`windows`] | windows over a subscription into Bigtable: counts equal to a recomputation, late rows, the progress marker, refusals, flow control (ADR 0068) |
//! | [`windows_kill`] | tumbling and hopping windows on the null server's in-memory subscription, killed with SIGKILL: every window equal to its on-time events plus the late events the accounting names, no event both counted and dead-lettered, every message acknowledged |
//!
//! The tests of one module run on their own with a filter: `cargo test --test integration
//! pubsub_sink::`. Every emulator-backed module draws on the same emulators
//! (`gcp_sql::emulators::shared`, one per kind for the whole binary, started on first use), so
//! each test names its own projects, topics, queues and tables.
//!
//! No test here sets or removes an environment variable of this process: tests run on parallel
//! threads, and a sink's options read the emulator variables (`PUBSUB_EMULATOR_HOST`, ...) when
//! they are parsed. A test that needs the
//! environment changed runs a child process (as [`cli`] does) or lives in a binary of its own.

// `json!` objects with many fields (in `pubsub_sink`) need a deeper macro recursion than the
// default.
#![recursion_limit = "256"]

mod support;

// The longest test (`pubsub_source_kill`, about 5 minutes, mostly the emulator's ack deadlines
// and its idle runs) is declared under a name that sorts first: libtest starts the tests in the
// order of their names, two at a time on 2 cores, so started first it runs beside the others
// instead of trailing them alone (its name used to sort late: the binary took 517 s, by
// libtest's own per-test times 413 s with it first; measured first: 350 s, where the same
// run's times in the old order give 436 s). Its filter is still `pubsub_source_kill::`.
#[cfg(feature = "cli")]
#[path = "pubsub_source_kill.rs"]
mod a_pubsub_source_kill;

mod bigtable_dml;
mod bigtable_lookup;
// A lookup pipeline killed on the null server's in-memory subscription (the `cli` feature's
// kill helpers drive the binary).
mod bigtable_scan;
mod bigtable_sink;
mod bigtable_write_modes;
#[cfg(feature = "cli")]
mod lookup_kill;
// Runs the `gcp-sql` binary (`CARGO_BIN_EXE_gcp-sql`), which is built only with the `cli`
// feature (on by default).
#[cfg(feature = "cli")]
mod cli;
// Runs the `gcp-sql` binary too: its shell commands, result formats and log colours.
#[cfg(feature = "cli")]
mod cli_shell;
mod cloud_tasks_schema;
mod cloud_tasks_sink;
mod dead_letter;
mod docs_examples;
mod emulator_smoke;
// Runs the `gcp-sql` binary: `${NAME}` in option values.
#[cfg(feature = "cli")]
mod env_options;
mod errors_help;
mod failure_counts;
mod first_hour;
mod metrics;
mod pubsub_emulator_facts;
mod pubsub_faults;
mod pubsub_mapping;
mod pubsub_replay;
// Runs two `gcp-sql` binaries on one subscription (and the kill test's `spawn`).
#[cfg(feature = "cli")]
mod pubsub_replicas;
mod pubsub_schema;
mod pubsub_sink;
mod pubsub_source;
mod pubsub_source_schema;
mod pubsub_transport;
// Feeds a FIFO (Unix only).
mod streaming;
mod windows;
// On the null server's in-memory subscription, which the `cli` feature's kill helpers drive.
#[cfg(feature = "cli")]
mod windows_kill;
// Runs the `gcp-sql` binary: the quickstart and the inspection functions.
#[cfg(feature = "cli")]
mod quickstart;
// Runs the `gcp-sql` binary too.
#[cfg(feature = "cli")]
mod redaction;
mod transport_faults;
