//! The gRPC side of the Bigtable sink: a [`Transport`] over `google.bigtable.v2.Bigtable`
//! `MutateRows`, with table auto-creation on the admin API.
//!
//! # Connections
//!
//! - **Emulator** (`emulator_host`, else `BIGTABLE_EMULATOR_HOST`): plaintext channels from
//!   [`crate::google::plaintext_endpoint`] (no HTTP/2 keepalive pings, no credentials); the
//!   admin API is served at the same address.
//! - **Google**: TLS with the webpki roots and OAuth tokens through gcloud-sdk's auth middleware,
//!   to `endpoint` (default [`DEFAULT_ENDPOINT`]) for data and [`DEFAULT_ADMIN_ENDPOINT`] for the
//!   admin API (a custom `endpoint` serves both). Credentials come from `credentials_file`, else
//!   Application Default Credentials; they are loaded once, when the statement starts, so a
//!   credentials problem fails it before any row is read.
//!
//! # One client per instance
//!
//! The core keeps one [`BigtableTableClient`] per table (its batches and counters). The channel
//! itself belongs to the table's *instance*: every table of one `projects/P/instances/I` shares
//! it. At most `max_active_instances` instance channels are open or closing at once. A send for
//! an instance without a channel takes a free slot; when there is none, the least recently used
//! instance is evicted and the send waits until one of the evicted channels has finished its
//! in-flight calls (a slot is held until the channel is really gone). A later send for an evicted
//! instance opens a new channel transparently. A channel also closes when the last table of its
//! instance is released (idle eviction or the end of the statement). See ADR 0020 for how this
//! differs from the Java connector whose options this one follows.
//!
//! # Sending
//!
//! `write_mode = 'insert_if_absent'` and `'increment'` apply each row by its own call
//! (`CheckAndMutateRow` with no predicate, i.e. "the row has any cell", and the row's cells as
//! its false mutations; `ReadModifyWriteRow` with one increment rule per cell). The core still
//! batches and bounds them: a batch's rows are sent as concurrent calls, and its statuses come
//! back per record as for `MutateRows`. A changelog's deletes go in one `MutateRows`.
//!
//! A batch of [`BigtableEntry`]s, already serialized, becomes a `MutateRowsRequest` body by
//! concatenation, sent as a server-streaming call on the generated client's method path. The
//! per-entry statuses of the response stream are collected by index into
//! [`SendOutcome::PerRecord`]; a failed call is [`SendOutcome::Whole`]. An entry the stream never
//! reported (the stream ended early) gets the stream's error, or `UNAVAILABLE` when it ended
//! cleanly, so it is retried rather than taken as delivered. A per-entry failure carries the row
//! number and row key in its message, and is marked as an entry status for classification.
//!
//! A response may carry a `RateLimitInfo` (the service asks the client to multiply its load by
//! `factor`, and not to change it again before `period`); the last one of a call is kept for
//! the core ([`Transport::take_load_hint`]), which slows the writer's admission rate down.
//!
//! # Classification
//!
//! | status | class |
//! |---|---|
//! | `DEADLINE_EXCEEDED`, `UNAVAILABLE`, `ABORTED` (call or entry) | [`Class::Retryable`] (the Java client retries the first two per entry, the Go client adds `ABORTED`) |
//! | `RESOURCE_EXHAUSTED` (call or entry) | [`Class::Retryable`]: a throttled cluster or a full mutation queue slows the statement down under the retry budget rather than failing it (ADR 0028; the official clients do not retry it, see `docs/service_facts.md`) |
//! | `NOT_FOUND` (call: the table is missing; entry: a column family is missing) | [`Class::NotFound`]: auto-creation when `auto_create_table`, else fatal |
//! | `INVALID_ARGUMENT` | [`Class::Rejected`] (isolation pass, then the failure policy) |
//! | `INTERNAL` on an entry whose message names an unknown column family | [`Class::NotFound`] (how the emulator reports a missing family) |
//! | other `INTERNAL` on an entry | [`Class::Rejected`]: the emulator (`cbtemulator`) reports every per-entry refusal as `INTERNAL` where the service says `INVALID_ARGUMENT`; the isolation pass confirms it against the entry alone before the failure policy sees it |
//! | `UNKNOWN` or `FAILED_PRECONDITION` of one row's `CheckAndMutateRow` / `ReadModifyWriteRow` | [`Class::Rejected`] (`UNKNOWN` naming a family: [`Class::NotFound`]): how the emulator refuses an increment of a cell that is not 8 bytes, or a missing family |
//! | under `write_mode = 'increment'` or `'add_to_cell'`, anything retryable above | [`Class::Fatal`]: an add is not idempotent, so it is never retried (as the official clients never retry `ReadModifyWriteRow`) |
//! | anything else (`PERMISSION_DENIED`, `UNAUTHENTICATED`, `INTERNAL` on the call, ...) | [`Class::Fatal`] |
//!
//! A connection the emulator's address refuses before anything has answered there is
//! [`Class::Fatal`] too, with a message saying that nothing answers at that address (see
//! [`Reachability`]); once the emulator has answered, a refused or broken connection is
//! `UNAVAILABLE` and retried.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use gcloud_sdk::google::bigtable::admin::v2::bigtable_table_admin_client::BigtableTableAdminClient;
use gcloud_sdk::google::bigtable::admin::v2::modify_column_families_request::{
    Modification, modification,
};
use gcloud_sdk::google::bigtable::admin::v2::{
    ColumnFamily, CreateTableRequest, GetTableRequest, ModifyColumnFamiliesRequest, Table, table,
};
use gcloud_sdk::google::bigtable::v2::bigtable_client::BigtableClient;
use gcloud_sdk::google::bigtable::v2::{
    CheckAndMutateRowRequest, MutateRowsResponse, ReadModifyWriteRowRequest,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Code;
use tonic::codegen::http;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};

