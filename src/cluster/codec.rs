//! The two extension codecs that carry a sink table and the sink's plan nodes between a
//! Ballista client, its scheduler and its executors.
//!
//! Both recognise only what is this crate's (a [`SinkTable`], a [`SinkWriterExec`], a
//! [`SinkCountExec`]) and hand everything else to the codec they wrap, Ballista's own by
//! default ([`BallistaLogicalExtensionCodec`], [`BallistaPhysicalExtensionCodec`]).
//!
//! A sink table is encoded as its [`SinkSpec`]: connector, table name, `LOCATION`, the options
//! as declared (and checked), the schema, and the emulator address and endpoint the
//! declaration resolved. Decoding rebuilds the sink from them with the options checked again;
//! the decoding process reads no emulator variable of its own (see [`SinkSpec::build`]).
//! Credentials are not in the plan: the rebuilt sink reads Application Default Credentials, or
//! the key file that the `credentials_file` option names, where it runs.
//!
//! Each encoding starts with a tag of its own (`gcp-sql:...`) that no protobuf message starts
//! with, so a buffer is recognised before it is decoded.

use std::sync::Arc;

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan, ScalarUDF};
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::from_proto::parse_physical_sort_exprs;
use datafusion_proto::physical_plan::to_proto::serialize_physical_sort_exprs;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use prost::Message;

use crate::options::RawOptions;
use crate::sql::{SinkCountExec, SinkDeclaration, SinkSpec, SinkTable, SinkWriterExec};

/// The tag of an encoded sink table.
pub(super) const TABLE_TAG: &[u8] = b"gcp-sql:sink-table:1\0";
/// The tag of an encoded [`SinkWriterExec`].
const WRITER_TAG: &[u8] = b"gcp-sql:sink-writer:1\0";
/// The tag of an encoded [`SinkCountExec`] (nothing follows it: the node has no state).
const COUNT_TAG: &[u8] = b"gcp-sql:sink-count:1\0";

/// One option of a declaration, as given.
#[derive(Clone, PartialEq, Message)]
struct OptionEntry {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

/// A sink table as it travels: its [`SinkSpec`].
#[derive(Clone, PartialEq, Message)]
struct SinkTableNode {
    #[prost(string, tag = "1")]
    connector: String,
    #[prost(string, tag = "2")]
    table: String,
    #[prost(string, optional, tag = "3")]
    location: Option<String>,
    #[prost(message, repeated, tag = "4")]
    options: Vec<OptionEntry>,
    #[prost(message, optional, tag = "5")]
    schema: Option<protobuf::Schema>,
    /// The value of the connector's emulator variable the declaration used.
    #[prost(string, optional, tag = "6")]
    emulator_from_env: Option<String>,
    /// The emulator address the declaration resolved (option or variable).
    #[prost(string, optional, tag = "7")]
    emulator_host: Option<String>,
    /// The endpoint the declaration resolved.
    #[prost(string, optional, tag = "8")]
    endpoint: Option<String>,
}

/// A [`SinkWriterExec`] as it travels; its input is encoded by the plan around it.
#[derive(Clone, PartialEq, Message)]
struct SinkWriterNode {
    #[prost(message, optional, tag = "1")]
    table: Option<SinkTableNode>,
    /// Whether the writers require an ordering of their input (`ordering` is it).
    #[prost(bool, tag = "2")]
    ordered: bool,
    #[prost(message, repeated, tag = "3")]
    ordering: Vec<protobuf::PhysicalSortExprNode>,
}

fn codec_error(what: &str, detail: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Internal(format!("gcp-sql plan codec: {what}: {detail}"))
}

fn encode_spec(spec: &SinkSpec) -> DFResult<SinkTableNode> {
    let schema = protobuf::Schema::try_from(spec.schema().as_ref())
        .map_err(|e| codec_error("encoding the table schema", e))?;
    Ok(SinkTableNode {
        connector: spec.kind().name().to_string(),
        table: spec.table().to_string(),
        location: spec.location().map(str::to_string),
        options: spec
            .options()
            .iter()
            .map(|(name, value)| OptionEntry {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        schema: Some(schema),
        emulator_from_env: spec.emulator_from_env().map(str::to_string),
        emulator_host: spec.emulator_host().map(str::to_string),
        endpoint: spec.endpoint().map(str::to_string),
    })
}

fn decode_spec(node: SinkTableNode) -> DFResult<SinkSpec> {
    let kind = crate::connectors::registry::kind_named(&node.connector)
        .map_err(|e| codec_error("decoding the connector", e))?;
    let schema = node
        .schema
        .as_ref()
        .ok_or_else(|| codec_error("decoding a sink table", "no schema"))?;
    let schema: SchemaRef = Arc::new(
        Schema::try_from(schema).map_err(|e| codec_error("decoding the table schema", e))?,
    );
    Ok(SinkSpec::from_parts(
        node.table,
        kind,
        node.location,
        node.options
            .into_iter()
            .map(|o| (o.name, o.value))
            .collect(),
        schema,
        node.emulator_from_env,
        node.emulator_host,
        node.endpoint,
    ))
}

/// The sink table of a spec, as the factory would have declared it.
fn table_of(spec: SinkSpec) -> DFResult<SinkTable> {
    let sink = spec.build()?;
    let raw = RawOptions::from_pairs(spec.options().iter().cloned())?;
    let declaration = SinkDeclaration::new(spec.kind(), spec.location(), &raw);
    Ok(SinkTable::new(spec.table().to_string(), sink)
        .with_declaration(declaration)
        .with_spec(spec))
}

fn tagged<'a>(buf: &'a [u8], tag: &[u8]) -> Option<&'a [u8]> {
    buf.strip_prefix(tag)
}

fn not_carried(table: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "table '{table}' was built from typed options in Rust and has no SQL declaration, so \
         it cannot be sent to a cluster; declare it with CREATE EXTERNAL TABLE (or the WITH \
         form) instead"
    ))
}

