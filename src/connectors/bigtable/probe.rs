//! The readiness probe of the Bigtable emulator (feature `testing`): one real `ListTables (admin API)` call,
//! which answers only once the emulator serves its API. The emulator launcher calls it, with
//! every connector's probe behind this one signature.

use gcloud_sdk::google::bigtable::admin::v2::ListTablesRequest;
use gcloud_sdk::google::bigtable::admin::v2::bigtable_table_admin_client::BigtableTableAdminClient;

use crate::connectors::google::GrpcChannel;

/// Makes one `ListTables (admin API)` call on `channel`; `Ok` once the emulator answers it.
pub async fn probe(channel: GrpcChannel) -> std::result::Result<(), tonic::Status> {
    BigtableTableAdminClient::new(channel)
        .list_tables(ListTablesRequest {
            parent: "projects/readiness/instances/readiness".into(),
            ..Default::default()
        })
        .await
        .map(drop)
}
