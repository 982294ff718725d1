//! Declares a Pub/Sub sink from Rust, without SQL DDL, and inserts into it with SQL.
//!
//! ```sh
//! # against an emulator that is already running:
//! PUBSUB_EMULATOR_HOST=127.0.0.1:8085 cargo run --example rust_api
//! # or let the example start one:
//! cargo run --example rust_api
//! ```

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use gcp_sql::connectors::pubsub::sink::options::{
    PubSubMappingOptions, PubSubPublisherOptions, PubSubSinkOptions,
};
use gcp_sql::connectors::pubsub::sink::writer::PubSubSink;
use gcp_sql::connectors::shared::SharedOptions;
use gcp_sql::emulators::{Emulator, EmulatorKind};
use gcp_sql::options::ConnectionOptions;
use gcp_sql::sql::SinkTable;

#[tokio::main]
async fn main() -> gcp_sql::Result<()> {
    // Use the emulator the environment names, or start one for the run.
    let (host, _emulator) = match std::env::var("PUBSUB_EMULATOR_HOST") {
        Ok(host) => (host, None),
        Err(_) => {
            let emulator = Emulator::start(EmulatorKind::PubSub).await?;
            (emulator.host().to_string(), Some(emulator))
        }
    };

    // The writer options mirror the Java builder one for one; build() checks every rule.
    let publisher = PubSubPublisherOptions::builder()
        .batch_element_count_threshold(500)
        .batch_delay_threshold(Duration::from_millis(5))
        .max_in_flight_bytes(16 << 20)
        .build()?;
    let options = PubSubSinkOptions {
        // The `fail` policy, no dead letters, one writer per input partition.
        shared: SharedOptions::with_connection(ConnectionOptions::emulator("demo", host)),
        topic: Some("projects/demo/topics/rust-api".into()),
        mapping: PubSubMappingOptions::default(),
        auto_create_topic: true,
        publisher,
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let sink = PubSubSink::from_options(schema, options)?;

    let ctx = gcp_sql::sql::new_context();
    ctx.register_table("people", Arc::new(SinkTable::new("people", Arc::new(sink))))?;
    let batches = gcp_sql::sql::run(
        &ctx,
        "INSERT INTO people SELECT value, 'person ' || CAST(value AS VARCHAR) FROM generate_series(1, 1000)",
    )
    .await?;
    println!(
        "{}",
        datafusion::arrow::util::pretty::pretty_format_batches(&batches)?
    );
    Ok(())
}