use super::mapping::{
    BigtableEntry, EntryKind, request_base_len, request_entry_len, write_mutate_rows_request,
};
use crate::connectors::bigtable::names;
use crate::connectors::bigtable::options::WriteMode;
use crate::core::{Class, Destination, LoadHint, SendOutcome, Transport};
use crate::error::{Error, Result};
use crate::google::{
    self, Connection, GrpcChannel, PreEncoded, ROUTING_HEADER, Reachability, emulator_setting,
    nothing_listens, routing_value, with_deadline,
};

/// The Bigtable data endpoint used when no `endpoint` is set.
pub const DEFAULT_ENDPOINT: &str = "https://bigtable.googleapis.com";
/// The Bigtable admin endpoint (table creation) used when no `endpoint` is set.
pub const DEFAULT_ADMIN_ENDPOINT: &str = "https://bigtableadmin.googleapis.com";
/// Deadline of each admin call the auto-create recovery makes (`CreateTable`, `GetTable`,
/// `ModifyColumnFamilies`). Our bound: the admin API sets none, and a minute is what the Java
/// client allows a `MutateRows` attempt.
pub const ADMIN_CALL_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) const MUTATE_ROWS_PATH: &str = "/google.bigtable.v2.Bigtable/MutateRows";
/// The gRPC path of `ReadRows`.
pub(crate) const READ_ROWS_PATH: &str = "/google.bigtable.v2.Bigtable/ReadRows";
/// Appended to the status of an add (`increment`, `add_to_cell`) that failed in a way other
/// writes retry.
const NOT_RETRIED: &str = " (an add to a counter is not retried: it is not idempotent, and \
                           whether this one was applied is unknown)";
/// Metadata key marking a status as one entry's (not the whole call's), for classification.
const ENTRY_SCOPE_KEY: &str = "x-gcp-sql-entry-status";

/// Connection settings of a [`BigtableTransport`], as plain values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSettings {
    /// The data endpoint (`endpoint`); [`DEFAULT_ENDPOINT`] when `None`. A custom endpoint also
    /// serves the admin API.
    pub endpoint: Option<String>,
    /// An emulator address, `host:port` (`emulator_host`, or `BIGTABLE_EMULATOR_HOST` as the
    /// table options resolved it).
    pub emulator_host: Option<String>,
    /// A credentials JSON file (`credentials_file`); Application Default Credentials when `None`.
    pub credentials_file: Option<std::path::PathBuf>,
    /// The application profile writes are routed by (`app_profile_id`); the instance's default
    /// profile when `None`.
    pub app_profile_id: Option<String>,
    /// Whether the transport may create missing tables and families (`auto_create_table`).
    pub auto_create_table: bool,
    /// The column families a created table gets (the ones the mapping writes).
    pub families: Vec<String>,
    /// Open-or-closing instance channels (`max_active_instances`).
    pub max_active_instances: usize,
    /// How rows are applied (`write_mode`): which calls the transport makes, and under
    /// `increment` and `add_to_cell` (adds are not idempotent) a failure that would be retried
    /// fails the statement instead.
    pub write_mode: WriteMode,
}

impl ClientSettings {
    /// The emulator address in effect (an empty one counts as none).
    ///
    /// `BIGTABLE_EMULATOR_HOST` is not read here: the table options resolved it when the table was
    /// declared, where an explicit `endpoint` turns it off. Reading it again at connect time
    /// would send a table with an explicit endpoint to the emulator.
    pub fn effective_emulator_host(&self) -> Option<String> {
        self.emulator_host.clone().filter(|h| !h.trim().is_empty())
    }
}

/// An open instance channel; its pool slot is held until the last reference is gone.
struct Slot {
    service: GrpcChannel,
    _permit: OwnedSemaphorePermit,
}

struct OpenInstance {
    slot: Arc<Slot>,
    last_used: u64,
}

#[derive(Default)]
struct PoolState {
    open: HashMap<Arc<str>, OpenInstance>,
    /// Open table clients per instance.
    tables: HashMap<Arc<str>, usize>,
    tick: u64,
}

/// The instance channels, capped at `max_active_instances` open-or-closing ones.
struct InstancePool {
    permits: Arc<Semaphore>,
    state: Mutex<PoolState>,
}

