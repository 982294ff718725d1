//! A DataFusion application with the gcp-sql sinks and nothing else of the crate: it registers
//! the sink factories in its own [`SessionContext`], declares a Pub/Sub sink in SQL both ways,
//! and prints the physical plan of an `INSERT` into it. Planning contacts no service, so this
//! runs anywhere.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = SessionContext::new();
    gcp_sql::sql::register(&ctx);

    // DataFusion's own DDL works through the plain DataFusion API once the factories are in.
    ctx.sql(
        "CREATE EXTERNAL TABLE clicks (user_id BIGINT, url VARCHAR)
         STORED AS PUBSUB LOCATION 'projects/demo/topics/clicks'",
    )
    .await?;

    // The WITH form is rewritten by gcp_sql::sql::run (or statement_to_dataframe).
    gcp_sql::sql::run(
        &ctx,
        "CREATE TABLE clicks_by_url (url VARCHAR, n BIGINT)
           WITH (connector = 'pubsub', topic = 'projects/demo/topics/clicks-by-url')",
    )
    .await?;

    // register() installs the sinks only, not the emulator inspection functions.
    let functions = ctx.state().table_functions().clone();
    assert!(!functions.contains_key("pubsub_pull"));

    for sql in [
        "EXPLAIN INSERT INTO clicks VALUES (1, 'https://example.com/a'), (2, 'https://example.com/b')",
        "EXPLAIN INSERT INTO clicks_by_url
           SELECT 'https://example.com/' || CAST(value % 3 AS VARCHAR) AS url, count(*)
           FROM generate_series(1, 10) GROUP BY url",
    ] {
        let batches = ctx.sql(sql).await?.collect().await?;
        println!("{sql}\n{}\n", pretty_format_batches(&batches)?);
    }
    Ok(())
}
