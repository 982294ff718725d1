//! Codec round trips, no cluster needed: each connector's table through the logical codec
//! (alone and inside an `INSERT` plan), the sink nodes through the physical codec.

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion_proto::bytes::{
    logical_plan_from_bytes_with_extension_codec, logical_plan_to_bytes_with_extension_codec,
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::logical_plan::LogicalExtensionCodec;

use super::*;
use crate::connectors::ConnectorKind;
use crate::connectors::descriptor::SampleTable;
use crate::connectors::registry;
use crate::sql::{SinkTable, SinkWriterExec};

/// One table of each connector (its testing part's sample, with options of every kind and an
/// emulator address given as an option), in the registry's order.
fn declarations() -> impl Iterator<Item = (ConnectorKind, SampleTable)> {
    registry::CONNECTORS
        .iter()
        .map(|c| (ConnectorKind::of(c.descriptor), c.testing.sample))
}

/// The Pub/Sub sample: an ordered table (ordering keys on).
fn pubsub_sample() -> SampleTable {
    registry::registered(crate::connectors::pubsub::KIND)
        .testing
        .sample
}

fn session() -> SessionContext {
    SessionContext::new_with_state(
        configure(SessionStateBuilder::new().with_default_features())
            .with_config(configure_config(
                SessionConfig::new().with_target_partitions(4),
            ))
            .build(),
    )
}

async fn declared(ctx: &SessionContext, sql: &str, name: &str) -> Arc<dyn TableProvider> {
    crate::sql::run(ctx, sql).await.unwrap();
    ctx.table_provider(name).await.unwrap()
}

fn spec_of(provider: &Arc<dyn TableProvider>) -> &SinkSpec {
    provider
        .downcast_ref::<SinkTable>()
        .expect("a sink table")
        .spec()
        .expect("declared in SQL")
}

use crate::sql::SinkSpec;

#[tokio::test]
async fn every_connectors_table_survives_the_logical_codec() {
    let ctx = session();
    let codec = SinkLogicalCodec::default();
    for (kind, sample) in declarations() {
        let (name, sql) = (sample.name, sample.create);
        let provider = declared(&ctx, sql, name).await;
        let mut buf = Vec::new();
        codec
            .try_encode_table_provider(&TableReference::bare(name), provider.clone(), &mut buf)
            .unwrap();
        let decoded = codec
            .try_decode_table_provider(
                &buf,
                &TableReference::bare(name),
                provider.schema(),
                &ctx.task_ctx(),
            )
            .unwrap();
        let (before, after) = (spec_of(&provider), spec_of(&decoded));
        assert_eq!(before, after, "{kind}");
        assert_eq!(after.kind(), kind);
        let table = decoded.downcast_ref::<SinkTable>().unwrap();
        assert_eq!(table.sink().kind(), kind);
        assert_eq!(table.sink().schema(), &provider.schema());
        let original = provider.downcast_ref::<SinkTable>().unwrap();
        assert_eq!(table.sink().routing(), original.sink().routing(), "{kind}");
        assert_eq!(table.sink().parallelism(), original.sink().parallelism());
        assert_eq!(table.declaration(), original.declaration(), "{kind}");
        assert!(after.emulator_host().is_some(), "{kind}");
    }
}

#[tokio::test]
async fn an_insert_plan_carries_its_sink_table() {
    let ctx = session();
    let SampleTable {
        name, create: sql, ..
    } = pubsub_sample();
    let provider = declared(&ctx, sql, name).await;
    let plan = ctx
        .sql("INSERT INTO clicks VALUES ('a', 1, 'x'), ('b', 2, 'y')")
        .await
        .unwrap()
        .into_unoptimized_plan();
    let codec = SinkLogicalCodec::default();
    let bytes = logical_plan_to_bytes_with_extension_codec(&plan, &codec).unwrap();
    let back =
        logical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &codec).unwrap();
    let LogicalPlan::Dml(dml) = &back else {
        panic!("not an INSERT: {back}");
    };
    let target = datafusion::datasource::source_as_provider(&dml.target).unwrap();
    assert_eq!(spec_of(&target), spec_of(&provider));
    assert_eq!(format!("{plan}"), format!("{back}"));
}

#[tokio::test]
async fn a_table_declared_in_rust_is_refused_with_a_reason() {
    let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
        datafusion::arrow::datatypes::Field::new(
            "data",
            datafusion::arrow::datatypes::DataType::Utf8,
            false,
        ),
    ]));
    let options = <crate::connectors::pubsub::sink::options::PubSubSinkOptions as crate::connectors::TableOptions>::from_raw(
        Some("projects/demo/topics/events"),
        &crate::options::RawOptions::from_pairs(Vec::<(String, String)>::new()).unwrap(),
    )
    .unwrap();
    let sink =
        crate::connectors::pubsub::sink::writer::PubSubSink::from_options(schema, options).unwrap();
    let table: Arc<dyn TableProvider> = Arc::new(SinkTable::new("typed", Arc::new(sink)));
    let err = SinkLogicalCodec::default()
        .try_encode_table_provider(&TableReference::bare("typed"), table, &mut Vec::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'typed'") && err.contains("CREATE EXTERNAL TABLE"),
        "{err}"
    );
}