fn lock<M>(m: &Mutex<M>) -> std::sync::MutexGuard<'_, M> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl InstancePool {
    fn new(cap: usize) -> Self {
        InstancePool {
            permits: Arc::new(Semaphore::new(cap.clamp(1, Semaphore::MAX_PERMITS))),
            state: Mutex::default(),
        }
    }

    /// The open channel of `instance`, if any, marked as used now.
    fn get(&self, instance: &str) -> Option<Arc<Slot>> {
        let mut s = lock(&self.state);
        s.tick += 1;
        let tick = s.tick;
        s.open.get_mut(instance).map(|o| {
            o.last_used = tick;
            o.slot.clone()
        })
    }

    /// Evicts the least recently used instance channel; it closes once its calls finish.
    fn evict_lru(&self) {
        let mut s = lock(&self.state);
        let lru = s
            .open
            .iter()
            .min_by_key(|(_, o)| o.last_used)
            .map(|(k, _)| k.clone());
        if let Some(name) = lru {
            s.open.remove(&name);
            tracing::info!(instance = %name, "evicting the least recently used instance client (max_active_instances)");
        }
    }

    fn insert(&self, instance: &Arc<str>, slot: Slot) -> Arc<Slot> {
        let mut s = lock(&self.state);
        s.tick += 1;
        let tick = s.tick;
        // Another send may have opened it meanwhile: keep that one, drop ours (and its slot).
        if let Some(o) = s.open.get_mut(instance) {
            o.last_used = tick;
            return o.slot.clone();
        }
        let slot = Arc::new(slot);
        s.open.insert(
            instance.clone(),
            OpenInstance {
                slot: slot.clone(),
                last_used: tick,
            },
        );
        tracing::debug!(%instance, "opened an instance client");
        slot
    }

    fn table_opened(&self, instance: &Arc<str>) {
        *lock(&self.state)
            .tables
            .entry(instance.clone())
            .or_default() += 1;
    }

    /// A table client was released; the instance channel closes with its last table.
    fn table_closed(&self, instance: &Arc<str>) {
        let mut s = lock(&self.state);
        let left = match s.tables.get_mut(instance) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n
            }
            None => 0,
        };
        if left == 0 {
            s.tables.remove(instance);
            if s.open.remove(instance).is_some() {
                tracing::info!(%instance, "closed an instance client (its last table was released)");
            }
        }
    }

    fn open_count(&self) -> usize {
        lock(&self.state).open.len()
    }
}

/// The Bigtable [`Transport`]: instance channels shared by their tables, a
/// [`BigtableTableClient`] handle per table.
pub struct BigtableTransport {
    /// How channels are made: instance and admin channels of a Google connection reuse the
    /// data-endpoint client's auth.
    connection: Connection,
    endpoint: String,
    admin_endpoint: String,
    app_profile_id: String,
    auto_create_table: bool,
    families: Vec<String>,
    instances: InstancePool,
    admin: tokio::sync::OnceCell<GrpcChannel>,
    /// Whether anything answered at the data address yet.
    reach: Reachability,
    /// The latest `RateLimitInfo` a `MutateRows` response carried, for the core to take.
    load_hint: Mutex<Option<LoadHint>>,
    /// How rows are applied; under `increment` and `add_to_cell` nothing is retried, and
    /// under `add_to_cell` created families are aggregates.
    write_mode: WriteMode,
}

impl std::fmt::Debug for BigtableTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BigtableTransport")
            .field("endpoint", &self.endpoint)
            .field("admin_endpoint", &self.admin_endpoint)
            .field("emulator", &self.connection.is_plaintext())
            .field("app_profile_id", &self.app_profile_id)
            .field("auto_create_table", &self.auto_create_table)
            .field("families", &self.families)
            .finish()
    }
}

/// A per-table handle: the table's instance (whose channel it uses) and routing header.
#[derive(Debug, Clone)]
pub struct BigtableTableClient {
    instance: Arc<str>,
    routing: AsciiMetadataValue,
}

impl BigtableTransport {
    /// Prepares the connection.
    ///
    /// For an emulator nothing connects until the first call. For Google, the credentials are
    /// loaded and the TLS channel to the data endpoint is connected here; failures are
    /// [`Error::Connect`] naming the endpoint.
    pub async fn connect(settings: &ClientSettings) -> Result<Self> {
        if let Some(host) = settings.effective_emulator_host() {
            return Self::plaintext(&host, settings);
        }
        let (endpoint, admin_endpoint) = match &settings.endpoint {
            Some(e) => (e.clone(), e.clone()),
            None => (
                DEFAULT_ENDPOINT.to_string(),
                DEFAULT_ADMIN_ENDPOINT.to_string(),
            ),
        };
        let connection =
            Connection::open(None, &endpoint, settings.credentials_file.as_deref()).await?;
        Ok(Self::with_connection(
            connection,
            endpoint.clone(),
            admin_endpoint,
            settings,
        ))
    }

    /// A transport whose channels go to a plaintext address (an emulator or a fake server).
    pub fn plaintext(host: &str, settings: &ClientSettings) -> Result<Self> {
        Ok(Self::with_connection(
            Connection::plaintext(host)?,
            host.to_string(),
            host.to_string(),
            settings,
        ))
    }

    fn with_connection(
        connection: Connection,
        endpoint: String,
        admin_endpoint: String,
        settings: &ClientSettings,
    ) -> Self {
        let reach = if connection.is_plaintext() {
            Reachability::emulator(
                &endpoint,
                emulator_setting(
                    &endpoint,
                    crate::connectors::bigtable::KIND.emulator_env_var(),
                ),
            )
        } else {
            Reachability::endpoint(&endpoint)
        };
        BigtableTransport {
            reach,
            connection,
            endpoint,
            admin_endpoint,
            app_profile_id: settings.app_profile_id.clone().unwrap_or_default(),
            auto_create_table: settings.auto_create_table,
            families: settings.families.clone(),
            instances: InstancePool::new(settings.max_active_instances),
            admin: tokio::sync::OnceCell::new(),
            load_hint: Mutex::new(None),
            write_mode: settings.write_mode,
        }
    }

