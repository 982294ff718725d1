//! The source table a session registers: a subscription read as an unbounded table.
//!
//! ```no_run
//! use std::sync::Arc;
//! use datafusion::arrow::datatypes::{DataType, Field, Schema};
//! use datafusion::prelude::SessionContext;
//! use gcp_sql::connectors::pubsub::source::PubSubSourceTable;
//! use gcp_sql::connectors::pubsub::source::options::PubSubSourceOptions;
//!
//! # async fn demo() -> gcp_sql::Result<()> {
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("user_id", DataType::Int64, true),
//!     Field::new("url", DataType::Utf8, true),
//! ]));
//! let mut options =
//!     PubSubSourceOptions::emulator("projects/demo/subscriptions/clicks", "localhost:8085");
//! options.stop_after_idle = Some(std::time::Duration::from_secs(5));
//! let table = Arc::new(PubSubSourceTable::try_new("clicks_in", schema, options)?);
//! let ctx = SessionContext::new();
//! ctx.register_table("clicks_in", table.clone())?;
//! let rows = ctx.sql("SELECT url FROM clicks_in WHERE user_id > 10").await?.collect().await?;
//! for handle in table.handles() {
//!     handle.settled().await; // every acknowledgement sent
//! }
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use super::decode::MessageDecoder;
use super::exec::{PubSubSourceExec, SourceConfig, SourceHandle};
use super::options::PUBLISH_TIME_COLUMN;
use super::options::{PayloadSource, PubSubSourceOptions};
use crate::error::{Error, Result};
use crate::options::event_time::EVENT_TIME_FIELD;
use crate::options::schema_types::column_type;
use datafusion::arrow::datatypes::DataType;

/// A Pub/Sub subscription as a table: every scan is a [`PubSubSourceExec`].
#[derive(Debug)]
pub struct PubSubSourceTable {
    config: Arc<SourceConfig>,
    handles: Mutex<Vec<SourceHandle>>,
}

impl PubSubSourceTable {
    /// Checks `schema` against `options` (the metadata columns' types, the format, each JSON
    /// column's type, and under `avro` / `protobuf` with a schema known now, each column against
    /// the schema's field of its name) and builds the table. Nothing connects until a scan runs.
    pub fn try_new(
        name: impl Into<String>,
        schema: SchemaRef,
        options: PubSubSourceOptions,
    ) -> Result<Self> {
        if let Some(column) = &options.event_time.column {
            let option = match options.columns.publish_time.as_deref() {
                Some(p) if p == column => PUBLISH_TIME_COLUMN.name,
                _ => EVENT_TIME_FIELD.name,
            };
            let ty = column_type(&schema, column, option)?;
            if !matches!(ty, DataType::Timestamp(..)) {
                return Err(Error::invalid(
                    option,
                    column,
                    format!("the event time must be a TIMESTAMP column; '{column}' is {ty}"),
                ));
            }
        }
        let mut decoder = MessageDecoder::new(schema, options.format, &options.columns)?;
        if let PayloadSource::Schema(payload) = &options.schema {
            decoder = decoder.with_schema(payload)?;
        }
        Ok(PubSubSourceTable {
            config: Arc::new(SourceConfig {
                table: name.into(),
                options,
                decoder,
            }),
            handles: Mutex::new(Vec::new()),
        })
    }

    /// The source options.
    pub fn options(&self) -> &PubSubSourceOptions {
        &self.config.options
    }

    /// The handles of every scan planned so far, oldest first.
    pub fn handles(&self) -> Vec<SourceHandle> {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[async_trait]
impl TableProvider for PubSubSourceTable {
    fn schema(&self) -> SchemaRef {
        self.config.decoder.schema().clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let exec = PubSubSourceExec::try_new(self.config.clone(), projection.cloned())?;
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(exec.handle().clone());
        Ok(Arc::new(exec))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{Field, Schema, TimeUnit};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("user", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
        ]))
    }

    #[test]
    fn an_event_time_that_is_missing_or_not_a_timestamp_is_refused_naming_the_option() {
        let mut options = PubSubSourceOptions::emulator("projects/p/subscriptions/s", "h:1");
        options.event_time.column = Some("user".into());
        let e = PubSubSourceTable::try_new("t", schema(), options.clone())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("event_time_field") && e.contains("TIMESTAMP") && e.contains("'user'"),
            "{e}"
        );
        options.event_time.column = Some("nope".into());
        let e = PubSubSourceTable::try_new("t", schema(), options.clone())
            .unwrap_err()
            .to_string();
        assert!(e.contains("event_time_field") && e.contains("nope"), "{e}");
        options.event_time.column = Some("ts".into());
        assert!(PubSubSourceTable::try_new("t", schema(), options).is_ok());
    }
}