/// A source only the local engine can run (a table function) is refused with its name and
/// what does travel, not with DataFusion's "LogicalExtensionCodec is not provided".
#[tokio::test]
async fn a_source_no_codec_carries_is_refused_naming_it() {
    let ctx = session();
    let SampleTable {
        name, create: sql, ..
    } = pubsub_sample();
    declared(&ctx, sql, name).await;
    let plan = ctx
        .sql("INSERT INTO clicks SELECT 'k', value, 'x' FROM generate_series(1, 10)")
        .await
        .unwrap()
        .into_unoptimized_plan();
    let err = logical_plan_to_bytes_with_extension_codec(&plan, &SinkLogicalCodec::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'generate_series") && err.contains("cannot be sent to a cluster"),
        "{err}"
    );
    assert!(err.contains("file tables"), "{err}");
}

/// A subscription source cannot run on a cluster: refused naming the table and why.
#[tokio::test]
async fn a_subscription_source_is_refused_naming_it_and_why() {
    let ctx = session();
    let SampleTable {
        name, create: sql, ..
    } = pubsub_sample();
    declared(&ctx, sql, name).await;
    crate::sql::run(
        &ctx,
        "CREATE TABLE clicks_in (k VARCHAR, n BIGINT, v VARCHAR) WITH (connector = 'pubsub', \
         subscription = 'projects/demo/subscriptions/clicks', emulator_host = 'localhost:1')",
    )
    .await
    .unwrap();
    let plan = ctx
        .sql("INSERT INTO clicks SELECT k, n, v FROM clicks_in")
        .await
        .unwrap()
        .into_unoptimized_plan();
    let err = logical_plan_to_bytes_with_extension_codec(&plan, &SinkLogicalCodec::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'clicks_in'")
            && err.contains("cannot be sent to a cluster")
            && err.contains("without --cluster"),
        "{err}"
    );
}

#[tokio::test]
async fn garbage_after_the_tag_is_an_error_not_a_table() {
    let ctx = session();
    let mut buf = codec::TABLE_TAG.to_vec();
    buf.extend_from_slice(&[0xff, 0xff, 0xff]);
    let err = SinkLogicalCodec::default()
        .try_decode_table_provider(
            &buf,
            &TableReference::bare("t"),
            Arc::new(datafusion::arrow::datatypes::Schema::empty()),
            &ctx.task_ctx(),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("decoding a sink table"), "{err}");
}

fn find_writer(plan: &Arc<dyn ExecutionPlan>) -> Option<&SinkWriterExec> {
    if let Some(writer) = plan.downcast_ref::<SinkWriterExec>() {
        return Some(writer);
    }
    plan.children().into_iter().find_map(find_writer)
}

#[tokio::test]
async fn the_sink_nodes_survive_the_physical_codec() {
    let ctx = session();
    for (kind, sample) in declarations() {
        declared(&ctx, sample.create, sample.name).await;
        let plan = ctx
            .sql(sample.insert)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let codec = SinkPhysicalCodec::default();
        let bytes = physical_plan_to_bytes_with_extension_codec(plan.clone(), &codec).unwrap();
        let back =
            physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &codec).unwrap();
        let shown = |p: &Arc<dyn ExecutionPlan>| displayable(p.as_ref()).indent(true).to_string();
        assert_eq!(shown(&plan), shown(&back), "{kind}");
        let (before, after) = (find_writer(&plan).unwrap(), find_writer(&back).unwrap());
        assert_eq!(before.spec(), after.spec(), "{kind}");
        assert_eq!(before.writers(), after.writers(), "{kind}");
        assert_eq!(before.routing(), after.routing(), "{kind}");
        assert_eq!(
            before.ordering().map(|o| o.to_string()),
            after.ordering().map(|o| o.to_string()),
            "{kind}"
        );
        if kind == crate::connectors::pubsub::KIND {
            assert!(after.ordering().is_some(), "{}", shown(&back));
        }
        assert!(shown(&back).contains("SinkCountExec"), "{}", shown(&back));
    }
}

#[tokio::test]
async fn an_order_by_a_column_not_inserted_keeps_its_hidden_columns_through_the_physical_codec() {
    let ctx = session();
    let sample = pubsub_sample();
    declared(&ctx, sample.create, sample.name).await;
    // `ts` is not inserted: the writers keep its order in a hidden column.
    let plan = ctx
        .sql(
            "INSERT INTO clicks SELECT CAST(id AS VARCHAR) AS k, id AS seq, 'n' AS note \
             FROM (SELECT id, (id * 7) % 5 AS ts FROM (SELECT unnest(range(1, 5)) AS id)) \
             ORDER BY ts DESC",
        )
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let codec = SinkPhysicalCodec::default();
    let bytes = physical_plan_to_bytes_with_extension_codec(plan.clone(), &codec).unwrap();
    let back =
        physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &codec).unwrap();
    let shown = |p: &Arc<dyn ExecutionPlan>| displayable(p.as_ref()).indent(true).to_string();
    assert_eq!(shown(&plan), shown(&back));
    let after = find_writer(&back).unwrap();
    assert_eq!(after.hidden_columns(), 1, "{}", shown(&back));
    assert_eq!(
        after.ordering().map(|o| o.to_string()),
        Some("__order_0(ts)@3 DESC".to_string()),
        "{}",
        shown(&back)
    );
}

#[test]
fn cluster_addresses_are_df_or_http_with_a_host_and_a_port() {
    assert_eq!(
        scheduler_url("df://10.0.0.5:50050").unwrap(),
        "http://10.0.0.5:50050"
    );
    assert_eq!(
        scheduler_url("http://localhost:50050").unwrap(),
        "http://localhost:50050"
    );
    for bad in ["localhost:50050", "df://localhost", "not a url"] {
        let err = scheduler_url(bad).unwrap_err().to_string();
        assert!(err.contains("df://HOST:PORT"), "{bad}: {err}");
    }
}