/// A source table that neither codec carries (a table function such as `generate_series`, a
/// provider registered in Rust): the error names it and says what does travel. DataFusion's
/// own message alone ("LogicalExtensionCodec is not provided", flagged as a DataFusion bug)
/// says neither.
fn not_sendable(table: &str, inner: DataFusionError) -> DataFusionError {
    DataFusionError::Plan(format!(
        "the source '{table}' cannot be sent to a cluster: a plan carries sink tables, file \
         tables (CREATE EXTERNAL TABLE ... STORED AS CSV | PARQUET | JSON, or a file path in \
         FROM) and VALUES, not this table; run it without --cluster, or write its rows to files \
         first ({})",
        inner.strip_backtrace()
    ))
}

/// The logical codec: sink tables as their declarations, everything else by the wrapped codec.
#[derive(Debug)]
pub struct SinkLogicalCodec {
    inner: Arc<dyn LogicalExtensionCodec>,
}

impl Default for SinkLogicalCodec {
    fn default() -> Self {
        Self::wrapping(Arc::new(BallistaLogicalExtensionCodec::default()))
    }
}

impl SinkLogicalCodec {
    /// Handles sink tables and hands everything else to `inner`.
    pub fn wrapping(inner: Arc<dyn LogicalExtensionCodec>) -> Self {
        SinkLogicalCodec { inner }
    }
}

