//! The Prometheus text exposition of the process's sink statements, encoded by
//! `prometheus-client` from the readings of [`crate::core::telemetry`].
//!
//! Each scrape reads every statement once and hands the readings to a collector; the crate
//! writes the families (`# HELP`, `# TYPE`, one line per series, `_total` on counters).

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::core::metrics::{HistogramSnapshot, LATENCY_BUCKETS};
use crate::core::telemetry::{
    InputReading, ReadinessSettings, StatementReading, global, readiness,
};

/// The `Content-Type` of [`render`]'s text: Prometheus' text format, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The labels of one series: bounded values of a declaration, never a row's.
type Labels = Vec<(&'static str, String)>;

/// The metrics of every statement the process knows ([`crate::core::telemetry::global`]) in
/// Prometheus' text format. `settings` judge the `gcp_sql_statement_ready` gauge as `/readyz`
/// does.
pub fn render(settings: &ReadinessSettings) -> String {
    render_statements(global().statements(), settings)
}

/// [`render`] of given readings.
pub fn render_statements(
    statements: Vec<StatementReading>,
    settings: &ReadinessSettings,
) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Readings {
        statements,
        settings: *settings,
    }));
    let mut text = String::new();
    // Writing into a String cannot fail; an encoder error would be a bug of ours (a label set
    // the format cannot hold), and an empty exposition is then what a scrape gets.
    if prometheus_text::encode(&mut text, &registry).is_err() {
        text.clear();
    }
    text
}

/// One scrape's readings, as a `prometheus-client` collector.
#[derive(Debug)]
struct Readings {
    statements: Vec<StatementReading>,
    settings: ReadinessSettings,
}

/// A send latency histogram read at one moment.
#[derive(Debug)]
struct ConstHistogram(HistogramSnapshot);