    /// The data endpoint or emulator address this transport talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Instance channels open right now (at most `max_active_instances`).
    pub fn open_instances(&self) -> usize {
        self.instances.open_count()
    }

    /// A new channel to `url` (the data or admin endpoint).
    async fn new_service(&self, url: &str) -> std::result::Result<GrpcChannel, String> {
        self.connection.channel_to(url).await
    }

    /// The channel of `instance`, opening it (and evicting the least recently used one at the
    /// cap) when needed.
    async fn instance_channel(
        &self,
        instance: &Arc<str>,
    ) -> std::result::Result<Arc<Slot>, tonic::Status> {
        if let Some(slot) = self.instances.get(instance) {
            return Ok(slot);
        }
        let permit = match self.instances.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.instances.evict_lru();
                // The evicted channel frees its slot once its in-flight calls are done.
                self.instances
                    .permits
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| tonic::Status::cancelled("the instance pool is closed"))?
            }
        };
        if let Some(slot) = self.instances.get(instance) {
            return Ok(slot);
        }
        let service = self.new_service(&self.endpoint).await.map_err(|e| {
            tonic::Status::unavailable(format!(
                "cannot open a channel to {} for {instance}: {e}",
                self.endpoint
            ))
        })?;
        Ok(self.instances.insert(
            instance,
            Slot {
                service,
                _permit: permit,
            },
        ))
    }

    async fn admin_service(&self) -> Result<GrpcChannel> {
        self.admin
            .get_or_try_init(|| async {
                self.new_service(&self.admin_endpoint)
                    .await
                    .map_err(|message| Error::Connect {
                        endpoint: self.admin_endpoint.clone(),
                        message,
                    })
            })
            .await
            .cloned()
    }
}

/// One `MutateRows` call: the statuses of the entries, by index (`None`: not reported), and
/// the last `RateLimitInfo` of the stream in `hint`.
async fn mutate_rows_on(
    service: GrpcChannel,
    request: tonic::Request<PreEncoded>,
    statuses: &mut [Option<std::result::Result<(), tonic::Status>>],
    hint: &mut Option<LoadHint>,
    describe: impl Fn(usize, tonic::Status) -> tonic::Status,
) -> std::result::Result<(), tonic::Status> {
    let mut grpc = google::ready(service).await?;
    let codec = tonic_prost::ProstCodec::<PreEncoded, MutateRowsResponse>::default();
    let mut stream = grpc
        .server_streaming(
            request,
            http::uri::PathAndQuery::from_static(MUTATE_ROWS_PATH),
            codec,
        )
        .await?
        .into_inner();
    while let Some(response) = stream.message().await? {
        if let Some(info) = response.rate_limit_info {
            *hint = Some(load_hint(&info));
        }
        for entry in response.entries {
            let Some(slot) = usize::try_from(entry.index)
                .ok()
                .and_then(|i| statuses.get_mut(i).map(|s| (i, s)))
            else {
                tracing::warn!(
                    index = entry.index,
                    "MutateRows reported an entry index outside the request"
                );
                continue;
            };
            let (i, slot) = slot;
            let status = entry.status.unwrap_or_default();
            *slot = Some(if status.code == Code::Ok as i32 {
                Ok(())
            } else {
                Err(describe(
                    i,
                    tonic::Status::new(Code::from(status.code), status.message),
                ))
            });
        }
    }
    Ok(())
}

/// A `RateLimitInfo` as the core's [`LoadHint`]: its factor, and its period (a missing or
/// negative one as zero, which the core raises to its shortest period).
pub fn load_hint(info: &gcloud_sdk::google::bigtable::v2::RateLimitInfo) -> LoadHint {
    let period = info
        .period
        .and_then(|p| {
            let secs = u64::try_from(p.seconds).ok()?;
            let nanos = u32::try_from(p.nanos).ok()?;
            Some(Duration::new(secs, 0).saturating_add(Duration::from_nanos(u64::from(nanos))))
        })
        .unwrap_or(Duration::ZERO);
    LoadHint {
        factor: info.factor,
        period,
    }
}

/// Whether a status is one entry's (as opposed to the whole call's).
pub fn is_entry_status(status: &tonic::Status) -> bool {
    status.metadata().get(ENTRY_SCOPE_KEY).is_some()
}

/// Marks `status` as the status of one entry.
pub fn entry_status(status: tonic::Status) -> tonic::Status {
    let mut status = status;
    status
        .metadata_mut()
        .insert(ENTRY_SCOPE_KEY, MetadataValue::from_static("1"));
    status
}

/// Whether an entry's `INTERNAL` message says a column family is missing (how the emulator
/// words it: `unknown family "cf"`).
fn names_unknown_family(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("family")
        && (m.contains("unknown") || m.contains("not found") || m.contains("does not exist"))
}

