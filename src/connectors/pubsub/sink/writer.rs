//! The Pub/Sub sink: rows in, acknowledged messages out, through the shared core.
//!
//! This file is glue, the [`Connector`] the generic [`Sink`] is built on: the options become a
//! [`FlowConfig`], the mapping encodes each batch, and the core admits, batches, sends, retries
//! and resolves.

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use super::mapping::{self, MappingSpec, PubSubMapping, PubsubRecord};
use super::options::PubSubSinkOptions;
use crate::connectors::Routing;
use crate::connectors::pubsub::client::{ClientSettings, PubSubTransport};
use crate::connectors::sink::{Connector, Sink};
use crate::core::run::WriterContext;
use crate::core::{BatchThresholds, Envelope, FlowConfig, RecoverySettings, RetrySettings};
use crate::error::{Error, Result};
use crate::options::{ColumnRef, PayloadFormat};

/// The Pub/Sub connector as the generic [`Sink`] sees it: [`PubSubSinkOptions`] in, a
/// [`PubSubMapping`] and a [`PubSubTransport`] out.
#[derive(Debug, Clone, Copy, Default)]
pub struct PubSub;

/// A declared Pub/Sub sink: its options, checked against the table schema.
///
/// Built with `try_new(schema, location, raw)` (SQL options) or `from_options(schema, options)`
/// (the Rust API, without SQL):
///
/// ```
/// use gcp_sql::connectors::TableOptions;
/// use std::sync::Arc;
/// use datafusion::arrow::datatypes::{DataType, Field, Schema};
/// use gcp_sql::connectors::pubsub::sink::options::PubSubSinkOptions;
/// use gcp_sql::connectors::pubsub::sink::writer::PubSubSink;
/// use gcp_sql::options::RawOptions;
///
/// let raw = RawOptions::from_pairs([("topic".to_string(), "projects/demo/topics/clicks".to_string())]).unwrap();
/// let options = PubSubSinkOptions::from_raw(None, &raw).unwrap();
/// let schema = Arc::new(Schema::new(vec![Field::new("data", DataType::Utf8, false)]));
/// let sink = PubSubSink::from_options(schema, options).unwrap();
/// assert_eq!(sink.flow_config().max_in_flight_records, 1000);
/// ```
pub type PubSubSink = Sink<PubSub>;

#[async_trait]
impl Connector for PubSub {
    type Options = PubSubSinkOptions;
    type Mapping = PubSubMapping;
    type ClientSettings = ClientSettings;
    type Transport = PubSubTransport;

    fn mapping(options: &PubSubSinkOptions, schema: &SchemaRef) -> Result<PubSubMapping> {
        options.validate()?;
        PubSubMapping::new(
            &mapping_spec(options),
            schema,
            options.topic.as_deref(),
            options.shared.connection.project.as_deref(),
        )
    }

    fn flow_config(options: &PubSubSinkOptions, _mapping: &PubSubMapping) -> FlowConfig {
        flow_config(options)
    }

    /// With ordering on, each ordering key (per topic) has one writer, which keeps the input's
    /// order; without, any writer will do.
    fn routing(options: &PubSubSinkOptions, mapping: &PubSubMapping) -> Routing {
        let columns = mapping.ordering_columns();
        if options.publisher.enable_message_ordering() && !columns.is_empty() {
            Routing::by_key(columns)
        } else {
            Routing::any()
        }
    }

    fn describe_record(record: &PubsubRecord) -> crate::core::DeadPayload {
        crate::connectors::pubsub::dead_letter::describe_pubsub(record)
    }

    fn client_settings(options: &PubSubSinkOptions, _mapping: &PubSubMapping) -> ClientSettings {
        let connection = &options.shared.connection;
        ClientSettings {
            endpoint: connection.endpoint.clone(),
            emulator_host: connection.emulator.as_ref().map(|e| e.host.clone()),
            credentials_file: connection.credentials_file.clone(),
            auto_create_topic: options.auto_create_topic,
        }
    }

