//! The typed option model, through the public builders and `from_raw`.
//!
//! Each writer option has a passing and a failing boundary case; the cross-option rules, the SQL
//! name handling (unknown, duplicate, `format.` prefix), destinations and emulator resolution
//! follow. The last tests keep the connector option lists, the typed builders, the boundary
//! cases and `docs/options.md` from drifting.
//!
//! Run: `cargo test --test options`. Regenerate the reference: `GCP_SQL_BLESS=1 cargo test --test options`.

use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{DataType, Field, Fields, Schema, TimeUnit};
use gcp_sql::Error;
use gcp_sql::connectors::bigtable::options::{
    self as bt, BigtableSinkOptions, BigtableWriterOptions, NullHandling,
};
use gcp_sql::connectors::catalog::{options_for, reference_markdown, validate_names};
use gcp_sql::connectors::cloud_tasks::options::{
    self as ct, CloudTasksSinkOptions, CloudTasksWriterOptions, HttpMethod, TaskAuth,
};
use gcp_sql::connectors::pubsub::sink::options::{
    self as ps, PubSubPublisherOptions, PubSubSinkOptions,
};
use gcp_sql::connectors::{ConnectorKind, TableOptions};
use gcp_sql::core::FailurePolicy;
use gcp_sql::options::spec::format_duration;
use gcp_sql::options::{
    Bound, DefaultValue, EmulatorSource, OptionGroup, OptionKind, OptionSpec, PayloadFormat,
    RawOptions,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const MS: Duration = Duration::from_millis(1);
/// `Duration.ofNanos(Long.MAX_VALUE)`, the ceiling of the progress, shutdown and idle timeouts.
const NANOS_MAX: Duration = Duration::from_nanos(i64::MAX as u64);
const MIB: i64 = 1 << 20;

fn raw(pairs: &[(&str, &str)]) -> RawOptions {
    RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .expect("no duplicate in test input")
}

/// An environment with no emulator variable, so a developer's shell cannot change a result.
fn no_env(_: &str) -> Option<String> {
    None
}

const TOPIC: &str = "projects/demo/topics/clicks";
const QUEUE: &str = "projects/demo/locations/us-central1/queues/jobs";
const TABLE: &str = "projects/demo/instances/main/tables/events";

fn pubsub(pairs: &[(&str, &str)]) -> gcp_sql::Result<PubSubSinkOptions> {
    PubSubSinkOptions::from_raw_with_env(Some(TOPIC), &raw(pairs), &no_env)
}

fn tasks(pairs: &[(&str, &str)]) -> gcp_sql::Result<CloudTasksSinkOptions> {
    let mut all = vec![("url", "https://worker.example.com/run")];
    all.extend_from_slice(pairs);
    CloudTasksSinkOptions::from_raw_with_env(Some(QUEUE), &raw(&all), &no_env)
}

fn bigtable(pairs: &[(&str, &str)]) -> gcp_sql::Result<BigtableSinkOptions> {
    let mut all = vec![("row_key", "id")];
    all.extend_from_slice(pairs);
    BigtableSinkOptions::from_raw_with_env(Some(TABLE), &raw(&all), &no_env)
}

/// Asserts an `InvalidOption` naming `option`, and returns its rule.
#[track_caller]
fn invalid<T: std::fmt::Debug>(result: gcp_sql::Result<T>, option: &str) -> String {
    match result {
        Err(Error::InvalidOption {
            option: o, rule, ..
        }) if o == option => rule,
        other => panic!("expected an invalid-option error naming '{option}', got {other:?}"),
    }
}

/// Asserts a `MissingOption` naming `option`.
#[track_caller]
fn missing<T: std::fmt::Debug>(result: gcp_sql::Result<T>, option: &str) {
    match result {
        Err(Error::MissingOption { option: o, .. }) if o == option => {}
        other => panic!("expected a missing-option error naming '{option}', got {other:?}"),
    }
}

/// Asserts a `Schema` error naming `column`, and returns its rule.
#[track_caller]
fn schema_err(result: gcp_sql::Result<()>, column: &str) -> String {
    match result {
        Err(Error::Schema { column: c, rule }) if c == column => rule,
        other => panic!("expected a schema error naming column '{column}', got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Pub/Sub publisher options (PubSubPublisherOptions and its builder)
// ---------------------------------------------------------------------------------------------

#[test]
fn pubsub_defaults_follow_the_documented_defaults_and_the_java_sdk() {
    let o = PubSubPublisherOptions::builder().build().unwrap();
    // The connector's documented defaults.
    assert_eq!(o.max_in_flight_messages(), 1000);
    assert_eq!(o.max_in_flight_bytes(), 64 * MIB);
    assert_eq!(o.recovery_initial_backoff(), Duration::from_millis(500));
    assert_eq!(o.recovery_max_backoff(), Duration::from_secs(10));
    assert_eq!(o.recovery_max_attempts(), 10);
    assert_eq!(o.publish_progress_timeout(), Duration::from_secs(600));
    assert_eq!(o.shutdown_timeout(), Duration::from_secs(30));
    assert_eq!(o.max_active_publishers(), 100);
    assert_eq!(o.max_consecutive_rejections(), 100);
    assert!(!o.enable_message_ordering());
    assert!(!o.per_destination_metrics());
    assert_eq!(
        o.destination_idle_timeout(),
        ps::DEFAULT_DESTINATION_IDLE_TIMEOUT
    );
    // The batch thresholds of Google's Rust publisher (google-cloud-pubsub BatchingOptions).
    assert_eq!(o.batch_element_count_threshold(), 100);
    assert_eq!(o.batch_request_byte_threshold(), 1_000_000);
    assert_eq!(o.batch_delay_threshold(), Duration::from_millis(10));
    // The Java Pub/Sub client's publisher defaults.
    assert_eq!(o.retry_total_timeout(), Duration::from_secs(600));
    assert_eq!(o.retry_initial_delay(), Duration::from_millis(100));
    assert_eq!(o.retry_delay_multiplier(), 4.0);
    assert_eq!(o.retry_max_delay(), Duration::from_secs(60));
    assert_eq!(o.retry_initial_rpc_timeout(), Duration::from_secs(5));
    assert_eq!(o.retry_rpc_timeout_multiplier(), 4.0);
    assert_eq!(o.retry_max_rpc_timeout(), Duration::from_secs(60));
    assert_eq!(o.retry_max_attempts(), 0);
}

#[test]
fn accepts_pubsub_batch_element_count_threshold_of_one() {
    assert_eq!(
        PubSubPublisherOptions::builder()
            .batch_element_count_threshold(1)
            .build()
            .unwrap()
            .batch_element_count_threshold(),
        1
    );
}

#[test]
fn rejects_pubsub_batch_element_count_threshold_of_zero() {
    invalid(
        PubSubPublisherOptions::builder()
            .batch_element_count_threshold(0)
            .build(),
        "batch_element_count_threshold",
    );
    invalid(
        PubSubPublisherOptions::builder()
            .batch_element_count_threshold(-5)
            .build(),
        "batch_element_count_threshold",
    );
}

#[test]
fn accepts_pubsub_batch_request_byte_threshold_of_one() {
    assert!(
        PubSubPublisherOptions::builder()
            .batch_request_byte_threshold(1)
            .build()
            .is_ok()
    );
}

#[test]
fn rejects_pubsub_batch_request_byte_threshold_of_zero() {
    invalid(
        PubSubPublisherOptions::builder()
            .batch_request_byte_threshold(0)
            .build(),
        "batch_request_byte_threshold",
    );
}

#[test]
fn accepts_positive_batch_delay_threshold() {
    let o = PubSubPublisherOptions::builder()
        .batch_delay_threshold(Duration::from_nanos(1))
        .build()
        .unwrap();
    assert_eq!(o.batch_delay_threshold(), Duration::from_nanos(1));
}

#[test]
fn rejects_zero_batch_delay_threshold() {
    invalid(
        PubSubPublisherOptions::builder()
            .batch_delay_threshold(Duration::ZERO)
            .build(),
        "batch_delay_threshold",
    );
}

/// The five retry durations forwarded to the gax retry settings share one rule: zero or at least 1 ms.
type DurationSetter =
    fn(ps::PubSubPublisherOptionsBuilder, Duration) -> ps::PubSubPublisherOptionsBuilder;
const MILLIS_OR_ZERO: [(&str, DurationSetter); 5] = [
    ("retry_total_timeout", |b, d| b.retry_total_timeout(d)),
    ("retry_initial_delay", |b, d| b.retry_initial_delay(d)),
    ("retry_max_delay", |b, d| b.retry_max_delay(d)),
    ("retry_initial_rpc_timeout", |b, d| {
        b.retry_initial_rpc_timeout(d)
    }),
    ("retry_max_rpc_timeout", |b, d| b.retry_max_rpc_timeout(d)),
];

#[test]
fn accepts_zero_retry_durations() {
    for (name, set) in MILLIS_OR_ZERO {
        assert!(
            set(PubSubPublisherOptions::builder(), Duration::ZERO)
                .build()
                .is_ok(),
            "{name} = 0s"
        );
    }
    assert_eq!(
        PubSubPublisherOptions::builder()
            .retry_total_timeout(Duration::ZERO)
            .build()
            .unwrap()
            .retry_total_timeout(),
        Duration::ZERO
    );
}

#[test]
fn accepts_one_millisecond_retry_durations() {
    for (name, set) in MILLIS_OR_ZERO {
        assert!(
            set(PubSubPublisherOptions::builder(), MS).build().is_ok(),
            "{name} = 1ms"
        );
    }
}

#[test]
fn rejects_sub_millisecond_retry_durations() {
    for (name, set) in MILLIS_OR_ZERO {
        let rule = invalid(
            set(
                PubSubPublisherOptions::builder(),
                Duration::from_micros(999),
            )
            .build(),
            name,
        );
        assert!(rule.contains("1ms"), "{name}: {rule}");
        invalid(
            set(PubSubPublisherOptions::builder(), Duration::from_nanos(1)).build(),
            name,
        );
    }
}

#[test]
fn rejects_sub_millisecond_retry_initial_delay_written_in_sql() {
    let rule = invalid(
        pubsub(&[("retry_initial_delay", "500us")]),
        "retry_initial_delay",
    );
    assert!(rule.contains("sub-millisecond"), "{rule}");
}

#[test]
fn accepts_zero_retry_total_timeout_written_in_sql() {
    assert_eq!(
        pubsub(&[("retry_total_timeout", "0s")])
            .unwrap()
            .publisher
            .retry_total_timeout(),
        Duration::ZERO
    );
}

#[test]
fn accepts_retry_multipliers_of_one() {
    let o = PubSubPublisherOptions::builder()
        .retry_delay_multiplier(1.0)
        .retry_rpc_timeout_multiplier(1.0)
        .build()
        .unwrap();
    assert_eq!(
        (o.retry_delay_multiplier(), o.retry_rpc_timeout_multiplier()),
        (1.0, 1.0)
    );
}

#[test]
fn rejects_retry_multipliers_below_one() {
    invalid(
        PubSubPublisherOptions::builder()
            .retry_delay_multiplier(0.999)
            .build(),
        "retry_delay_multiplier",
    );
    invalid(
        PubSubPublisherOptions::builder()
            .retry_rpc_timeout_multiplier(0.5)
            .build(),
        "retry_rpc_timeout_multiplier",
    );
    invalid(
        PubSubPublisherOptions::builder()
            .retry_delay_multiplier(f64::NAN)
            .build(),
        "retry_delay_multiplier",
    );
    invalid(
        PubSubPublisherOptions::builder()
            .retry_rpc_timeout_multiplier(f64::INFINITY)
            .build(),
        "retry_rpc_timeout_multiplier",
    );
}

#[test]
fn accepts_zero_retry_max_attempts() {
    assert_eq!(
        PubSubPublisherOptions::builder()
            .retry_max_attempts(0)
            .build()
            .unwrap()
            .retry_max_attempts(),
        0
    );
}

#[test]
fn rejects_negative_retry_max_attempts() {
    invalid(
        PubSubPublisherOptions::builder()
            .retry_max_attempts(-1)
            .build(),
        "retry_max_attempts",
    );
}

#[test]
fn accepts_message_ordering_without_a_retry_budget() {
    let o = PubSubPublisherOptions::builder()
        .enable_message_ordering(true)
        .retry_initial_delay(Duration::from_millis(50))
        .build()
        .unwrap();
    assert!(o.enable_message_ordering());
}

#[test]
fn rejects_message_ordering_with_retry_total_timeout() {
    let rule = invalid(
        PubSubPublisherOptions::builder()
            .enable_message_ordering(true)
            .retry_total_timeout(Duration::from_secs(60))
            .build(),
        "enable_message_ordering",
    );
    assert!(rule.contains("retry_total_timeout"), "{rule}");
}

#[test]
fn rejects_message_ordering_with_retry_max_attempts() {
    let rule = invalid(
        pubsub(&[
            ("enable_message_ordering", "true"),
            ("retry_max_attempts", "3"),
        ]),
        "enable_message_ordering",
    );
    assert!(rule.contains("retry_max_attempts"), "{rule}");
}

#[test]
fn accepts_retry_budget_when_ordering_is_explicitly_off() {
    assert!(
        pubsub(&[
            ("enable_message_ordering", "false"),
            ("retry_max_attempts", "3"),
            ("retry_total_timeout", "1m")
        ])
        .is_ok()
    );
}

#[test]
fn accepts_max_in_flight_messages_of_one() {
    assert_eq!(
        PubSubPublisherOptions::builder()
            .max_in_flight_messages(1)
            .build()
            .unwrap()
            .max_in_flight_messages(),
        1
    );
}

#[test]
fn rejects_max_in_flight_messages_of_zero() {
    invalid(
        PubSubPublisherOptions::builder()
            .max_in_flight_messages(0)
            .build(),
        "max_in_flight_messages",
    );
}

#[test]
fn accepts_pubsub_max_in_flight_bytes_of_one_and_count_only() {
    assert!(
        PubSubPublisherOptions::builder()
            .max_in_flight_bytes(1)
            .build()
            .is_ok()
    );
    let o = PubSubPublisherOptions::builder()
        .max_in_flight_bytes(i64::MAX)
        .build()
        .unwrap();
    assert_eq!(
        o.in_flight_byte_cap(),
        u64::MAX,
        "Long.MAX_VALUE bounds by count only"
    );
}

#[test]
fn rejects_pubsub_max_in_flight_bytes_of_zero() {
    invalid(
        PubSubPublisherOptions::builder()
            .max_in_flight_bytes(0)
            .build(),
        "max_in_flight_bytes",
    );
}

#[test]
fn accepts_pubsub_recovery_initial_backoff_of_one_millisecond() {
    assert!(
        PubSubPublisherOptions::builder()
            .recovery_initial_backoff(MS)
            .build()
            .is_ok()
    );
}

#[test]
fn rejects_pubsub_recovery_initial_backoff_below_one_millisecond() {
    invalid(
        PubSubPublisherOptions::builder()
            .recovery_initial_backoff(Duration::from_micros(999))
            .build(),
        "recovery_initial_backoff",
    );
    invalid(
        PubSubPublisherOptions::builder()
            .recovery_initial_backoff(Duration::ZERO)
            .build(),
        "recovery_initial_backoff",
    );
}

#[test]
fn accepts_pubsub_recovery_max_backoff_equal_to_initial() {
    let o = PubSubPublisherOptions::builder()
        .recovery_initial_backoff(Duration::from_secs(2))
        .recovery_max_backoff(Duration::from_secs(2))
        .build()
        .unwrap();
    assert_eq!(o.recovery_max_backoff(), Duration::from_secs(2));
}

#[test]
fn rejects_pubsub_recovery_max_backoff_below_initial() {
    let rule = invalid(
        PubSubPublisherOptions::builder()
            .recovery_initial_backoff(Duration::from_secs(2))
            .recovery_max_backoff(Duration::from_millis(1999))
            .build(),
        "recovery_max_backoff",
    );
    assert!(rule.contains("recovery_initial_backoff"), "{rule}");
    // Against the default initial backoff (500 ms) too.
    invalid(
        pubsub(&[("recovery_max_backoff", "100ms")]),
        "recovery_max_backoff",
    );
    invalid(
        PubSubPublisherOptions::builder()
            .recovery_max_backoff(Duration::from_micros(10))
            .build(),
        "recovery_max_backoff",
    );
}

#[test]
fn accepts_pubsub_recovery_max_attempts_of_one() {
    assert!(
        PubSubPublisherOptions::builder()
            .recovery_max_attempts(1)
            .build()
            .is_ok()
    );
}

#[test]
fn rejects_pubsub_recovery_max_attempts_of_zero() {
    invalid(
        PubSubPublisherOptions::builder()
            .recovery_max_attempts(0)
            .build(),
        "recovery_max_attempts",
    );
}

type PositiveSetter =
    fn(ps::PubSubPublisherOptionsBuilder, Duration) -> ps::PubSubPublisherOptionsBuilder;
const POSITIVE_NANOS: [(&str, PositiveSetter); 3] = [
    ("publish_progress_timeout", |b, d| {
        b.publish_progress_timeout(d)
    }),
    ("shutdown_timeout", |b, d| b.shutdown_timeout(d)),
    ("destination_idle_timeout", |b, d| {
        b.destination_idle_timeout(d)
    }),
];

#[test]
fn accepts_pubsub_timeouts_from_one_nanosecond_to_i64_max_nanoseconds() {
    for (name, set) in POSITIVE_NANOS {
        assert!(
            set(PubSubPublisherOptions::builder(), Duration::from_nanos(1))
                .build()
                .is_ok(),
            "{name} = 1ns"
        );
        assert!(
            set(PubSubPublisherOptions::builder(), NANOS_MAX)
                .build()
                .is_ok(),
            "{name} = i64::MAX ns"
        );
    }
}

#[test]
fn rejects_zero_and_over_long_pubsub_timeouts() {
    for (name, set) in POSITIVE_NANOS {
        invalid(
            set(PubSubPublisherOptions::builder(), Duration::ZERO).build(),
            name,
        );
        let rule = invalid(
            set(
                PubSubPublisherOptions::builder(),
                NANOS_MAX + Duration::from_nanos(1),
            )
            .build(),
            name,
        );
        assert!(rule.contains("292 years"), "{name}: {rule}");
    }
}

#[test]
fn rejects_publish_progress_timeout_of_293_years_written_in_sql() {
    invalid(
        pubsub(&[("publish_progress_timeout", "293y")]),
        "publish_progress_timeout",
    );
    assert!(pubsub(&[("publish_progress_timeout", "292y")]).is_ok());
}

#[test]
fn accepts_max_active_publishers_of_one() {
    assert!(
        PubSubPublisherOptions::builder()
            .max_active_publishers(1)
            .build()
            .is_ok()
    );
}

#[test]
fn rejects_max_active_publishers_of_zero() {
    invalid(
        PubSubPublisherOptions::builder()
            .max_active_publishers(0)
            .build(),
        "max_active_publishers",
    );
}

#[test]
fn accepts_pubsub_per_destination_metrics() {
    assert!(
        PubSubPublisherOptions::builder()
            .per_destination_metrics(true)
            .build()
            .unwrap()
            .per_destination_metrics()
    );
    assert!(
        pubsub(&[("per_destination_metrics", "TRUE")])
            .unwrap()
            .publisher
            .per_destination_metrics()
    );
}

#[test]
fn rejects_per_destination_metrics_that_is_not_a_boolean() {
    let rule = invalid(
        pubsub(&[("per_destination_metrics", "yes")]),
        "per_destination_metrics",
    );
    assert!(rule.contains("'true' or 'false'"), "{rule}");
}

#[test]
fn accepts_unbounded_and_positive_pubsub_max_consecutive_rejections() {
    let o = PubSubPublisherOptions::builder()
        .max_consecutive_rejections(ps::UNBOUNDED)
        .build()
        .unwrap();
    assert_eq!(o.rejection_limit(), None);
    assert_eq!(
        PubSubPublisherOptions::builder()
            .max_consecutive_rejections(1)
            .build()
            .unwrap()
            .rejection_limit(),
        Some(1)
    );
}

#[test]
fn rejects_zero_and_minus_two_pubsub_max_consecutive_rejections() {
    invalid(
        PubSubPublisherOptions::builder()
            .max_consecutive_rejections(0)
            .build(),
        "max_consecutive_rejections",
    );
    invalid(
        PubSubPublisherOptions::builder()
            .max_consecutive_rejections(-2)
            .build(),
        "max_consecutive_rejections",
    );
}

#[test]
fn rejects_an_int_option_beyond_32_bits() {
    let rule = invalid(
        pubsub(&[("max_in_flight_messages", "2147483648")]),
        "max_in_flight_messages",
    );
    assert!(rule.contains("out of range"), "{rule}");
}

#[test]
fn rejects_a_duration_without_unit() {
    let rule = invalid(pubsub(&[("shutdown_timeout", "30")]), "shutdown_timeout");
    assert!(rule.contains("unit"), "{rule}");
}

// ---------------------------------------------------------------------------------------------
// Cloud Tasks writer options (CloudTasksWriterOptions and its builder)
// ---------------------------------------------------------------------------------------------

#[test]
fn cloud_tasks_defaults_follow_the_documented_defaults() {
    let o = CloudTasksWriterOptions::builder().build().unwrap();
    assert_eq!(o.max_in_flight_tasks(), 1000);
    assert_eq!(o.channel_pool_size(), None);
    assert_eq!(o.recovery_initial_backoff(), Duration::from_millis(100));
    assert_eq!(o.recovery_max_backoff(), Duration::from_secs(10));
    assert_eq!(o.recovery_max_attempts(), 8);
    assert_eq!(
        o.not_found_recovery_initial_backoff(),
        Duration::from_millis(500)
    );
    assert_eq!(o.not_found_recovery_max_backoff(), Duration::from_secs(2));
    assert_eq!(o.not_found_recovery_max_attempts(), 3);
    assert!(!o.per_destination_metrics());
}

#[test]
fn accepts_max_in_flight_tasks_of_one() {
    assert_eq!(
        CloudTasksWriterOptions::builder()
            .max_in_flight_tasks(1)
            .build()
            .unwrap()
            .max_in_flight_tasks(),
        1
    );
}

#[test]
fn rejects_max_in_flight_tasks_of_zero() {
    invalid(
        CloudTasksWriterOptions::builder()
            .max_in_flight_tasks(0)
            .build(),
        "max_in_flight_tasks",
    );
}

#[test]
fn accepts_channel_pool_size_of_one_without_emulator() {
    assert_eq!(
        tasks(&[("channel_pool_size", "1")])
            .unwrap()
            .writer
            .channel_pool_size(),
        Some(1)
    );
}

#[test]
fn rejects_channel_pool_size_of_zero() {
    invalid(
        CloudTasksWriterOptions::builder()
            .channel_pool_size(0)
            .build(),
        "channel_pool_size",
    );
}

#[test]
fn rejects_channel_pool_size_with_emulator_host_option() {
    let rule = invalid(
        tasks(&[
            ("channel_pool_size", "4"),
            ("emulator_host", "localhost:8123"),
        ]),
        "channel_pool_size",
    );
    assert!(rule.contains("emulator_host"), "{rule}");
}

#[test]
fn rejects_channel_pool_size_with_emulator_environment_variable() {
    let env = |k: &str| (k == "CLOUD_TASKS_EMULATOR_HOST").then(|| "127.0.0.1:9090".to_string());
    let mut pairs = vec![
        ("url", "https://worker.example.com/run"),
        ("channel_pool_size", "4"),
    ];
    let r = CloudTasksSinkOptions::from_raw_with_env(Some(QUEUE), &raw(&pairs), &env);
    let rule = invalid(r, "channel_pool_size");
    assert!(rule.contains("CLOUD_TASKS_EMULATOR_HOST"), "{rule}");
    // Without the pool, the same environment gives an emulator connection.
    pairs.pop();
    let o = CloudTasksSinkOptions::from_raw_with_env(Some(QUEUE), &raw(&pairs), &env).unwrap();
    let emulator = o.shared.connection.emulator.unwrap();
    assert_eq!(
        emulator.source,
        EmulatorSource::EnvVar("CLOUD_TASKS_EMULATOR_HOST")
    );
    assert_eq!(emulator.host, "127.0.0.1:9090");
}

#[test]
fn accepts_channel_pool_size_when_an_explicit_endpoint_overrides_the_emulator_variable() {
    let env = |k: &str| (k == "CLOUD_TASKS_EMULATOR_HOST").then(|| "127.0.0.1:9090".to_string());
    let pairs = [
        ("url", "https://worker.example.com/run"),
        ("channel_pool_size", "4"),
        ("endpoint", "https://cloudtasks.googleapis.com"),
    ];
    let o = CloudTasksSinkOptions::from_raw_with_env(Some(QUEUE), &raw(&pairs), &env).unwrap();
    assert_eq!(o.shared.connection.emulator, None);
}

type TasksSetter =
    fn(ct::CloudTasksWriterOptionsBuilder, Duration) -> ct::CloudTasksWriterOptionsBuilder;
const TASKS_BACKOFFS: [(&str, TasksSetter); 4] = [
    ("recovery_initial_backoff", |b, d| {
        b.recovery_initial_backoff(d)
    }),
    ("recovery_max_backoff", |b, d| {
        b.recovery_initial_backoff(MS).recovery_max_backoff(d)
    }),
    ("not_found_recovery_initial_backoff", |b, d| {
        b.not_found_recovery_initial_backoff(d)
    }),
    ("not_found_recovery_max_backoff", |b, d| {
        b.not_found_recovery_initial_backoff(MS)
            .not_found_recovery_max_backoff(d)
    }),
];

#[test]
fn accepts_cloud_tasks_backoffs_of_one_millisecond() {
    for (name, set) in TASKS_BACKOFFS {
        assert!(
            set(CloudTasksWriterOptions::builder(), MS).build().is_ok(),
            "{name} = 1ms"
        );
    }
}

#[test]
fn rejects_cloud_tasks_backoffs_below_one_millisecond() {
    for (name, set) in TASKS_BACKOFFS {
        invalid(
            set(
                CloudTasksWriterOptions::builder(),
                Duration::from_micros(999),
            )
            .build(),
            name,
        );
        invalid(
            set(CloudTasksWriterOptions::builder(), Duration::ZERO).build(),
            name,
        );
    }
}

#[test]
fn rejects_cloud_tasks_max_backoffs_below_their_initial() {
    let rule = invalid(
        tasks(&[("recovery_max_backoff", "50ms")]),
        "recovery_max_backoff",
    );
    assert!(
        rule.contains("100ms"),
        "names the default initial backoff: {rule}"
    );
    invalid(
        CloudTasksWriterOptions::builder()
            .not_found_recovery_initial_backoff(Duration::from_secs(3))
            .build(),
        "not_found_recovery_max_backoff",
    );
    assert!(
        CloudTasksWriterOptions::builder()
            .not_found_recovery_initial_backoff(Duration::from_secs(3))
            .not_found_recovery_max_backoff(Duration::from_secs(3))
            .build()
            .is_ok()
    );
}

#[test]
fn accepts_cloud_tasks_attempts_of_one() {
    let o = CloudTasksWriterOptions::builder()
        .recovery_max_attempts(1)
        .not_found_recovery_max_attempts(1)
        .build()
        .unwrap();
    assert_eq!(
        (
            o.recovery_max_attempts(),
            o.not_found_recovery_max_attempts()
        ),
        (1, 1)
    );
}

#[test]
fn rejects_cloud_tasks_attempts_of_zero() {
    invalid(
        CloudTasksWriterOptions::builder()
            .recovery_max_attempts(0)
            .build(),
        "recovery_max_attempts",
    );
    invalid(
        CloudTasksWriterOptions::builder()
            .not_found_recovery_max_attempts(0)
            .build(),
        "not_found_recovery_max_attempts",
    );
}

#[test]
fn accepts_cloud_tasks_per_destination_metrics() {
    assert!(
        CloudTasksWriterOptions::builder()
            .per_destination_metrics(true)
            .build()
            .unwrap()
            .per_destination_metrics()
    );
    assert!(
        tasks(&[("per_destination_metrics", "true")])
            .unwrap()
            .writer
            .per_destination_metrics()
    );
}

// ---------------------------------------------------------------------------------------------
// Bigtable writer options (BigtableWriterOptions and its builder)
// ---------------------------------------------------------------------------------------------

#[test]
fn bigtable_defaults_follow_the_documented_defaults() {
    let o = BigtableWriterOptions::builder().build().unwrap();
    assert_eq!(o.batch_element_count_threshold(), 100);
    assert_eq!(o.batch_request_byte_threshold(), 20 * MIB);
    assert_eq!(o.max_in_flight_entries(), 1000);
    assert_eq!(o.max_in_flight_bytes(), 64 * MIB);
    assert_eq!(o.max_consecutive_rejections(), 100);
    assert_eq!(o.recovery_initial_backoff(), Duration::from_millis(500));
    assert_eq!(o.recovery_max_backoff(), Duration::from_secs(10));
    assert_eq!(o.recovery_max_attempts(), 10);
    assert_eq!(o.max_active_instances(), 16);
    assert_eq!(
        o.destination_idle_timeout(),
        bt::DEFAULT_DESTINATION_IDLE_TIMEOUT
    );
    assert!(!o.per_destination_metrics());
    assert!(o.warnings().is_empty());
}

#[test]
fn accepts_bigtable_batch_element_count_of_19999() {
    assert_eq!(
        BigtableWriterOptions::builder()
            .batch_element_count_threshold(19_999)
            .build()
            .unwrap()
            .batch_element_count_threshold(),
        19_999
    );
    assert!(
        BigtableWriterOptions::builder()
            .batch_element_count_threshold(1)
            .build()
            .is_ok()
    );
}

#[test]
fn rejects_bigtable_batch_element_count_of_20000() {
    let rule = invalid(
        BigtableWriterOptions::builder()
            .batch_element_count_threshold(20_000)
            .build(),
        "batch_element_count_threshold",
    );
    assert!(rule.contains("19,999"), "{rule}");
    invalid(
        BigtableWriterOptions::builder()
            .batch_element_count_threshold(0)
            .build(),
        "batch_element_count_threshold",
    );
}

#[test]
fn accepts_bigtable_batch_bytes_one_under_100_mib() {
    assert!(
        BigtableWriterOptions::builder()
            .batch_request_byte_threshold(100 * MIB - 1)
            .build()
            .is_ok()
    );
    assert!(bigtable(&[("batch_request_byte_threshold", "104857599")]).is_ok());
}

#[test]
fn rejects_bigtable_batch_bytes_of_100_mib() {
    invalid(
        BigtableWriterOptions::builder()
            .batch_request_byte_threshold(100 * MIB)
            .build(),
        "batch_request_byte_threshold",
    );
    invalid(
        BigtableWriterOptions::builder()
            .batch_request_byte_threshold(0)
            .build(),
        "batch_request_byte_threshold",
    );
}

#[test]
fn accepts_max_in_flight_entries_up_to_20000_without_warning() {
    let o = BigtableWriterOptions::builder()
        .max_in_flight_entries(20_000)
        .build()
        .unwrap();
    assert!(o.warnings().is_empty(), "{:?}", o.warnings());
    assert!(
        BigtableWriterOptions::builder()
            .max_in_flight_entries(1)
            .build()
            .is_ok()
    );
}

#[test]
fn warns_but_accepts_max_in_flight_entries_of_20001() {
    let o = BigtableWriterOptions::builder()
        .max_in_flight_entries(20_001)
        .build()
        .unwrap();
    assert_eq!(o.max_in_flight_entries(), 20_001);
    assert_eq!(o.warnings().len(), 1);
    assert!(
        o.warnings()[0].contains("max_in_flight_entries"),
        "{:?}",
        o.warnings()
    );
}

#[test]
fn rejects_max_in_flight_entries_of_zero() {
    invalid(
        BigtableWriterOptions::builder()
            .max_in_flight_entries(0)
            .build(),
        "max_in_flight_entries",
    );
}

#[test]
fn accepts_bigtable_max_in_flight_bytes_up_to_100_mib_without_warning() {
    let o = BigtableWriterOptions::builder()
        .max_in_flight_bytes(100 * MIB)
        .build()
        .unwrap();
    assert!(o.warnings().is_empty(), "{:?}", o.warnings());
}

#[test]
fn warns_but_accepts_bigtable_max_in_flight_bytes_above_100_mib() {
    let o = bigtable(&[
        ("max_in_flight_bytes", "104857601"),
        ("max_in_flight_entries", "30000"),
    ])
    .unwrap();
    assert_eq!(o.writer.warnings().len(), 2);
    assert!(
        o.writer
            .warnings()
            .iter()
            .any(|w| w.contains("max_in_flight_bytes")),
        "{:?}",
        o.writer.warnings()
    );
}

#[test]
fn rejects_bigtable_max_in_flight_bytes_of_zero() {
    invalid(
        BigtableWriterOptions::builder()
            .max_in_flight_bytes(0)
            .build(),
        "max_in_flight_bytes",
    );
}

#[test]
fn accepts_unbounded_bigtable_max_consecutive_rejections() {
    assert_eq!(
        BigtableWriterOptions::builder()
            .max_consecutive_rejections(bt::UNBOUNDED)
            .build()
            .unwrap()
            .rejection_limit(),
        None
    );
    assert_eq!(
        bigtable(&[("max_consecutive_rejections", "1")])
            .unwrap()
            .writer
            .rejection_limit(),
        Some(1)
    );
}

#[test]
fn rejects_zero_bigtable_max_consecutive_rejections() {
    invalid(
        BigtableWriterOptions::builder()
            .max_consecutive_rejections(0)
            .build(),
        "max_consecutive_rejections",
    );
    invalid(
        bigtable(&[("max_consecutive_rejections", "-2")]),
        "max_consecutive_rejections",
    );
}

#[test]
fn accepts_bigtable_recovery_at_its_bounds() {
    let o = BigtableWriterOptions::builder()
        .recovery_initial_backoff(MS)
        .recovery_max_backoff(MS)
        .recovery_max_attempts(1)
        .build()
        .unwrap();
    assert_eq!(
        (
            o.recovery_initial_backoff(),
            o.recovery_max_backoff(),
            o.recovery_max_attempts()
        ),
        (MS, MS, 1)
    );
}

#[test]
fn rejects_bigtable_recovery_outside_its_bounds() {
    invalid(
        BigtableWriterOptions::builder()
            .recovery_initial_backoff(Duration::from_micros(999))
            .build(),
        "recovery_initial_backoff",
    );
    invalid(
        BigtableWriterOptions::builder()
            .recovery_max_backoff(Duration::from_millis(499))
            .build(),
        "recovery_max_backoff",
    );
    invalid(
        BigtableWriterOptions::builder()
            .recovery_max_attempts(0)
            .build(),
        "recovery_max_attempts",
    );
}

#[test]
fn accepts_bigtable_destination_idle_timeout_of_i64_max_nanoseconds() {
    assert_eq!(
        BigtableWriterOptions::builder()
            .destination_idle_timeout(NANOS_MAX)
            .build()
            .unwrap()
            .destination_idle_timeout(),
        NANOS_MAX
    );
}

#[test]
fn rejects_bigtable_destination_idle_timeout_of_zero_or_beyond_i64_nanoseconds() {
    invalid(
        BigtableWriterOptions::builder()
            .destination_idle_timeout(Duration::ZERO)
            .build(),
        "destination_idle_timeout",
    );
    invalid(
        BigtableWriterOptions::builder()
            .destination_idle_timeout(NANOS_MAX + Duration::from_nanos(1))
            .build(),
        "destination_idle_timeout",
    );
}

#[test]
fn accepts_max_active_instances_of_one() {
    assert_eq!(
        BigtableWriterOptions::builder()
            .max_active_instances(1)
            .build()
            .unwrap()
            .max_active_instances(),
        1
    );
}

#[test]
fn rejects_max_active_instances_of_zero() {
    invalid(
        BigtableWriterOptions::builder()
            .max_active_instances(0)
            .build(),
        "max_active_instances",
    );
}

#[test]
fn accepts_bigtable_per_destination_metrics() {
    assert!(
        bigtable(&[("per_destination_metrics", "true")])
            .unwrap()
            .writer
            .per_destination_metrics()
    );
}

// ---------------------------------------------------------------------------------------------
// Names, duplicates, destinations, LOCATION
// ---------------------------------------------------------------------------------------------

#[test]
fn rejects_unknown_option_with_the_nearest_name() {
    let err = pubsub(&[("batch_element_count_treshold", "5")]).unwrap_err();
    match &err {
        Error::UnknownOption {
            connector,
            option,
            suggestion,
        } => {
            assert_eq!(connector, "pubsub");
            assert_eq!(option, "batch_element_count_treshold");
            assert_eq!(suggestion.as_deref(), Some("batch_element_count_threshold"));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string()
            .contains("did you mean 'batch_element_count_threshold'"),
        "{err}"
    );
}

#[test]
fn rejects_an_option_of_another_connector() {
    let err = validate_names(
        gcp_sql::connectors::pubsub::KIND,
        &raw(&[("row_key", "id")]),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::UnknownOption { ref option, .. } if option == "row_key"),
        "{err}"
    );
    let err = validate_names(
        gcp_sql::connectors::bigtable::KIND,
        &raw(&[("channel_pool_size", "2")]),
    )
    .unwrap_err();
    assert!(matches!(err, Error::UnknownOption { .. }), "{err}");
}

#[test]
fn rejects_topic_given_twice_as_topic_and_format_topic() {
    let err = RawOptions::from_pairs([
        ("topic".to_string(), "projects/a/topics/one".to_string()),
        (
            "format.topic".to_string(),
            "projects/a/topics/two".to_string(),
        ),
    ])
    .unwrap_err();
    assert!(
        matches!(err, Error::DuplicateOption { ref option } if option == "topic"),
        "{err}"
    );
}

#[test]
fn accepts_format_prefixed_and_upper_case_names() {
    let r = raw(&[
        ("format.MAX_IN_FLIGHT_MESSAGES", "7"),
        ("Format.Format", "raw"),
    ]);
    let o = PubSubSinkOptions::from_raw_with_env(Some(TOPIC), &r, &no_env).unwrap();
    assert_eq!(o.publisher.max_in_flight_messages(), 7);
    assert_eq!(o.mapping.format, PayloadFormat::Raw);
}

#[test]
fn rejects_pubsub_sink_without_destination() {
    missing(
        PubSubSinkOptions::from_raw_with_env(None, &raw(&[]), &no_env),
        "topic",
    );
    missing(
        PubSubSinkOptions::from_raw_with_env(Some(""), &raw(&[("project", "demo")]), &no_env),
        "topic",
    );
}

#[test]
fn rejects_cloud_tasks_sink_without_destination() {
    missing(
        CloudTasksSinkOptions::from_raw_with_env(
            Some("  "),
            &raw(&[("url", "https://x.example.com")]),
            &no_env,
        ),
        "queue",
    );
}

#[test]
fn rejects_bigtable_sink_without_destination() {
    missing(
        BigtableSinkOptions::from_raw_with_env(None, &raw(&[("row_key", "id")]), &no_env),
        "table",
    );
}

#[test]
fn accepts_a_per_row_destination_column_instead_of_a_fixed_one() {
    let o = PubSubSinkOptions::from_raw_with_env(
        Some(""),
        &raw(&[("topic_column", "t"), ("project", "demo")]),
        &no_env,
    )
    .unwrap();
    assert_eq!(o.topic, None);
    assert_eq!(
        o.resolve_topic(Some("orders")).unwrap(),
        "projects/demo/topics/orders"
    );
    assert!(o.resolve_topic(None).is_err());
    let o = CloudTasksSinkOptions::from_raw_with_env(
        None,
        &raw(&[("queue_column", "q"), ("url_column", "u")]),
        &no_env,
    )
    .unwrap();
    assert_eq!(o.resolve_queue(Some(QUEUE)).unwrap(), QUEUE);
    let o = BigtableSinkOptions::from_raw_with_env(
        None,
        &raw(&[("table_column", "t"), ("row_key", "id")]),
        &no_env,
    )
    .unwrap();
    assert_eq!(o.resolve_table(Some(TABLE), None).unwrap(), TABLE);
}

#[test]
fn rejects_fixed_destination_together_with_destination_column() {
    invalid(pubsub(&[("topic_column", "t")]), "topic_column");
    invalid(tasks(&[("queue_column", "q")]), "queue_column");
    invalid(bigtable(&[("table_column", "t")]), "table_column");
}

#[test]
fn rejects_location_that_conflicts_with_topic_option() {
    let rule = invalid(pubsub(&[("topic", "projects/demo/topics/other")]), "topic");
    assert!(rule.contains("LOCATION") && rule.contains(TOPIC), "{rule}");
}

#[test]
fn rejects_location_that_conflicts_with_queue_or_table_option() {
    invalid(
        tasks(&[("queue", "projects/demo/locations/us-central1/queues/other")]),
        "queue",
    );
    invalid(
        bigtable(&[("table", "projects/demo/instances/main/tables/other")]),
        "table",
    );
}

#[test]
fn accepts_location_and_option_that_name_the_same_topic() {
    let o = pubsub(&[("topic", "clicks"), ("project", "demo")]).unwrap();
    assert_eq!(o.topic.as_deref(), Some(TOPIC));
}

#[test]
fn resolves_short_ids_with_project_location_and_instance() {
    let o = PubSubSinkOptions::from_raw_with_env(
        None,
        &raw(&[("topic", "clicks"), ("project", "demo")]),
        &no_env,
    )
    .unwrap();
    assert_eq!(o.topic.as_deref(), Some(TOPIC));
    let o = CloudTasksSinkOptions::from_raw_with_env(
        Some("jobs"),
        &raw(&[
            ("project", "demo"),
            ("location", "us-central1"),
            ("url", "http://localhost:8080/"),
        ]),
        &no_env,
    )
    .unwrap();
    assert_eq!(o.queue.as_deref(), Some(QUEUE));
    let o = BigtableSinkOptions::from_raw_with_env(
        None,
        &raw(&[
            ("table", "events"),
            ("project", "demo"),
            ("instance", "main"),
            ("row_key", "id"),
        ]),
        &no_env,
    )
    .unwrap();
    assert_eq!(o.table.as_deref(), Some(TABLE));
}

#[test]
fn rejects_short_ids_without_their_parent() {
    let rule = invalid(
        PubSubSinkOptions::from_raw_with_env(None, &raw(&[("topic", "clicks")]), &no_env),
        "topic",
    );
    assert!(rule.contains("project"), "{rule}");
    let rule = match CloudTasksSinkOptions::from_raw_with_env(
        Some("jobs"),
        &raw(&[("project", "demo"), ("url", "https://x.example.com")]),
        &no_env,
    ) {
        Err(Error::InvalidOption { option, rule, .. }) if option == "LOCATION" => rule,
        other => panic!("{other:?}"),
    };
    assert!(rule.contains("location"), "{rule}");
    invalid(
        BigtableSinkOptions::from_raw_with_env(
            None,
            &raw(&[("table", "events"), ("project", "demo"), ("row_key", "id")]),
            &no_env,
        ),
        "table",
    );
}

#[test]
fn rejects_topic_ids_the_service_refuses() {
    invalid(
        PubSubSinkOptions::from_raw_with_env(
            None,
            &raw(&[("topic", "ab"), ("project", "demo")]),
            &no_env,
        ),
        "topic",
    );
    invalid(
        PubSubSinkOptions::from_raw_with_env(
            None,
            &raw(&[("topic", "projects/demo/subscriptions/abc")]),
            &no_env,
        ),
        "topic",
    );
}

// ---------------------------------------------------------------------------------------------
// Connection: emulator, endpoint, connector, failure policy
// ---------------------------------------------------------------------------------------------

#[test]
fn reads_emulator_host_from_the_environment_variable() {
    let env = |k: &str| (k == "PUBSUB_EMULATOR_HOST").then(|| "localhost:8085".to_string());
    let o = PubSubSinkOptions::from_raw_with_env(Some(TOPIC), &raw(&[]), &env).unwrap();
    let e = o.shared.connection.emulator.unwrap();
    assert_eq!(e.host, "localhost:8085");
    assert_eq!(e.source, EmulatorSource::EnvVar("PUBSUB_EMULATOR_HOST"));
    assert!(e.describe().contains("PUBSUB_EMULATOR_HOST"));
}

#[test]
fn prefers_emulator_host_option_over_the_environment() {
    let env = |_: &str| Some("localhost:1111".to_string());
    let o = PubSubSinkOptions::from_raw_with_env(
        Some(TOPIC),
        &raw(&[("emulator_host", "localhost:2222")]),
        &env,
    )
    .unwrap();
    let e = o.shared.connection.emulator.unwrap();
    assert_eq!(
        (e.host.as_str(), e.source),
        ("localhost:2222", EmulatorSource::Option)
    );
}

#[test]
fn reads_bigtable_emulator_host_from_the_real_process_environment() {
    // The one test in this binary that reads the process environment; every other test passes
    // its own lookup, so setting the variable here cannot change another test's result.
    // SAFETY: no other thread of this test binary reads or writes BIGTABLE_EMULATOR_HOST.
    unsafe { std::env::set_var("BIGTABLE_EMULATOR_HOST", "127.0.0.1:8086") };
    let o = BigtableSinkOptions::from_raw(Some(TABLE), &raw(&[("row_key", "id")])).unwrap();
    // SAFETY: as above.
    unsafe { std::env::remove_var("BIGTABLE_EMULATOR_HOST") };
    let e = o.shared.connection.emulator.unwrap();
    assert_eq!(
        (e.host.as_str(), e.source),
        (
            "127.0.0.1:8086",
            EmulatorSource::EnvVar("BIGTABLE_EMULATOR_HOST")
        )
    );
}

#[test]
fn rejects_malformed_emulator_host_from_the_environment_naming_the_variable() {
    let env = |_: &str| Some("localhost".to_string());
    let err = PubSubSinkOptions::from_raw_with_env(Some(TOPIC), &raw(&[]), &env).unwrap_err();
    assert!(err.to_string().contains("PUBSUB_EMULATOR_HOST"), "{err}");
}

#[test]
fn rejects_emulator_host_together_with_endpoint() {
    invalid(
        pubsub(&[
            ("emulator_host", "localhost:8085"),
            ("endpoint", "https://pubsub.googleapis.com"),
        ]),
        "emulator_host",
    );
}

#[test]
fn rejects_endpoint_without_scheme() {
    invalid(
        pubsub(&[("endpoint", "pubsub.googleapis.com:443")]),
        "endpoint",
    );
}

#[test]
fn rejects_http_endpoint_with_credentials_file_on_every_connector() {
    let pairs = [
        ("endpoint", "http://private.googleapis.com"),
        ("credentials_file", "/etc/gcp/writer-key.json"),
    ];
    for rule in [
        invalid(pubsub(&pairs), "endpoint"),
        invalid(tasks(&pairs), "endpoint"),
        invalid(bigtable(&pairs), "endpoint"),
    ] {
        assert!(rule.contains("must be https://"), "{rule}");
        assert!(rule.contains("emulator_host"), "{rule}");
    }
}

#[test]
fn rejects_http_endpoint_without_credentials_even_on_the_loopback() {
    // Without `credentials_file` the channel would still carry Application Default
    // Credentials; a local emulator is `emulator_host`, which carries none.
    for endpoint in ["http://127.0.0.1:8085", "http://localhost:8085"] {
        let rule = invalid(pubsub(&[("endpoint", endpoint)]), "endpoint");
        assert!(rule.contains("emulator_host"), "{rule}");
    }
}

#[test]
fn rejects_endpoint_with_a_user_name_or_password() {
    let err = pubsub(&[("endpoint", "https://user:hunter2@pubsub.googleapis.com")]).unwrap_err();
    let rule = match &err {
        Error::InvalidOption { option, rule, .. } if option == "endpoint" => rule.clone(),
        other => panic!("expected an invalid endpoint, got {other:?}"),
    };
    assert!(rule.contains("no user name or password"), "{rule}");
}

#[test]
fn accepts_https_endpoint_with_credentials_file() {
    let o = pubsub(&[
        ("endpoint", "https://pubsub.googleapis.com/"),
        ("credentials_file", "/etc/gcp/writer-key.json"),
    ])
    .unwrap();
    assert_eq!(
        o.shared.connection.endpoint.as_deref(),
        Some("https://pubsub.googleapis.com")
    );
    assert!(o.shared.connection.emulator.is_none());
}

#[test]
fn accepts_loopback_emulator_hosts() {
    for host in [
        "localhost:8085",
        "127.0.0.1:8085",
        "127.1.2.3:9",
        "[::1]:8085",
    ] {
        let o = pubsub(&[("emulator_host", host)]).unwrap();
        assert_eq!(o.shared.connection.emulator.unwrap().host, host);
    }
}

#[test]
fn rejects_remote_emulator_host_without_allow_remote_emulator() {
    for host in ["10.0.0.5:8085", "pubsub-emulator:8085", "0.0.0.0:8085"] {
        let rule = invalid(pubsub(&[("emulator_host", host)]), "emulator_host");
        assert!(rule.contains("loopback"), "{rule}");
        assert!(rule.contains("allow_remote_emulator"), "{rule}");
        invalid(tasks(&[("emulator_host", host)]), "emulator_host");
        invalid(bigtable(&[("emulator_host", host)]), "emulator_host");
    }
    // `false` is the default, said out loud.
    invalid(
        pubsub(&[
            ("emulator_host", "10.0.0.5:8085"),
            ("allow_remote_emulator", "false"),
        ]),
        "emulator_host",
    );
}

#[test]
fn accepts_remote_emulator_host_with_allow_remote_emulator() {
    let pairs = [
        ("emulator_host", "pubsub-emulator:8085"),
        ("allow_remote_emulator", "true"),
    ];
    let o = pubsub(&pairs).unwrap();
    assert_eq!(
        o.shared.connection.emulator.unwrap().host,
        "pubsub-emulator:8085"
    );
    assert!(tasks(&pairs).unwrap().shared.connection.emulator.is_some());
    assert!(
        bigtable(&pairs)
            .unwrap()
            .shared
            .connection
            .emulator
            .is_some()
    );
    // Without an emulator the option changes nothing.
    assert!(
        pubsub(&[("allow_remote_emulator", "true")])
            .unwrap()
            .shared
            .connection
            .emulator
            .is_none()
    );
}

#[test]
fn rejects_allow_remote_emulator_that_is_not_a_boolean() {
    invalid(
        pubsub(&[("allow_remote_emulator", "yes please")]),
        "allow_remote_emulator",
    );
}

#[test]
fn rejects_remote_emulator_host_from_the_environment_naming_the_variable() {
    let env = |k: &str| (k == "PUBSUB_EMULATOR_HOST").then(|| "10.1.2.3:8085".to_string());
    let rule = invalid(
        PubSubSinkOptions::from_raw_with_env(Some(TOPIC), &raw(&[]), &env),
        "emulator_host (from environment variable PUBSUB_EMULATOR_HOST)",
    );
    assert!(rule.contains("allow_remote_emulator"), "{rule}");
    let env = |k: &str| (k == "CLOUD_TASKS_EMULATOR_HOST").then(|| "tasks:8123".to_string());
    invalid(
        CloudTasksSinkOptions::from_raw_with_env(
            Some(QUEUE),
            &raw(&[("url", "https://worker.example.com/run")]),
            &env,
        ),
        "emulator_host (from environment variable CLOUD_TASKS_EMULATOR_HOST)",
    );
    // An explicit endpoint turns the variable off, so it is not checked either.
    assert!(
        PubSubSinkOptions::from_raw_with_env(
            Some(TOPIC),
            &raw(&[("endpoint", "https://pubsub.googleapis.com")]),
            &|_: &str| Some("10.1.2.3:8085".to_string()),
        )
        .is_ok()
    );
}

#[test]
fn accepts_remote_emulator_host_from_the_environment_with_allow_remote_emulator() {
    let env = |k: &str| (k == "BIGTABLE_EMULATOR_HOST").then(|| "bigtable:8086".to_string());
    let o = BigtableSinkOptions::from_raw_with_env(
        Some(TABLE),
        &raw(&[("row_key", "id"), ("allow_remote_emulator", "true")]),
        &env,
    )
    .unwrap();
    let e = o.shared.connection.emulator.unwrap();
    assert_eq!(
        (e.host.as_str(), e.source),
        (
            "bigtable:8086",
            EmulatorSource::EnvVar("BIGTABLE_EMULATOR_HOST")
        )
    );
}

#[test]
fn rejects_connector_option_naming_another_connector() {
    invalid(pubsub(&[("connector", "bigtable")]), "connector");
    assert!(pubsub(&[("connector", "PUBSUB")]).is_ok());
}

#[test]
fn reads_failure_policy() {
    assert_eq!(
        pubsub(&[]).unwrap().shared.failure_policy,
        FailurePolicy::Fail
    );
    assert_eq!(
        pubsub(&[("failure_policy", "drop")])
            .unwrap()
            .shared
            .failure_policy,
        FailurePolicy::Drop
    );
    invalid(pubsub(&[("failure_policy", "skip")]), "failure_policy");
}

// ---------------------------------------------------------------------------------------------
// Mapping options
// ---------------------------------------------------------------------------------------------

#[test]
fn pubsub_mapping_defaults_are_by_name_not_explicit() {
    let m = pubsub(&[]).unwrap().mapping;
    assert_eq!(
        (m.data_column.name.as_str(), m.data_column.explicit),
        ("data", false)
    );
    assert_eq!(m.attributes_column.name, "attributes");
    assert_eq!(m.ordering_key_column.name, "ordering_key");
    assert_eq!(m.format, PayloadFormat::Json);
    let m = pubsub(&[("data_column", "payload"), ("attribute_columns", "a, b")])
        .unwrap()
        .mapping;
    assert!(m.data_column.explicit);
    assert_eq!(m.attribute_columns, ["a", "b"]);
}

#[test]
fn accepts_raw_format_and_attribute_columns() {
    let m = pubsub(&[("format", "raw"), ("attribute_columns", "region")])
        .unwrap()
        .mapping;
    assert_eq!(m.format, PayloadFormat::Raw);
    assert_eq!(m.attribute_columns, ["region"]);
    assert_eq!(
        tasks(&[("format", "RAW")]).unwrap().mapping.format,
        PayloadFormat::Raw
    );
}

#[test]
fn rejects_an_unknown_format_and_a_non_boolean_auto_create() {
    // `avro` and `protobuf` are Pub/Sub formats now (docs/pubsub.md); an unknown word is still
    // refused, naming the words that exist.
    let rule = invalid(pubsub(&[("format", "xml")]), "format");
    assert!(rule.contains("'json', 'raw'"), "{rule}");
    invalid(tasks(&[("format", "xml")]), "format");
    invalid(
        bigtable(&[("auto_create_table", "maybe")]),
        "auto_create_table",
    );
    invalid(pubsub(&[("auto_create_topic", "yes")]), "auto_create_topic");
}

#[test]
fn rejects_repeated_attribute_column() {
    invalid(
        pubsub(&[("attribute_columns", "a,b,a")]),
        "attribute_columns",
    );
}

#[test]
fn parses_cloud_tasks_headers_and_method() {
    let o = tasks(&[
        ("headers", "Content-Type: application/json; X-A: b"),
        ("http_method", "patch"),
    ])
    .unwrap();
    assert_eq!(
        o.mapping.headers,
        [
            ("Content-Type".to_string(), "application/json".to_string()),
            ("X-A".to_string(), "b".to_string())
        ]
    );
    assert_eq!(o.mapping.http_method, HttpMethod::Patch);
    invalid(tasks(&[("http_method", "FETCH")]), "http_method");
    invalid(tasks(&[("headers", "X-A: 1; x-a: 2")]), "headers");
}

#[test]
fn rejects_cloud_tasks_sink_without_url() {
    missing(
        CloudTasksSinkOptions::from_raw_with_env(Some(QUEUE), &raw(&[]), &no_env),
        "url",
    );
    invalid(tasks(&[("url_column", "u")]), "url_column");
    invalid(
        CloudTasksSinkOptions::from_raw_with_env(Some(QUEUE), &raw(&[("url", "ftp://x")]), &no_env),
        "url",
    );
}

#[test]
fn accepts_dispatch_deadline_from_15_seconds_to_30_minutes() {
    assert_eq!(
        tasks(&[("dispatch_deadline", "15s")])
            .unwrap()
            .mapping
            .dispatch_deadline,
        Some(Duration::from_secs(15))
    );
    assert_eq!(
        tasks(&[("dispatch_deadline", "30m")])
            .unwrap()
            .mapping
            .dispatch_deadline,
        Some(Duration::from_secs(1800))
    );
}

#[test]
fn rejects_dispatch_deadline_outside_15_seconds_to_30_minutes() {
    invalid(
        tasks(&[("dispatch_deadline", "14999ms")]),
        "dispatch_deadline",
    );
    invalid(
        tasks(&[("dispatch_deadline", "30m 1ms")]),
        "dispatch_deadline",
    );
}

#[test]
fn rejects_oidc_together_with_oauth() {
    let rule = invalid(
        tasks(&[
            (
                "oidc_service_account_email",
                "a@demo.iam.gserviceaccount.com",
            ),
            (
                "oauth_service_account_email",
                "b@demo.iam.gserviceaccount.com",
            ),
        ]),
        "oauth_service_account_email",
    );
    assert!(rule.contains("oidc"), "{rule}");
    invalid(
        tasks(&[("oidc_audience", "https://x"), ("oauth_scope", "s")]),
        "oauth_scope",
    );
}

#[test]
fn rejects_token_details_without_their_service_account() {
    invalid(tasks(&[("oidc_audience", "https://x")]), "oidc_audience");
    invalid(
        tasks(&[(
            "oauth_scope",
            "https://www.googleapis.com/auth/cloud-platform",
        )]),
        "oauth_scope",
    );
    invalid(
        tasks(&[("oidc_service_account_email", "not-an-email")]),
        "oidc_service_account_email",
    );
}

#[test]
fn accepts_oidc_with_audience() {
    let o = tasks(&[
        (
            "oidc_service_account_email",
            "a@demo.iam.gserviceaccount.com",
        ),
        ("oidc_audience", "https://x"),
    ])
    .unwrap();
    assert_eq!(
        o.mapping.auth,
        Some(TaskAuth::Oidc {
            service_account_email: "a@demo.iam.gserviceaccount.com".into(),
            audience: Some("https://x".into())
        })
    );
}

#[test]
fn rejects_body_column_with_a_method_without_body() {
    let rule = invalid(
        tasks(&[("body_column", "b"), ("http_method", "GET")]),
        "body_column",
    );
    assert!(rule.contains("GET"), "{rule}");
    assert!(tasks(&[("body_column", "b"), ("http_method", "PUT")]).is_ok());
}

#[test]
fn rejects_bigtable_sink_without_row_key() {
    missing(
        BigtableSinkOptions::from_raw_with_env(Some(TABLE), &raw(&[]), &no_env),
        "row_key",
    );
}

#[test]
fn reads_bigtable_mapping() {
    let o = bigtable(&[
        ("column_family", "d"),
        ("row_key_delimiter", "|"),
        ("null_handling", "DELETE"),
        ("auto_create_table", "true"),
    ])
    .unwrap();
    assert_eq!(o.mapping.column_family, "d");
    assert_eq!(o.mapping.row_key_delimiter, "|");
    assert_eq!(o.mapping.null_handling, NullHandling::Delete);
    assert!(o.auto_create_table);
    let d = bigtable(&[]).unwrap().mapping;
    assert_eq!(
        (
            d.column_family.as_str(),
            d.row_key_delimiter.as_str(),
            d.null_handling
        ),
        ("cf", "#", NullHandling::Ignore)
    );
}

#[test]
fn reads_bigtable_write_mode_and_op_column() {
    use gcp_sql::connectors::bigtable::options::WriteMode;
    for (text, mode) in [
        ("upsert", WriteMode::Upsert),
        ("REPLACE_ROW", WriteMode::ReplaceRow),
        ("insert_if_absent", WriteMode::InsertIfAbsent),
        ("increment", WriteMode::Increment),
        ("add_to_cell", WriteMode::AddToCell),
    ] {
        assert_eq!(
            bigtable(&[("write_mode", text)])
                .unwrap()
                .mapping
                .write_mode,
            mode
        );
    }
    let d = bigtable(&[]).unwrap().mapping;
    assert_eq!((d.write_mode, d.op_column), (WriteMode::Upsert, None));
    let o = bigtable(&[("op_column", "op"), ("write_mode", "replace_row")]).unwrap();
    assert_eq!(o.mapping.op_column.as_deref(), Some("op"));
    assert!(o.mapping.non_cell_columns().contains(&"op"));
}

#[test]
fn rejects_unknown_write_mode_and_op_column_with_a_one_row_mode() {
    let rule = invalid(bigtable(&[("write_mode", "merge")]), "write_mode");
    assert!(rule.contains("insert_if_absent"), "{rule}");
    invalid(bigtable(&[("write_mode", "")]), "write_mode");
    for mode in ["insert_if_absent", "increment", "add_to_cell"] {
        let rule = invalid(
            bigtable(&[("op_column", "op"), ("write_mode", mode)]),
            "op_column",
        );
        assert!(rule.contains("write_mode") && rule.contains(mode), "{rule}");
    }
}

#[test]
fn accepts_a_lookup_cache_of_rows_for_a_ttl_and_reads_it_off_by_default() {
    use gcp_sql::connectors::bigtable::lookup::CacheSettings;
    assert_eq!(bigtable(&[]).unwrap().lookup_cache, None);
    assert_eq!(
        bigtable(&[("lookup_cache_rows", "0"), ("lookup_cache_ttl", "1m")])
            .unwrap()
            .lookup_cache,
        None
    );
    assert_eq!(
        bigtable(&[("lookup_cache_rows", "1000")])
            .unwrap()
            .lookup_cache,
        Some(CacheSettings {
            rows: 1000,
            ttl: Duration::from_secs(60)
        })
    );
    assert_eq!(
        bigtable(&[
            ("lookup_cache_rows", "10000000"),
            ("lookup_cache_ttl", "1ms")
        ])
        .unwrap()
        .lookup_cache,
        Some(CacheSettings {
            rows: 10_000_000,
            ttl: Duration::from_millis(1)
        })
    );
}

#[test]
fn rejects_a_negative_or_huge_lookup_cache_and_a_ttl_under_a_millisecond() {
    invalid(
        bigtable(&[("lookup_cache_rows", "-1")]),
        "lookup_cache_rows",
    );
    invalid(
        bigtable(&[("lookup_cache_rows", "10000001")]),
        "lookup_cache_rows",
    );
    invalid(
        bigtable(&[("lookup_cache_rows", "many")]),
        "lookup_cache_rows",
    );
    invalid(
        bigtable(&[("lookup_cache_rows", "10"), ("lookup_cache_ttl", "0s")]),
        "lookup_cache_ttl",
    );
    invalid(
        bigtable(&[("lookup_cache_ttl", "soon")]),
        "lookup_cache_ttl",
    );
}

#[test]
fn rejects_invalid_column_family_name() {
    invalid(bigtable(&[("column_family", "has space")]), "column_family");
    invalid(bigtable(&[("column_family", "")]), "column_family");
}

#[test]
fn rejects_instance_that_disagrees_with_the_full_table_name() {
    invalid(
        bigtable(&[("instance", "other"), ("project", "demo")]),
        "instance",
    );
    assert!(bigtable(&[("instance", "main"), ("project", "demo")]).is_ok());
}

#[test]
fn rejects_instance_column_beside_a_full_table_name() {
    invalid(bigtable(&[("instance_column", "i")]), "instance_column");
}

// ---------------------------------------------------------------------------------------------
// Schema validation
// ---------------------------------------------------------------------------------------------

fn schema(fields: &[(&str, DataType)]) -> Schema {
    Schema::new(
        fields
            .iter()
            .map(|(n, t)| Field::new(*n, t.clone(), true))
            .collect::<Vec<_>>(),
    )
}

#[test]
fn accepts_bigtable_schema_with_key_timestamp_and_cells() {
    let o = BigtableSinkOptions::from_raw_with_env(
        Some(TABLE),
        &raw(&[("row_key", "user_id, region"), ("timestamp_column", "ts")]),
        &no_env,
    )
    .unwrap();
    let s = schema(&[
        ("user_id", DataType::Int64),
        ("region", DataType::Utf8View),
        ("ts", DataType::Timestamp(TimeUnit::Microsecond, None)),
        ("clicks", DataType::Int64),
    ]);
    o.validate_schema(&s).unwrap();
}

#[test]
fn rejects_bigtable_schema_with_missing_or_mistyped_key() {
    let o = bigtable(&[]).unwrap();
    let rule = schema_err(
        o.validate_schema(&schema(&[("other", DataType::Utf8)])),
        "id",
    );
    assert!(rule.contains("row_key"), "{rule}");
    schema_err(
        o.validate_schema(&schema(&[("id", DataType::Float64), ("v", DataType::Utf8)])),
        "id",
    );
}

#[test]
fn rejects_bigtable_schema_with_no_cell_left() {
    let o = bigtable(&[]).unwrap();
    let rule = schema_err(o.validate_schema(&schema(&[("id", DataType::Utf8)])), "id");
    assert!(rule.contains("cell"), "{rule}");
}

#[test]
fn rejects_bigtable_timestamp_and_destination_columns_of_the_wrong_type() {
    let o = bigtable(&[("timestamp_column", "ts")]).unwrap();
    schema_err(
        o.validate_schema(&schema(&[
            ("id", DataType::Utf8),
            ("ts", DataType::Utf8),
            ("v", DataType::Int32),
        ])),
        "ts",
    );
    let o = BigtableSinkOptions::from_raw_with_env(
        None,
        &raw(&[("table_column", "t"), ("row_key", "id")]),
        &no_env,
    )
    .unwrap();
    schema_err(
        o.validate_schema(&schema(&[
            ("id", DataType::Utf8),
            ("t", DataType::Int32),
            ("v", DataType::Int32),
        ])),
        "t",
    );
}

#[test]
fn accepts_cloud_tasks_schema_with_typed_columns() {
    let map = DataType::Map(
        Arc::new(Field::new(
            "entries",
            DataType::Struct(Fields::from(vec![
                Field::new("key", DataType::Utf8, false),
                Field::new("value", DataType::Utf8, true),
            ])),
            false,
        )),
        false,
    );
    let o = CloudTasksSinkOptions::from_raw_with_env(
        Some(QUEUE),
        &raw(&[
            ("url_column", "u"),
            ("body_column", "b"),
            ("schedule_time_column", "at"),
            ("headers_column", "h"),
            ("task_name_column", "n"),
        ]),
        &no_env,
    )
    .unwrap();
    let s = schema(&[
        ("u", DataType::Utf8View),
        ("b", DataType::Binary),
        (
            "at",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
        ),
        ("h", map),
        ("n", DataType::LargeUtf8),
    ]);
    o.validate_schema(&s).unwrap();
}

#[test]
fn rejects_cloud_tasks_schema_with_missing_url_column_or_wrong_types() {
    let o = CloudTasksSinkOptions::from_raw_with_env(
        Some(QUEUE),
        &raw(&[("url_column", "u"), ("schedule_time_column", "at")]),
        &no_env,
    )
    .unwrap();
    let rule = schema_err(
        o.validate_schema(&schema(&[(
            "at",
            DataType::Timestamp(TimeUnit::Second, None),
        )])),
        "u",
    );
    assert!(rule.contains("url_column"), "{rule}");
    schema_err(
        o.validate_schema(&schema(&[
            ("u", DataType::Int64),
            ("at", DataType::Timestamp(TimeUnit::Second, None)),
        ])),
        "u",
    );
    schema_err(
        o.validate_schema(&schema(&[("u", DataType::Utf8), ("at", DataType::Utf8)])),
        "at",
    );
}

#[test]
fn rejects_raw_format_with_several_payload_columns() {
    let o = tasks(&[("format", "raw")]).unwrap();
    invalid(
        o.validate_schema(&schema(&[("a", DataType::Utf8), ("b", DataType::Utf8)])),
        "format",
    );
    schema_err(o.validate_schema(&schema(&[("a", DataType::Int32)])), "a");
    o.validate_schema(&schema(&[("a", DataType::Binary)]))
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Coverage: every option parses, has boundary cases and its documented default; docs are current
// ---------------------------------------------------------------------------------------------

/// Options that need a companion to be valid on their own.
fn companions(name: &str) -> Vec<(&'static str, &'static str)> {
    match name {
        "oidc_audience" => vec![(
            "oidc_service_account_email",
            "a@demo.iam.gserviceaccount.com",
        )],
        "oauth_scope" => vec![(
            "oauth_service_account_email",
            "a@demo.iam.gserviceaccount.com",
        )],
        "emulator_host" | "channel_pool_size" | "endpoint" => vec![],
        "body_column" => vec![("http_method", "POST")],
        _ => vec![],
    }
}

#[test]
fn every_registered_option_is_accepted_by_its_connector_with_its_example() {
    for kind in gcp_sql::connectors::registry::kinds() {
        for spec in options_for(kind) {
            let mut pairs: Vec<(&str, &str)> = companions(spec.name);
            let location = match (kind.name(), spec.name) {
                ("pubsub", "topic_column") => None,
                ("cloud_tasks", "queue_column") => None,
                ("bigtable", "table_column" | "instance_column") => None,
                ("pubsub", "topic") => None,
                ("cloud_tasks", "queue") => None,
                ("bigtable", "table") => None,
                ("pubsub", _) => Some(TOPIC),
                ("cloud_tasks", _) => Some(QUEUE),
                ("bigtable", _) => Some(TABLE),
                (other, _) => panic!("no case for connector {other}"),
            };
            if spec.name == "instance_column" {
                pairs.push(("table_column", "t"));
            }
            if spec.name == "instance" {
                pairs.push(("project", "demo"));
            }
            // A dead-letter destination is taken only under the policy that uses it.
            if matches!(spec.name, "dead_letter_topic" | "dead_letter_path") {
                pairs.push(("failure_policy", "dead_letter"));
            }
            let example =
                if kind == gcp_sql::connectors::cloud_tasks::KIND && spec.name == "connector" {
                    "cloud_tasks"
                } else {
                    spec.example
                };
            let example = if kind == gcp_sql::connectors::bigtable::KIND && spec.name == "connector"
            {
                "bigtable"
            } else {
                example
            };
            pairs.push((spec.name, example));
            if kind == gcp_sql::connectors::cloud_tasks::KIND
                && !matches!(spec.name, "url" | "url_column")
            {
                pairs.push(("url", "https://worker.example.com/run"));
            }
            if kind == gcp_sql::connectors::bigtable::KIND && spec.name != "row_key" {
                pairs.push(("row_key", "id"));
            }
            // The schema options of the Pub/Sub and Cloud Tasks sinks belong to `format =
            // 'avro'` / 'protobuf', which needs a schema.
            let schema_capable = kind == gcp_sql::connectors::pubsub::KIND
                || kind == gcp_sql::connectors::cloud_tasks::KIND;
            if schema_capable && spec.name.starts_with("schema") {
                pairs.push(("format", "avro"));
                if spec.name == "schema_encoding" {
                    pairs.push((
                        "schema",
                        gcp_sql::connectors::pubsub::sink::options::SCHEMA.example,
                    ));
                }
            }
            if schema_capable && spec.name == "format" {
                pairs.push((
                    "schema",
                    gcp_sql::connectors::pubsub::sink::options::SCHEMA.example,
                ));
            }
            let r = raw(&pairs);
            let result = match kind.name() {
                "pubsub" => PubSubSinkOptions::from_raw_with_env(location, &r, &no_env).map(|_| ()),
                "cloud_tasks" => {
                    CloudTasksSinkOptions::from_raw_with_env(location, &r, &no_env).map(|_| ())
                }
                "bigtable" => {
                    BigtableSinkOptions::from_raw_with_env(location, &r, &no_env).map(|_| ())
                }
                other => panic!("no case for connector {other}"),
            };
            assert!(
                result.is_ok(),
                "{kind}: option {} = '{}' refused: {:?}",
                spec.name,
                example,
                result
            );
        }
    }
}

/// The files under `tests/` that hold boundary cases, read from inside the repository.
fn boundary_case_sources() -> Vec<(String, String)> {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut files = vec![tests.join("options.rs")];
    let mut slt: Vec<_> = std::fs::read_dir(tests.join("slt"))
        .expect("tests/slt is part of the repository")
        .map(|e| e.expect("a readable entry of tests/slt").path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    slt.sort();
    files.extend(slt);
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            (p.display().to_string(), text)
        })
        .collect()
}

/// Whether `text` sets the option `name`: as SQL (`name = `, `'name'`), as a builder call
/// (`.name(`) or as a Rust option pair (`"name"`).
fn sets_option(text: &str, name: &str) -> bool {
    [
        format!("{name} ="),
        format!("'{name}'"),
        format!(".{name}("),
        format!("\"{name}\""),
    ]
    .iter()
    .any(|p| text.contains(p.as_str()))
}

/// The passing and the failing cases of the repository's tests, as text: each test function of
/// `tests/options.rs` is passing when its name starts with `accepts_`, `reads_` or `warns_` and
/// failing when it starts with `rejects_`; each `.slt` record is passing when it is a
/// `statement ok` and failing when it is a `statement error`.
fn boundary_cases() -> (Vec<String>, Vec<String>) {
    let (mut passing, mut failing) = (Vec::new(), Vec::new());
    for (path, text) in boundary_case_sources() {
        if path.ends_with(".rs") {
            for case in text.split("#[test]").skip(1) {
                let name = case.trim_start().trim_start_matches("fn ");
                if ["accepts_", "reads_", "warns_"]
                    .iter()
                    .any(|p| name.starts_with(p))
                {
                    passing.push(case.to_string());
                } else if name.starts_with("rejects_") {
                    failing.push(case.to_string());
                }
            }
        } else {
            for record in text.split("\n\n") {
                let record = record.trim_start();
                if record.starts_with("statement ok") {
                    passing.push(record.to_string());
                } else if record.starts_with("statement error") {
                    failing.push(record.to_string());
                }
            }
        }
    }
    (passing, failing)
}

/// Whether an option has values that must be refused: a value-level bound, or a type that not
/// every text has.
fn can_be_refused(spec: &OptionSpec) -> bool {
    spec.bound != Bound::None
        || matches!(
            spec.kind,
            OptionKind::Int
                | OptionKind::Float
                | OptionKind::Duration
                | OptionKind::Bool
                | OptionKind::Enum(_)
                | OptionKind::ColumnList
                | OptionKind::Headers
        )
}

#[test]
fn every_option_that_can_be_refused_has_a_passing_and_a_failing_boundary_case() {
    let (passing, failing) = boundary_cases();
    assert!(
        passing.len() > 100 && failing.len() > 100,
        "found {} passing and {} failing cases",
        passing.len(),
        failing.len()
    );
    let mut missing = Vec::new();
    for kind in gcp_sql::connectors::registry::kinds() {
        for spec in options_for(kind).filter(|s| can_be_refused(s)) {
            if !passing.iter().any(|c| sets_option(c, spec.name)) {
                missing.push(format!("{kind}: {} has no passing case", spec.name));
            }
            if !failing.iter().any(|c| sets_option(c, spec.name)) {
                missing.push(format!("{kind}: {} has no failing case", spec.name));
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}

#[test]
fn every_spec_example_parses_and_passes_its_bound() {
    for kind in gcp_sql::connectors::registry::kinds() {
        for spec in options_for(kind) {
            let value = spec.parse_checked(spec.example);
            assert!(value.is_ok(), "{kind}: example of {}: {value:?}", spec.name);
        }
    }
}

/// The text that writes `default` as an option value, if it has one.
fn default_as_text(default: &DefaultValue) -> Option<String> {
    match default {
        DefaultValue::None | DefaultValue::Unset(_) => None,
        DefaultValue::Int(v) | DefaultValue::Bytes(v) => Some(v.to_string()),
        DefaultValue::Float(v) => Some(format!("{v:?}")),
        DefaultValue::Bool(v) => Some(v.to_string()),
        DefaultValue::Duration(d) => Some(format_duration(*d)),
        DefaultValue::Text(t) => Some((*t).to_string()),
        DefaultValue::JavaSdk(inner) => default_as_text(inner),
    }
}

#[test]
fn every_builder_default_equals_the_spec_default() {
    // Writing an option's documented default explicitly changes nothing: the typed default the
    // builder starts from is the value the spec documents.
    for kind in gcp_sql::connectors::registry::kinds() {
        let writer = options_for(kind).filter(|s| s.group == OptionGroup::Writer);
        for spec in writer {
            let Some(text) = default_as_text(&spec.default) else {
                continue;
            };
            let pair = [(spec.name, text.as_str())];
            let same = match kind.name() {
                "pubsub" => {
                    pubsub(&pair)
                        .ok()
                        .map(|o| (o.publisher, o.shared.failure_policy))
                        == Some((PubSubPublisherOptions::default(), FailurePolicy::Fail))
                }
                "cloud_tasks" => {
                    tasks(&pair)
                        .ok()
                        .map(|o| (o.writer, o.shared.failure_policy))
                        == Some((CloudTasksWriterOptions::default(), FailurePolicy::Fail))
                }
                "bigtable" => {
                    bigtable(&pair)
                        .ok()
                        .map(|o| (o.writer, o.shared.failure_policy))
                        == Some((BigtableWriterOptions::default(), FailurePolicy::Fail))
                }
                other => panic!("no case for connector {other}"),
            };
            assert!(same, "{kind}: {} = '{text}' is not the default", spec.name);
        }
    }
    assert_eq!(
        PubSubPublisherOptions::builder().build().unwrap(),
        PubSubPublisherOptions::default()
    );
    assert_eq!(
        CloudTasksWriterOptions::builder().build().unwrap(),
        CloudTasksWriterOptions::default()
    );
    assert_eq!(
        BigtableWriterOptions::builder().build().unwrap(),
        BigtableWriterOptions::default()
    );
}

#[test]
fn every_writer_option_is_a_builder_option_of_its_connector() {
    // The writer options of a connector are exactly its typed builder's options, plus the
    // failure policy (and its dead-letter destination) and how a statement runs (writer count, flush points: sink-level
    // choices), in the builder's declaration order.
    let builders: [(ConnectorKind, &[&OptionSpec]); 3] = [
        (
            gcp_sql::connectors::pubsub::KIND,
            PubSubPublisherOptions::specs(),
        ),
        (
            gcp_sql::connectors::cloud_tasks::KIND,
            CloudTasksWriterOptions::specs(),
        ),
        (
            gcp_sql::connectors::bigtable::KIND,
            BigtableWriterOptions::specs(),
        ),
    ];
    for (kind, specs) in builders {
        let writer: Vec<&str> = options_for(kind)
            .filter(|s| {
                s.group == OptionGroup::Writer
                    && ![
                        "failure_policy",
                        "dead_letter_topic",
                        "dead_letter_path",
                        "sink_parallelism",
                        "flush_interval",
                        "flush_rows",
                    ]
                    .contains(&s.name)
            })
            .map(|s| s.name)
            .collect();
        let builder: Vec<&str> = specs.iter().map(|s| s.name).collect();
        assert_eq!(writer, builder, "{kind}");
        assert!(builder.len() >= 9, "{kind}: {builder:?}");
        for name in builder {
            let spec = gcp_sql::connectors::catalog::lookup(kind, name)
                .unwrap_or_else(|| panic!("{kind}: builder option {name} is not accepted in SQL"));
            assert_eq!(
                spec.group,
                OptionGroup::Writer,
                "{name} should be a writer option"
            );
        }
    }
}

#[test]
fn docs_options_md_matches_the_connector_list() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/options.md");
    let expected = reference_markdown();
    if std::env::var_os("GCP_SQL_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("docs/ has a parent")).expect("create docs/");
        std::fs::write(&path, &expected).expect("write docs/options.md");
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "docs/options.md is out of date with the connector list; regenerate it with \
         `GCP_SQL_BLESS=1 cargo test --test options` and commit the result"
    );
}

#[test]
fn reference_lists_every_option_with_its_default_and_bounds() {
    let md = reference_markdown();
    for spec in gcp_sql::connectors::registry::kinds().flat_map(options_for) {
        assert!(
            md.contains(&format!("| `{}` |", spec.name)),
            "{} missing from the reference",
            spec.name
        );
    }
    assert!(md.contains("19,999"), "Bigtable batch ceiling");
    assert!(
        md.contains("Java SDK default"),
        "SDK defaults are attributed"
    );
    assert!(md.contains("64 MiB"));
}