/// The class of a `MutateRows` status; see the module docs.
pub fn classify_mutate_rows_status(status: &tonic::Status) -> Class {
    let entry = is_entry_status(status);
    match status.code() {
        Code::Ok => Class::Ok,
        // RESOURCE_EXHAUSTED is overload, not a bad request: retried with backoff (ADR 0028).
        Code::DeadlineExceeded | Code::Unavailable | Code::Aborted | Code::ResourceExhausted => {
            Class::Retryable
        }
        Code::NotFound => Class::NotFound,
        Code::InvalidArgument => Class::Rejected,
        Code::Internal | Code::Unknown if entry && names_unknown_family(status.message()) => {
            Class::NotFound
        }
        Code::Internal | Code::Unknown | Code::FailedPrecondition if entry => Class::Rejected,
        _ => Class::Fatal,
    }
}

fn admin_error(operation: &'static str, destination: &str, status: &tonic::Status) -> Error {
    Error::rpc(operation, destination, status, 1)
}

fn admin_request<M>(message: M, routing: (&str, &str), google: bool) -> Result<tonic::Request<M>> {
    let mut request = with_deadline(
        tonic::Request::new(message),
        Some(ADMIN_CALL_TIMEOUT),
        google,
    );
    let value =
        routing_value(&[routing]).map_err(|e| Error::invalid("table", routing.1.to_string(), e))?;
    request.metadata_mut().insert(ROUTING_HEADER, value);
    Ok(request)
}

impl BigtableTransport {
    /// A column family as the auto-create recovery makes it: under `write_mode =
    /// 'add_to_cell'` an aggregate family summing 64-bit integers, else a plain one.
    fn new_family(&self) -> ColumnFamily {
        use gcloud_sdk::google::bigtable::admin::v2::r#type::{self, Aggregate, Int64, aggregate};
        if self.write_mode != WriteMode::AddToCell {
            return ColumnFamily::default();
        }
        let int64 = gcloud_sdk::google::bigtable::admin::v2::Type {
            kind: Some(r#type::Kind::Int64Type(Int64::default())),
        };
        ColumnFamily {
            value_type: Some(gcloud_sdk::google::bigtable::admin::v2::Type {
                kind: Some(r#type::Kind::AggregateType(Box::new(Aggregate {
                    input_type: Some(Box::new(int64)),
                    state_type: None,
                    aggregator: Some(aggregate::Aggregator::Sum(aggregate::Sum {})),
                }))),
            }),
            ..Default::default()
        }
    }

    /// Adds the mapping's families the existing table `destination` lacks. Returns whether it
    /// added any.
    async fn ensure_families(&self, service: &GrpcChannel, destination: &str) -> Result<bool> {
        let google = service.is_google();
        let request = admin_request(
            GetTableRequest {
                name: destination.to_string(),
                view: table::View::SchemaView as i32,
            },
            ("name", destination),
            google,
        )?;
        let existing = BigtableTableAdminClient::new(service.clone())
            .get_table(request)
            .await
            .map_err(|s| admin_error("GetTable", destination, &s))?
            .into_inner();
        let missing: Vec<&String> = self
            .families
            .iter()
            .filter(|f| !existing.column_families.contains_key(*f))
            .collect();
        if missing.is_empty() {
            return Ok(false);
        }
        let request = admin_request(
            ModifyColumnFamiliesRequest {
                name: destination.to_string(),
                modifications: missing
                    .iter()
                    .map(|f| Modification {
                        id: f.to_string(),
                        update_mask: None,
                        r#mod: Some(modification::Mod::Create(self.new_family())),
                    })
                    .collect(),
                ignore_warnings: false,
            },
            ("name", destination),
            google,
        )?;
        match BigtableTableAdminClient::new(service.clone())
            .modify_column_families(request)
            .await
        {
            Ok(_) => {
                tracing::info!(table = %destination, families = ?missing, "added missing column families");
                Ok(true)
            }
            // Another writer added them meanwhile.
            Err(s) if s.code() == Code::AlreadyExists => Ok(false),
            Err(s) => Err(admin_error("ModifyColumnFamilies", destination, &s)),
        }
    }
}

#[async_trait]
impl Transport for BigtableTransport {
    type Record = BigtableEntry;
    type Client = BigtableTableClient;