    async fn connect(settings: &ClientSettings) -> Result<PubSubTransport> {
        PubSubTransport::connect(settings).await
    }

    /// An object-store `schema_location` is read here; without a `format` option, a fixed
    /// topic's Pub/Sub schema decides the encoding: its definition, revision and encoding are
    /// read once here.
    async fn prepare(
        _options: &PubSubSinkOptions,
        mapping: &PubSubMapping,
        schema: &SchemaRef,
        transport: &PubSubTransport,
        ctx: &WriterContext,
    ) -> Result<Option<PubSubMapping>> {
        if let Some(at) = mapping.pending_schema() {
            let read = at.read(ctx.runtime.as_ref()).await?;
            return Ok(Some(mapping.with_schema(&read, schema)?));
        }
        let Some(topic) = mapping
            .default_topic()
            .filter(|_| mapping.takes_topic_schema())
        else {
            return Ok(None);
        };
        match transport.topic_schema(topic).await? {
            Some(topic_schema) => Ok(Some(mapping.with_schema(&topic_schema, schema)?)),
            None => Ok(None),
        }
    }

    /// Encodes the batch; without `enable_message_ordering`, a row with an ordering key is
    /// refused (the failure policy decides), as the Java publisher refuses to publish one.
    fn encode_batch(
        options: &PubSubSinkOptions,
        mapping: &PubSubMapping,
        batch: &RecordBatch,
        first_row: u64,
        out: &mut Vec<Result<Envelope<PubsubRecord>>>,
    ) -> Result<()> {
        let start = out.len();
        mapping.encode_batch(batch, first_row, out)?;
        if !options.publisher.enable_message_ordering() {
            for (i, entry) in out[start..].iter_mut().enumerate() {
                if matches!(entry, Ok(envelope) if envelope.sequence_key.is_some()) {
                    *entry = Err(Error::Encode {
                        row: first_row + i as u64,
                        reason:
                            "the row has an ordering key but 'enable_message_ordering' is false"
                                .into(),
                    });
                }
            }
        }
        Ok(())
    }
}

fn column(c: &ColumnRef) -> Option<String> {
    c.explicit.then(|| c.name.clone())
}

fn mapping_spec(options: &PubSubSinkOptions) -> MappingSpec {
    let m = &options.mapping;
    MappingSpec {
        topic_column: m.topic_column.clone(),
        data_column: column(&m.data_column),
        format: match m.format {
            PayloadFormat::Json => mapping::PayloadFormat::Json,
            PayloadFormat::Raw => mapping::PayloadFormat::Raw,
        },
        schema: m.schema.clone(),
        schema_at: m.schema_at.clone(),
        format_given: m.format_given,
        attributes_column: column(&m.attributes_column),
        attribute_columns: m.attribute_columns.clone(),
        ordering_key_column: column(&m.ordering_key_column),
    }
}

/// The most message bytes one batch may carry so that its `PublishRequest` stays within the
/// request limit: each message adds a field tag and a length prefix (at most 1 + 5 bytes), and
/// the request carries the topic name (under 512 bytes: a project id is at most 30 characters
/// and a topic id at most 255).
const BATCH_BYTE_CEILING: u64 =
    mapping::MAX_REQUEST_BYTES - (mapping::MAX_MESSAGES_PER_REQUEST as u64) * 6 - 512;