impl LogicalExtensionCodec for SinkLogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> DFResult<Extension> {
        self.inner.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> DFResult<()> {
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> DFResult<Arc<dyn TableProvider>> {
        let Some(body) = tagged(buf, TABLE_TAG) else {
            return self
                .inner
                .try_decode_table_provider(buf, table_ref, schema, ctx);
        };
        let node =
            SinkTableNode::decode(body).map_err(|e| codec_error("decoding a sink table", e))?;
        Ok(Arc::new(table_of(decode_spec(node)?)?))
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> DFResult<()> {
        let Some(table) = node.downcast_ref::<SinkTable>() else {
            if crate::connectors::registry::kinds()
                .filter_map(|kind| kind.descriptor().source)
                .any(|source| (source.is_table)(node.as_ref()))
            {
                return Err(DataFusionError::Plan(format!(
                    "the source '{table_ref}' reads a service and cannot be sent to a cluster: \
                     its messages are acknowledged only after the sink delivered their rows, \
                     which needs the source and the sink's writers in one process (a cluster's \
                     stages hand rows over through a shuffle); run the pipeline without \
                     --cluster, reading with more parallel_pull_count streams"
                )));
            }
            return self
                .inner
                .try_encode_table_provider(table_ref, node, buf)
                .map_err(|e| not_sendable(&table_ref.to_string(), e));
        };
        let spec = table
            .spec()
            .ok_or_else(|| not_carried(&table_ref.to_string()))?;
        buf.extend_from_slice(TABLE_TAG);
        encode_spec(spec)?
            .encode(buf)
            .map_err(|e| codec_error("encoding a sink table", e))
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> DFResult<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> DFResult<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> DFResult<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> DFResult<()> {
        self.inner.try_encode_udf(node, buf)
    }
}

/// The physical codec: [`SinkWriterExec`] (its table as its declaration, its required
/// ordering) and [`SinkCountExec`]; everything else by the wrapped codec.
#[derive(Debug)]
pub struct SinkPhysicalCodec {
    inner: Arc<dyn PhysicalExtensionCodec>,
}

impl Default for SinkPhysicalCodec {
    fn default() -> Self {
        Self::wrapping(Arc::new(BallistaPhysicalExtensionCodec::default()))
    }
}

impl SinkPhysicalCodec {
    /// Handles the sink's nodes and hands everything else to `inner`.
    pub fn wrapping(inner: Arc<dyn PhysicalExtensionCodec>) -> Self {
        SinkPhysicalCodec { inner }
    }
}

fn one_input(node: &str, inputs: &[Arc<dyn ExecutionPlan>]) -> DFResult<Arc<dyn ExecutionPlan>> {
    match inputs {
        [input] => Ok(input.clone()),
        _ => Err(codec_error(
            &format!("decoding a {node}"),
            format!("it has one input, the plan gives {}", inputs.len()),
        )),
    }
}

impl PhysicalExtensionCodec for SinkPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if tagged(buf, COUNT_TAG).is_some() {
            return Ok(Arc::new(SinkCountExec::new(one_input(
                "SinkCountExec",
                inputs,
            )?)));
        }
        let Some(body) = tagged(buf, WRITER_TAG) else {
            return self.inner.try_decode(buf, inputs, ctx, proto_converter);
        };
        let input = one_input("SinkWriterExec", inputs)?;
        let node =
            SinkWriterNode::decode(body).map_err(|e| codec_error("decoding a sink writer", e))?;
        let table = node
            .table
            .ok_or_else(|| codec_error("decoding a sink writer", "no table"))?;
        let spec = decode_spec(table)?;
        let sink = spec.build()?;
        let ordering = if node.ordered {
            let decode_ctx = PhysicalPlanDecodeContext::new(ctx, self);
            let exprs = parse_physical_sort_exprs(
                &node.ordering,
                &decode_ctx,
                &input.schema(),
                proto_converter,
            )?;
            Some(LexOrdering::new(exprs).ok_or_else(|| {
                codec_error("decoding a sink writer", "an empty required ordering")
            })?)
        } else {
            None
        };
        let writer =
            SinkWriterExec::try_new_with_ordering(spec.table().to_string(), sink, input, ordering)?
                .with_spec(Some(Arc::new(spec)));
        Ok(Arc::new(writer))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DFResult<()> {
        if node.downcast_ref::<SinkCountExec>().is_some() {
            buf.extend_from_slice(COUNT_TAG);
            return Ok(());
        }
        let Some(writer) = node.downcast_ref::<SinkWriterExec>() else {
            return self.inner.try_encode(node, buf, proto_converter);
        };
        let spec = writer.spec().ok_or_else(|| not_carried(writer.table()))?;
        let ordering = match writer.ordering() {
            Some(ordering) => {
                serialize_physical_sort_exprs(ordering.iter().cloned(), self, proto_converter)?
            }
            None => Vec::new(),
        };
        let message = SinkWriterNode {
            table: Some(encode_spec(spec)?),
            ordered: writer.ordering().is_some(),
            ordering,
        };
        buf.extend_from_slice(WRITER_TAG);
        message
            .encode(buf)
            .map_err(|e| codec_error("encoding a sink writer", e))
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> DFResult<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> DFResult<()> {
        self.inner.try_encode_udf(node, buf)
    }
}