    fn operation(&self) -> &'static str {
        match self.write_mode {
            WriteMode::Upsert | WriteMode::ReplaceRow | WriteMode::AddToCell => "MutateRows",
            WriteMode::InsertIfAbsent => "CheckAndMutateRow",
            WriteMode::Increment => "ReadModifyWriteRow",
        }
    }

    async fn open(&self, destination: &Destination) -> Result<BigtableTableClient> {
        let instance = names::instance_of_table(destination).ok_or_else(|| {
            Error::invalid(
                "table",
                destination.to_string(),
                "expected projects/PROJECT/instances/INSTANCE/tables/TABLE",
            )
        })?;
        let mut pairs = vec![("table_name", &**destination)];
        if !self.app_profile_id.is_empty() {
            pairs.push(("app_profile_id", self.app_profile_id.as_str()));
        }
        let routing = routing_value(&pairs).map_err(|e| {
            Error::invalid(
                "table",
                destination.to_string(),
                format!("cannot route to it: {e}"),
            )
        })?;
        let instance: Arc<str> = Arc::from(instance);
        self.instances.table_opened(&instance);
        Ok(BigtableTableClient { instance, routing })
    }

    async fn send(
        &self,
        client: &BigtableTableClient,
        destination: &Destination,
        batch: &[&BigtableEntry],
        timeout: Option<Duration>,
    ) -> SendOutcome {
        let slot = match self.instance_channel(&client.instance).await {
            Ok(slot) => slot,
            Err(status) => return SendOutcome::Whole(Err(status)),
        };
        if batch.iter().all(|e| e.kind() == EntryKind::Mutate) {
            return self
                .mutate_rows(slot, client, destination, batch, timeout)
                .await;
        }
        self.send_mixed(slot, client, destination, batch, timeout)
            .await
    }
    fn classify(&self, status: &tonic::Status, _solo: bool) -> Class {
        if nothing_listens(status) {
            // A refused first connection to the emulator: nothing to retry against.
            return Class::Fatal;
        }
        let class = classify_mutate_rows_status(status);
        if self.write_mode.adds() && class == Class::Retryable {
            // ReadModifyWriteRow and AddToCell are not idempotent: the official clients do not
            // retry the first, and this one retries neither (a retry after an unknown outcome
            // could count twice).
            return Class::Fatal;
        }
        class
    }

    async fn create_destination(
        &self,
        _client: &BigtableTableClient,
        destination: &Destination,
    ) -> Result<bool> {
        if !self.auto_create_table {
            return Err(Error::Unsupported(format!(
                "table '{destination}' is missing and 'auto_create_table' is off, so it is not created"
            )));
        }
        let Some((parent, table_id)) = destination.split_once("/tables/") else {
            return Err(Error::invalid(
                "table",
                destination.to_string(),
                "expected projects/PROJECT/instances/INSTANCE/tables/TABLE",
            ));
        };
        let service = self.admin_service().await?;
        let google = service.is_google();
        let request = admin_request(
            CreateTableRequest {
                parent: parent.to_string(),
                table_id: table_id.to_string(),
                table: Some(Table {
                    column_families: self
                        .families
                        .iter()
                        .map(|f| (f.clone(), self.new_family()))
                        .collect(),
                    ..Default::default()
                }),
                initial_splits: Vec::new(),
            },
            ("parent", parent),
            google,
        )?;
        match BigtableTableAdminClient::new(service.clone())
            .create_table(request)
            .await
        {
            Ok(_) => {
                tracing::info!(table = %destination, families = ?self.families, "created table {destination} (auto_create_table)");
                Ok(true)
            }
            // The table exists (created meanwhile): a NOT_FOUND then means a missing family.
            Err(s) if s.code() == Code::AlreadyExists => {
                self.ensure_families(&service, destination).await
            }
            Err(s) => Err(admin_error("CreateTable", destination, &s)),
        }
    }

    async fn close(&self, client: BigtableTableClient) {
        self.instances.table_closed(&client.instance);
    }

    fn take_load_hint(&self) -> Option<LoadHint> {
        lock(&self.load_hint).take()
    }
}

impl BigtableTransport {
    /// One `MutateRows` call carrying every entry of `batch` (all [`EntryKind::Mutate`]).
    async fn mutate_rows(
        &self,
        slot: Arc<Slot>,
        client: &BigtableTableClient,
        destination: &Destination,
        batch: &[&BigtableEntry],
        timeout: Option<Duration>,
    ) -> SendOutcome {
        let size = request_base_len(destination, &self.app_profile_id)
            + batch
                .iter()
                .map(|e| request_entry_len(e.encoded().len() as u64))
                .sum::<u64>();
        let mut body = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        write_mutate_rows_request(
            &mut body,
            destination,
            &self.app_profile_id,
            batch.iter().map(|e| e.encoded()),
        );
        let google = slot.service.is_google();
        let mut request = with_deadline(tonic::Request::new(PreEncoded(body)), timeout, google);
        request
            .metadata_mut()
            .insert(ROUTING_HEADER, client.routing.clone());
        let adds = self.write_mode.adds();
        let describe = |i: usize, status: tonic::Status| {
            let entry = batch[i];
            let not_retried = adds && classify_mutate_rows_status(&status) == Class::Retryable;
            entry_status(tonic::Status::new(
                status.code(),
                // The row key is a row's value: the row number and the key's size name it.
                format!(
                    "row {} (row key of {} bytes): {}{}",
                    entry.row(),
                    entry.row_key().len(),
                    status.message(),
                    if not_retried { NOT_RETRIED } else { "" }
                ),
            ))
        };
        let mut statuses: Vec<Option<std::result::Result<(), tonic::Status>>> =
            vec![None; batch.len()];
        let mut hint = None;
        let result = mutate_rows_on(
            slot.service.clone(),
            request,
            &mut statuses,
            &mut hint,
            describe,
        )
        .await;
        drop(slot);
        if hint.is_some() {
            *lock(&self.load_hint) = hint;
        }
        let reported = statuses.iter().filter(|s| s.is_some()).count();
        let result = if reported > 0 {
            self.reach.answered();
            result
        } else {
            self.reach.observe(result)
        };
        match result {
            Err(status) if reported == 0 => SendOutcome::Whole(Err(status)),
            result => {
                let missing = match result {
                    Err(status) => status,
                    Ok(()) => tonic::Status::unavailable(
                        "the MutateRows stream ended without a status for this entry",
                    ),
                };
                SendOutcome::PerRecord(
                    statuses
                        .into_iter()
                        .map(|s| s.unwrap_or_else(|| Err(missing.clone())))
                        .collect(),
                )
            }
        }
    }
}