/// Translates the publisher options into the core's settings.
fn flow_config(options: &PubSubSinkOptions) -> FlowConfig {
    let p = &options.publisher;
    let retry = RetrySettings {
        total_timeout: p.retry_total_timeout(),
        max_attempts: u32::try_from(p.retry_max_attempts()).unwrap_or(0),
        initial_retry_delay: p.retry_initial_delay(),
        retry_delay_multiplier: p.retry_delay_multiplier(),
        max_retry_delay: p.retry_max_delay(),
        initial_rpc_timeout: p.retry_initial_rpc_timeout(),
        rpc_timeout_multiplier: p.retry_rpc_timeout_multiplier(),
        max_rpc_timeout: p.retry_max_rpc_timeout(),
        jitter: true,
    };
    // With ordering, the SDK publisher never gives up on a publish: giving up would break the
    // order of the key. The progress timeout is then what ends an outage.
    let retry = if p.enable_message_ordering() {
        RetrySettings::unlimited(&retry)
    } else {
        retry
    };
    let max_records = usize::try_from(p.max_in_flight_messages())
        .unwrap_or(1)
        .max(1);
    FlowConfig {
        max_in_flight_records: max_records,
        max_in_flight_bytes: p.in_flight_byte_cap(),
        in_flight_option: "max_in_flight_bytes",
        progress_timeout: Some(p.publish_progress_timeout()),
        progress_option: "publish_progress_timeout",
        shutdown_timeout: p.shutdown_timeout(),
        shutdown_option: "shutdown_timeout",
        max_active_destinations: usize::try_from(p.max_active_publishers())
            .unwrap_or(1)
            .max(1),
        destination_idle_timeout: p.destination_idle_timeout(),
        per_destination_metrics: p.per_destination_metrics(),
        max_consecutive_rejections: p.rejection_limit(),
        breaker_option: "max_consecutive_rejections",
        batch: BatchThresholds {
            // A request holds at most 1000 messages and 10 MB, whatever the thresholds say.
            max_records: usize::try_from(p.batch_element_count_threshold())
                .unwrap_or(usize::MAX)
                .min(mapping::MAX_MESSAGES_PER_REQUEST),
            max_bytes: u64::try_from(p.batch_request_byte_threshold())
                .unwrap_or(u64::MAX)
                .min(BATCH_BYTE_CEILING),
            max_delay: p.batch_delay_threshold(),
        },
        retry,
        retry_option: (!p.enable_message_ordering())
            .then_some("retry_total_timeout' / 'retry_max_attempts"),
        not_found: options.auto_create_topic.then(|| {
            RecoverySettings::new(
                p.recovery_initial_backoff(),
                p.recovery_max_backoff(),
                2.0,
                p.recovery_max_attempts(),
                "recovery_max_attempts",
                true,
            )
        }),
        failure_policy: options.shared.failure_policy,
        // Every send carries at least one record, so the record cap already bounds this.
        max_concurrent_sends: max_records,
        max_records_per_second: None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::connectors::TableOptions;
    use crate::options::RawOptions;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn sink_with_env(pairs: &[(&str, &str)], env: &[(&str, &str)]) -> PubSubSink {
        let raw = RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .expect("raw options");
        let lookup = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let options = PubSubSinkOptions::from_raw_with_env(None, &raw, &lookup).expect("options");
        let schema = Arc::new(Schema::new(vec![Field::new("data", DataType::Utf8, false)]));
        PubSubSink::from_options(schema, options).expect("sink")
    }

    #[test]
    fn an_explicit_endpoint_is_not_overridden_by_the_emulator_variable() {
        let sink = sink_with_env(
            &[
                ("topic", "projects/demo/topics/clicks"),
                ("endpoint", "https://europe-west1-pubsub.googleapis.com"),
            ],
            &[("PUBSUB_EMULATOR_HOST", "127.0.0.1:8085")],
        );
        let settings = sink.client_settings();
        assert_eq!(settings.effective_emulator_host(), None);
        assert_eq!(
            settings.endpoint.as_deref(),
            Some("https://europe-west1-pubsub.googleapis.com")
        );
    }

    #[test]
    fn the_emulator_variable_is_used_without_an_endpoint() {
        let sink = sink_with_env(
            &[("topic", "projects/demo/topics/clicks")],
            &[("PUBSUB_EMULATOR_HOST", "127.0.0.1:8085")],
        );
        assert_eq!(
            sink.client_settings().effective_emulator_host().as_deref(),
            Some("127.0.0.1:8085")
        );
    }
}