impl EncodeMetric for ConstHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.0.buckets)
            .collect();
        encoder.encode_histogram::<NoLabelSet>(
            self.0.sum.as_secs_f64(),
            self.0.count(),
            &buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Writes one family (skipped when it has no series).
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: Vec<(Labels, M)>,
) -> fmt::Result {
    let Some((_, first)) = series.first() else {
        return Ok(());
    };
    let mut family = encoder.encode_descriptor(name, help, None, first.metric_type())?;
    for (labels, metric) in &series {
        metric.encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

fn counter(v: u64) -> ConstCounter<u64> {
    ConstCounter::new(v)
}

fn gauge(v: u64) -> ConstGauge<i64> {
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
}

fn sink_labels(s: &StatementReading) -> Labels {
    let l = &s.labels;
    vec![
        ("statement", l.statement.to_string()),
        ("table", l.table.clone()),
        ("connector", l.connector.to_string()),
        ("destination", l.destination.clone()),
    ]
}

fn source_labels(s: &StatementReading, input: &InputReading) -> Labels {
    vec![
        ("statement", s.labels.statement.to_string()),
        ("table", input.identity.table.clone()),
        ("connector", input.identity.connector.to_string()),
        ("source", input.identity.resource.clone()),
    ]
}

/// A sink counter family: one series per statement.
macro_rules! sink_counters {
    ($encoder:expr, $statements:expr, $( $name:literal, $help:literal, |$s:ident| $value:expr; )+) => {
        $(
            family(
                $encoder,
                $name,
                $help,
                $statements
                    .iter()
                    .map(|$s| (sink_labels($s), counter($value)))
                    .collect(),
            )?;
        )+
    };
}

/// A source family: one series per input of each statement.
macro_rules! source_family {
    ($encoder:expr, $statements:expr, $make:ident, $( $name:literal, $help:literal, |$i:ident| $value:expr; )+) => {
        $(
            family(
                $encoder,
                $name,
                $help,
                $statements
                    .iter()
                    .flat_map(|s| s.inputs.iter().map(move |$i| (source_labels(s, $i), $make($value))))
                    .collect(),
            )?;
        )+
    };
}

impl Collector for Readings {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let statements = &self.statements;
        let e = &mut encoder;
        family(
            e,
            "gcp_sql_statement_running",
            "1 while a writer of the statement runs; 0 once it ended (its last readings are kept for a while).",
            statements
                .iter()
                .map(|s| (sink_labels(s), gauge(u64::from(s.running))))
                .collect(),
        )?;
        family(
            e,
            "gcp_sql_statement_ready",
            "1 when the running statement's writers reach their service, its streams are connected and no writer failed (as /readyz judges).",
            statements
                .iter()
                .filter(|s| s.running)
                .map(|s| {
                    let ready = readiness(std::slice::from_ref(s), &self.settings).ready;
                    (sink_labels(s), gauge(u64::from(ready)))
                })
                .collect(),
        )?;
        family(
            e,
            "gcp_sql_sink_writers",
            "Writers the statement ran (one per input partition, at most sink_parallelism).",
            statements
                .iter()
                .map(|s| (sink_labels(s), gauge(s.writers.len() as u64)))
                .collect(),
        )?;
        sink_counters!(e, statements,
            "gcp_sql_sink_records_sent", "Records (messages, tasks, mutations) handed to the service, each counted once whatever its retries.", |s| s.sink.records_sent;
            "gcp_sql_sink_records_acknowledged", "Records the service acknowledged (delivered, or already there).", |s| s.sink.records_acked;
            "gcp_sql_sink_records_deduplicated", "Records the service reported as delivered earlier (a named Cloud Tasks task that exists).", |s| s.sink.records_deduplicated;
            "gcp_sql_sink_records_rejected", "Records the service refused, confirmed by sending each alone.", |s| s.sink.records_rejected;
            "gcp_sql_sink_records_dropped", "Refused records the drop failure policy dropped.", |s| s.sink.records_dropped;
            "gcp_sql_sink_records_skipped", "Rows the encoder could not make a record of that the drop failure policy skipped.", |s| s.sink.records_skipped;
            "gcp_sql_sink_records_dead_lettered", "Rows the dead_letter failure policy stored in the dead-letter destination.", |s| s.sink.records_dead_lettered;
            "gcp_sql_sink_bytes_sent", "Bytes of the records handed to the service, each record counted once.", |s| s.sink.bytes_sent;
            "gcp_sql_sink_send_rpcs", "Send RPC attempts (Publish, CreateTask, MutateRows).", |s| s.sink.send_rpcs;
            "gcp_sql_sink_resources_created", "Destinations (topics, tables, column families) the sink created.", |s| s.sink.resources_created;
        );
        family(
            e,
            "gcp_sql_sink_send_errors",
            "Records whose send attempt came back with an error, by gRPC status code (one per record per failed attempt).",
            statements
                .iter()
                .flat_map(|s| {
                    s.sink.send_errors_by_code.iter().map(move |(code, n)| {
                        let mut labels = sink_labels(s);
                        labels.push(("code", (*code).to_string()));
                        (labels, counter(*n))
                    })
                })
                .collect(),
        )?;
        family(
            e,
            "gcp_sql_sink_retries",
            "Send RPCs retried, by the gRPC status code that caused the retry.",
            statements
                .iter()
                .flat_map(|s| {
                    s.sink.retries_by_code.iter().map(move |(code, n)| {
                        let mut labels = sink_labels(s);
                        labels.push(("code", (*code).to_string()));
                        (labels, counter(*n))
                    })
                })
                .collect(),
        )?;
        family(
            e,
            "gcp_sql_sink_in_flight_records",
            "Records admitted and not yet resolved (those waiting out a retry included).",
            statements
                .iter()
                .map(|s| (sink_labels(s), gauge(s.sink.in_flight_records)))
                .collect(),
        )?;
        family(
            e,
            "gcp_sql_sink_in_flight_bytes",
            "Bytes of the records admitted and not yet resolved.",
            statements
                .iter()
                .map(|s| (sink_labels(s), gauge(s.sink.in_flight_bytes)))
                .collect(),
        )?;
        family(
            e,
            "gcp_sql_sink_throttled_seconds",
            "Time the writers' admission waited on their rate limit (max_*_per_second, and the service's rate-limit hints).",
            statements
                .iter()
                .map(|s| {
                    (
                        sink_labels(s),
                        ConstCounter::new(s.sink.throttled.as_secs_f64()),
                    )
                })
                .collect(),
        )?;
        family(
            e,
            "gcp_sql_sink_send_latency_seconds",
            "Latency of each send RPC attempt, from its start to its status.",
            statements
                .iter()
                .map(|s| (sink_labels(s), ConstHistogram(s.sink.latency)))
                .collect(),
        )?;
        source_family!(e, statements, counter,
            "gcp_sql_source_messages_received", "Messages read from the subscription (a message delivered again counts again).", |i| i.counts.messages_read;
            "gcp_sql_source_messages_acknowledged", "Messages acknowledged: every row made from them was delivered, dead-lettered, dropped or filtered out, and the service took the acknowledgement.", |i| i.counts.messages_acked;
            "gcp_sql_source_messages_ack_confirmed", "Of the acknowledged messages, those the service confirmed id by id (a subscription with exactly-once delivery; zero otherwise).", |i| i.counts.messages_ack_confirmed;
            "gcp_sql_source_messages_ack_refused", "Acknowledgements, or receipts on arrival, the service refused for good (an ack id whose lease had lapsed): not acknowledged, the message is delivered again.", |i| i.counts.messages_ack_refused;
            "gcp_sql_source_messages_nacked", "Messages handed back to the service for another reader.", |i| i.counts.messages_nacked;
            "gcp_sql_source_messages_dropped", "Messages that did not decode and that the drop failure policy dropped.", |i| i.counts.messages_dropped;
            "gcp_sql_source_messages_dead_lettered", "Messages that did not decode, stored in the dead-letter destination.", |i| i.counts.messages_dead_lettered;
            "gcp_sql_source_rows_emitted", "Rows the source made of the messages it read.", |i| i.counts.rows_emitted;
            "gcp_sql_source_lease_extensions", "Message leases extended (one per message per extension).", |i| i.counts.lease_extensions;
            "gcp_sql_source_leases_expired", "Messages held for max_lease_duration without being delivered (the service delivers them again).", |i| i.counts.leases_expired;
            "gcp_sql_source_reconnects", "Streams opened again after a transient failure.", |i| i.counts.reconnects;
        );
        source_family!(e, statements, gauge,
            "gcp_sql_source_held_messages", "Messages read and neither acknowledged nor handed back yet.", |i| i.held.messages;
            "gcp_sql_source_held_bytes", "Data bytes of the held messages.", |i| i.held.bytes;
            "gcp_sql_source_streams", "Streams reading the subscription.", |i| i.held.streams;
            "gcp_sql_source_streams_connected", "Streams connected to the service now.", |i| i.held.streams_connected;
        );
        family(
            e,
            "gcp_sql_source_oldest_unacked_message_age_seconds",
            "Age of the oldest held message, from its publication: what to alert on when a pipeline stops delivering (0 when none is held).",
            statements
                .iter()
                .flat_map(|s| {
                    s.inputs.iter().map(move |i| {
                        let age = i.held.oldest.unwrap_or_default().as_secs_f64();
                        (source_labels(s, i), ConstGauge::new(age))
                    })
                })
                .collect(),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::core::delivery::{DeliveryCounts, Held, InputIdentity};
    use crate::core::metrics::{SinkReading, WriterHealthSnapshot};
    use crate::core::telemetry::StatementLabels;

    fn reading() -> StatementReading {
        let mut sink = SinkReading {
            records_sent: 10,
            records_acked: 9,
            bytes_sent: 1000,
            in_flight_records: 1,
            throttled: Duration::from_millis(1500),
            ..SinkReading::default()
        };
        sink.send_errors_by_code.insert("UNAVAILABLE", 2);
        sink.retries_by_code.insert("UNAVAILABLE", 1);
        sink.latency.buckets[0] = 3;
        sink.latency.buckets[LATENCY_BUCKETS.len()] = 1;
        sink.latency.sum = Duration::from_secs(100);
        StatementReading {
            labels: StatementLabels {
                statement: Arc::from("20261203T000000.000Z-1-0"),
                table: "clicks_bt".into(),
                connector: "bigtable",
                destination: "projects/p/instances/i/tables/clicks".into(),
            },
            running: true,
            sink,
            writers: vec![(0, WriterHealthSnapshot::default())],
            inputs: vec![InputReading {
                identity: InputIdentity {
                    connector: "pubsub",
                    table: "clicks_in".into(),
                    resource: "projects/p/subscriptions/s".into(),
                },
                counts: DeliveryCounts {
                    messages_read: 12,
                    messages_acked: 9,
                    ..DeliveryCounts::default()
                },
                held: Held {
                    messages: 3,
                    bytes: 300,
                    oldest: Some(Duration::from_millis(2500)),
                    streams: 2,
                    streams_connected: 2,
                },
            }],
        }
    }

    #[test]
    fn the_text_format_has_every_family_with_its_labels() {
        let text = render_statements(vec![reading()], &ReadinessSettings::default());
        let sink = "statement=\"20261203T000000.000Z-1-0\",table=\"clicks_bt\",connector=\"bigtable\",destination=\"projects/p/instances/i/tables/clicks\"";
        let source = "statement=\"20261203T000000.000Z-1-0\",table=\"clicks_in\",connector=\"pubsub\",source=\"projects/p/subscriptions/s\"";
        for line in [
            "# TYPE gcp_sql_sink_records_sent_total counter".to_string(),
            format!("gcp_sql_sink_records_sent_total{{{sink}}} 10"),
            format!("gcp_sql_sink_records_acknowledged_total{{{sink}}} 9"),
            format!("gcp_sql_sink_bytes_sent_total{{{sink}}} 1000"),
            format!("gcp_sql_sink_in_flight_records{{{sink}}} 1"),
            format!("gcp_sql_sink_send_errors_total{{{sink},code=\"UNAVAILABLE\"}} 2"),
            format!("gcp_sql_sink_retries_total{{{sink},code=\"UNAVAILABLE\"}} 1"),
            format!("gcp_sql_sink_throttled_seconds_total{{{sink}}} 1.5"),
            format!("gcp_sql_sink_send_latency_seconds_bucket{{{sink},le=\"0.001\"}} 3"),
            format!("gcp_sql_sink_send_latency_seconds_bucket{{{sink},le=\"60\"}} 3"),
            format!("gcp_sql_sink_send_latency_seconds_bucket{{{sink},le=\"+Inf\"}} 4"),
            format!("gcp_sql_sink_send_latency_seconds_count{{{sink}}} 4"),
            format!("gcp_sql_statement_running{{{sink}}} 1"),
            format!("gcp_sql_statement_ready{{{sink}}} 1"),
            format!("gcp_sql_source_messages_received_total{{{source}}} 12"),
            format!("gcp_sql_source_messages_acknowledged_total{{{source}}} 9"),
            format!("gcp_sql_source_held_messages{{{source}}} 3"),
            format!("gcp_sql_source_oldest_unacked_message_age_seconds{{{source}}} 2.5"),
            format!("gcp_sql_source_streams_connected{{{source}}} 2"),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing line {line}\n{text}"
            );
        }
    }

    #[test]
    fn no_statement_is_an_empty_exposition() {
        let text = render_statements(Vec::new(), &ReadinessSettings::default());
        assert!(!text.contains("gcp_sql_"), "{text}");
    }
}