impl BigtableTransport {
    /// A batch with entries applied one row at a time (`insert_if_absent`, `increment`): the
    /// [`EntryKind::Mutate`] entries (a changelog's deletes) in one `MutateRows`, each other
    /// entry in its own `CheckAndMutateRow` or `ReadModifyWriteRow`, all at once. The batch
    /// was admitted under the in-flight caps like any other, so the caps bound these calls too.
    async fn send_mixed(
        &self,
        slot: Arc<Slot>,
        client: &BigtableTableClient,
        destination: &Destination,
        batch: &[&BigtableEntry],
        timeout: Option<Duration>,
    ) -> SendOutcome {
        let (mutate, single): (Vec<usize>, Vec<usize>) =
            (0..batch.len()).partition(|&i| batch[i].kind() == EntryKind::Mutate);
        let mut results: Vec<Option<std::result::Result<(), tonic::Status>>> =
            vec![None; batch.len()];
        let mutate_entries: Vec<&BigtableEntry> = mutate.iter().map(|&i| batch[i]).collect();
        let mutate_call = async {
            if mutate_entries.is_empty() {
                return None;
            }
            Some(
                self.mutate_rows(slot.clone(), client, destination, &mutate_entries, timeout)
                    .await,
            )
        };
        let single_calls = futures::future::join_all(single.iter().map(|&i| {
            let service = slot.service.clone();
            async move {
                let result = self
                    .one_row_call(service, client, destination, batch[i], timeout)
                    .await;
                (i, result)
            }
        }));
        let (mutated, singles) = futures::join!(mutate_call, single_calls);
        drop(slot);
        match mutated {
            Some(SendOutcome::Whole(r)) => {
                for &i in &mutate {
                    results[i] = Some(r.clone());
                }
            }
            Some(SendOutcome::PerRecord(v)) => {
                for (&i, r) in mutate.iter().zip(v) {
                    results[i] = Some(r);
                }
            }
            None => {}
        }
        for (i, result) in singles {
            let entry = batch[i];
            results[i] = Some(self.reach.observe(result).map_err(|status| {
                let not_retried = entry.kind() == EntryKind::Increment
                    && classify_mutate_rows_status(&status) == Class::Retryable;
                // The row key is a row's value: the row number and the key's size name it.
                entry_status(tonic::Status::new(
                    status.code(),
                    format!(
                        "row {} (row key of {} bytes): {}{}",
                        entry.row(),
                        entry.row_key().len(),
                        status.message(),
                        if not_retried { NOT_RETRIED } else { "" }
                    ),
                ))
            }));
        }
        SendOutcome::PerRecord(
            results
                .into_iter()
                .map(|r| r.unwrap_or_else(|| Err(tonic::Status::unknown("no status"))))
                .collect(),
        )
    }

    /// One `CheckAndMutateRow` (set the cells when the row has none) or `ReadModifyWriteRow`
    /// (increment the counters) for `entry`.
    async fn one_row_call(
        &self,
        service: GrpcChannel,
        client: &BigtableTableClient,
        destination: &Destination,
        entry: &BigtableEntry,
        timeout: Option<Duration>,
    ) -> std::result::Result<(), tonic::Status> {
        let google = service.is_google();
        let undecodable =
            |e: prost::DecodeError| tonic::Status::internal(format!("undecodable entry: {e}"));
        let mut grpc = BigtableClient::new(service);
        match entry.kind() {
            EntryKind::InsertIfAbsent => {
                let row = entry.to_entry().map_err(undecodable)?;
                // No predicate: "checks that the row contains any values at all" (the
                // `predicate_filter` field of googleapis `bigtable.proto`), so the cells are
                // set only on a row with none.
                let message = CheckAndMutateRowRequest {
                    table_name: destination.to_string(),
                    app_profile_id: self.app_profile_id.clone(),
                    row_key: row.row_key,
                    predicate_filter: None,
                    true_mutations: Vec::new(),
                    false_mutations: row.mutations,
                    ..Default::default()
                };
                let mut request = with_deadline(tonic::Request::new(message), timeout, google);
                request
                    .metadata_mut()
                    .insert(ROUTING_HEADER, client.routing.clone());
                grpc.check_and_mutate_row(request).await.map(drop)
            }
            EntryKind::Increment => {
                let row = entry.to_increment().map_err(undecodable)?;
                let message = ReadModifyWriteRowRequest {
                    table_name: destination.to_string(),
                    app_profile_id: self.app_profile_id.clone(),
                    row_key: row.row_key,
                    rules: row.rules,
                    ..Default::default()
                };
                let mut request = with_deadline(tonic::Request::new(message), timeout, google);
                request
                    .metadata_mut()
                    .insert(ROUTING_HEADER, client.routing.clone());
                grpc.read_modify_write_row(request).await.map(drop)
            }
            EntryKind::Mutate => Err(tonic::Status::internal(
                "a MutateRows entry reached the one-row path",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_entry_and_call_statuses_apart() {
        let call = |code| tonic::Status::new(code, "x");
        let entry = |code, m: &str| entry_status(tonic::Status::new(code, m));
        for (status, class) in [
            (call(Code::Unavailable), Class::Retryable),
            (entry(Code::DeadlineExceeded, ""), Class::Retryable),
            (call(Code::Aborted), Class::Retryable),
            (call(Code::NotFound), Class::NotFound),
            (call(Code::InvalidArgument), Class::Rejected),
            (entry(Code::Internal, "bad value"), Class::Rejected),
            (call(Code::Internal), Class::Fatal),
            (
                entry(Code::Internal, "unknown family \"cf\""),
                Class::NotFound,
            ),
            (call(Code::PermissionDenied), Class::Fatal),
            // Throttling is not failure (issue 14, ADR 0028): it was fatal before, and failed a
            // statement a throttled cluster would have taken slower.
            (call(Code::ResourceExhausted), Class::Retryable),
            (
                entry(Code::ResourceExhausted, "queue full"),
                Class::Retryable,
            ),
        ] {
            assert_eq!(classify_mutate_rows_status(&status), class, "{status:?}");
        }
    }

    #[test]
    fn rate_limit_info_becomes_a_load_hint() {
        use gcloud_sdk::google::bigtable::v2::RateLimitInfo;
        let info = |period: Option<(i64, i32)>, factor| RateLimitInfo {
            period: period.map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
            factor,
        };
        assert_eq!(
            load_hint(&info(Some((2, 500_000_000)), 0.7)),
            LoadHint {
                factor: 0.7,
                period: Duration::from_millis(2_500)
            }
        );
        // A missing or negative period is none; the core raises it to its shortest.
        assert_eq!(load_hint(&info(None, 1.2)).period, Duration::ZERO);
        assert_eq!(load_hint(&info(Some((-1, 0)), 0.5)).period, Duration::ZERO);
    }

    #[tokio::test]
    async fn a_table_client_routes_by_table_name_and_app_profile() {
        let settings = ClientSettings {
            app_profile_id: Some("batch".into()),
            max_active_instances: 1,
            ..Default::default()
        };
        let transport = BigtableTransport::plaintext("127.0.0.1:9", &settings).unwrap();
        let table: Destination = Arc::from("projects/p/instances/i/tables/t");
        let client = transport.open(&table).await.unwrap();
        assert_eq!(
            client.routing.to_str().unwrap(),
            "table_name=projects%2Fp%2Finstances%2Fi%2Ftables%2Ft&app_profile_id=batch"
        );
        let plain = BigtableTransport::plaintext("127.0.0.1:9", &ClientSettings::default())
            .unwrap()
            .open(&table)
            .await
            .unwrap();
        assert_eq!(
            plain.routing.to_str().unwrap(),
            "table_name=projects%2Fp%2Finstances%2Fi%2Ftables%2Ft"
        );
    }

    #[tokio::test]
    async fn instance_pool_evicts_the_least_recently_used_channel_at_the_cap() {
        let settings = ClientSettings {
            max_active_instances: 2,
            ..Default::default()
        };
        let transport = BigtableTransport::plaintext("127.0.0.1:9", &settings).unwrap();
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = (
            Arc::from("projects/p/instances/a"),
            Arc::from("projects/p/instances/b"),
            Arc::from("projects/p/instances/c"),
        );
        drop(transport.instance_channel(&a).await.unwrap());
        drop(transport.instance_channel(&b).await.unwrap());
        // `a` again: `b` becomes the least recently used.
        drop(transport.instance_channel(&a).await.unwrap());
        assert_eq!(transport.open_instances(), 2);
        drop(transport.instance_channel(&c).await.unwrap());
        assert_eq!(transport.open_instances(), 2);
        assert!(transport.instances.get(&b).is_none(), "b was evicted");
        assert!(transport.instances.get(&a).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_instance_waits_while_every_slot_is_busy() {
        let settings = ClientSettings {
            max_active_instances: 1,
            ..Default::default()
        };
        let transport = Arc::new(BigtableTransport::plaintext("127.0.0.1:9", &settings).unwrap());
        let a: Arc<str> = Arc::from("projects/p/instances/a");
        let b: Arc<str> = Arc::from("projects/p/instances/b");
        // A call in flight on `a` holds its slot.
        let busy = transport.instance_channel(&a).await.unwrap();
        let waiting = tokio::spawn({
            let transport = transport.clone();
            async move { transport.instance_channel(&b).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiting.is_finished(), "b waits for a's slot");
        drop(busy);
        waiting.await.unwrap().unwrap();
        assert_eq!(transport.open_instances(), 1);
    }

    #[tokio::test]
    async fn releasing_the_last_table_closes_its_instance_channel() {
        let settings = ClientSettings {
            max_active_instances: 4,
            ..Default::default()
        };
        let transport = BigtableTransport::plaintext("127.0.0.1:9", &settings).unwrap();
        let t1: Destination = Arc::from("projects/p/instances/a/tables/t1");
        let t2: Destination = Arc::from("projects/p/instances/a/tables/t2");
        let c1 = transport.open(&t1).await.unwrap();
        let c2 = transport.open(&t2).await.unwrap();
        drop(transport.instance_channel(&c1.instance).await.unwrap());
        transport.close(c1).await;
        assert_eq!(transport.open_instances(), 1, "t2 still uses the instance");
        transport.close(c2).await;
        assert_eq!(transport.open_instances(), 0);
    }
}
