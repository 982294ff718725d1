//! Options of the Cloud Tasks connector.
//!
//! [`CloudTasksWriterOptions`] holds the writer options of the seed
//! (`CloudTasksWriterOptions.Builder`), one builder method per seed method.
//! [`CloudTasksSinkOptions`] adds the connection, the queue and the HTTP task mapping, and is
//! what both SQL forms build through [`CloudTasksSinkOptions::from_raw`].
//!
//! ```
//! use std::time::Duration;
//! use gcp_sql::connectors::cloud_tasks::options::CloudTasksWriterOptions;
//!
//! let opts = CloudTasksWriterOptions::builder()
//!     .max_in_flight_tasks(200)
//!     .not_found_recovery_max_attempts(5)
//!     .build()?;
//! assert_eq!(opts.recovery_initial_backoff(), Duration::from_millis(100));
//! # Ok::<(), gcp_sql::Error>(())
//! ```

use std::time::Duration;

use arrow::datatypes::{DataType, Schema};

use crate::core::FailurePolicy;
use crate::error::{Error, Result};
use crate::options::registry::{cloud_tasks as spec, common};
use crate::options::spec::format_duration;
use crate::options::{
    ConnectionOptions, ConnectorKind, EnvLookup, ParsedOptions, PayloadFormat, RawOptions,
    location_text, merge_location, names, schema_types,
};

/// Default of `max_in_flight_tasks` (seed).
pub const DEFAULT_MAX_IN_FLIGHT_TASKS: i32 = 1000;
/// Default of `recovery_initial_backoff` (seed).
pub const DEFAULT_RECOVERY_INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Default of `recovery_max_backoff` (seed).
pub const DEFAULT_RECOVERY_MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Default of `recovery_max_attempts` (seed).
pub const DEFAULT_RECOVERY_MAX_ATTEMPTS: i32 = 8;
/// Default of `not_found_recovery_initial_backoff` (seed).
pub const DEFAULT_NOT_FOUND_RECOVERY_INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Default of `not_found_recovery_max_backoff` (seed).
pub const DEFAULT_NOT_FOUND_RECOVERY_MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Default of `not_found_recovery_max_attempts` (seed).
pub const DEFAULT_NOT_FOUND_RECOVERY_MAX_ATTEMPTS: i32 = 3;

/// Shortest `dispatch_deadline` the service accepts (Cloud Tasks `HttpRequest` reference: 15 s).
pub const MIN_DISPATCH_DEADLINE: Duration = Duration::from_secs(15);
/// Longest `dispatch_deadline` the service accepts (Cloud Tasks `HttpRequest` reference: 30 min).
pub const MAX_DISPATCH_DEADLINE: Duration = Duration::from_secs(30 * 60);
/// Longest task URL (Cloud Tasks `HttpRequest.url` reference: 2083 characters).
pub const MAX_URL_LEN: usize = 2083;
/// Headers must total less than this (Cloud Tasks `HttpRequest.headers` reference: 80 KB).
pub const MAX_HEADERS_BYTES: usize = 80 * 1000;

/// No-progress budget of the writer. Not a seed option; the same value as Pub/Sub's
/// `publish_progress_timeout` default, so the three connectors bound a stall alike.
pub const PROGRESS_TIMEOUT: Duration = Duration::from_secs(600);
/// Budget of releasing the client. Not a seed option; Pub/Sub's `shutdown_timeout` default.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle time after which a queue's per-destination state is dropped. Not a seed option; the
/// other connectors' `destination_idle_timeout` default.
pub const DESTINATION_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Queues a writer keeps per-destination state for at once. Not a seed option; Pub/Sub's
/// `max_active_publishers` default.
pub const MAX_ACTIVE_QUEUES: usize = 100;

/// The Cloud Tasks writer options: the in-flight cap, the channel pool and the two retries.
/// Build with [`CloudTasksWriterOptions::builder`].
#[derive(Debug, Clone, PartialEq)]
pub struct CloudTasksWriterOptions {
    max_in_flight_tasks: i32,
    channel_pool_size: Option<i32>,
    recovery_initial_backoff: Duration,
    recovery_max_backoff: Duration,
    recovery_max_attempts: i32,
    not_found_recovery_initial_backoff: Duration,
    not_found_recovery_max_backoff: Duration,
    not_found_recovery_max_attempts: i32,
    per_destination_metrics: bool,
}

impl Default for CloudTasksWriterOptions {
    fn default() -> Self {
        CloudTasksWriterOptions {
            max_in_flight_tasks: DEFAULT_MAX_IN_FLIGHT_TASKS,
            channel_pool_size: None,
            recovery_initial_backoff: DEFAULT_RECOVERY_INITIAL_BACKOFF,
            recovery_max_backoff: DEFAULT_RECOVERY_MAX_BACKOFF,
            recovery_max_attempts: DEFAULT_RECOVERY_MAX_ATTEMPTS,
            not_found_recovery_initial_backoff: DEFAULT_NOT_FOUND_RECOVERY_INITIAL_BACKOFF,
            not_found_recovery_max_backoff: DEFAULT_NOT_FOUND_RECOVERY_MAX_BACKOFF,
            not_found_recovery_max_attempts: DEFAULT_NOT_FOUND_RECOVERY_MAX_ATTEMPTS,
            per_destination_metrics: false,
        }
    }
}

impl CloudTasksWriterOptions {
    /// A builder with every option at its default.
    pub fn builder() -> CloudTasksWriterOptionsBuilder {
        CloudTasksWriterOptionsBuilder::default()
    }
    /// Outstanding task creations cap (in flight or waiting out a backoff).
    pub fn max_in_flight_tasks(&self) -> i32 {
        self.max_in_flight_tasks
    }
    /// gRPC channels of the client; `None` leaves the client's single channel.
    pub fn channel_pool_size(&self) -> Option<i32> {
        self.channel_pool_size
    }
    /// First backoff of the transient-failure retry.
    pub fn recovery_initial_backoff(&self) -> Duration {
        self.recovery_initial_backoff
    }
    /// Backoff cap of the transient-failure retry.
    pub fn recovery_max_backoff(&self) -> Duration {
        self.recovery_max_backoff
    }
    /// Attempts of the transient-failure retry, the first included.
    pub fn recovery_max_attempts(&self) -> i32 {
        self.recovery_max_attempts
    }
    /// First backoff of the NOT_FOUND retry.
    pub fn not_found_recovery_initial_backoff(&self) -> Duration {
        self.not_found_recovery_initial_backoff
    }
    /// Backoff cap of the NOT_FOUND retry.
    pub fn not_found_recovery_max_backoff(&self) -> Duration {
        self.not_found_recovery_max_backoff
    }
    /// Attempts of the NOT_FOUND retry, the first included.
    pub fn not_found_recovery_max_attempts(&self) -> i32 {
        self.not_found_recovery_max_attempts
    }
    /// Whether per-queue counters are registered.
    pub fn per_destination_metrics(&self) -> bool {
        self.per_destination_metrics
    }
}

/// Builder of [`CloudTasksWriterOptions`]; every value is checked in [`build`](Self::build).
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct CloudTasksWriterOptionsBuilder {
    max_in_flight_tasks: Option<i32>,
    channel_pool_size: Option<i32>,
    recovery_initial_backoff: Option<Duration>,
    recovery_max_backoff: Option<Duration>,
    recovery_max_attempts: Option<i32>,
    not_found_recovery_initial_backoff: Option<Duration>,
    not_found_recovery_max_backoff: Option<Duration>,
    not_found_recovery_max_attempts: Option<i32>,
    per_destination_metrics: Option<bool>,
}

impl CloudTasksWriterOptionsBuilder {
    /// Outstanding task creations cap (positive; default 1000).
    pub fn max_in_flight_tasks(mut self, v: i32) -> Self {
        self.max_in_flight_tasks = Some(v);
        self
    }
    /// gRPC channel pool size (positive; unset by default; refused with an emulator when the
    /// sink options are built).
    pub fn channel_pool_size(mut self, v: i32) -> Self {
        self.channel_pool_size = Some(v);
        self
    }
    /// First backoff of the transient-failure retry (at least 1 ms; default 100 ms).
    pub fn recovery_initial_backoff(mut self, v: Duration) -> Self {
        self.recovery_initial_backoff = Some(v);
        self
    }
    /// Backoff cap of the transient-failure retry (at least 1 ms and the initial; default 10 s).
    pub fn recovery_max_backoff(mut self, v: Duration) -> Self {
        self.recovery_max_backoff = Some(v);
        self
    }
    /// Attempts of the transient-failure retry (positive; default 8).
    pub fn recovery_max_attempts(mut self, v: i32) -> Self {
        self.recovery_max_attempts = Some(v);
        self
    }
    /// First backoff of the NOT_FOUND retry (at least 1 ms; default 500 ms).
    pub fn not_found_recovery_initial_backoff(mut self, v: Duration) -> Self {
        self.not_found_recovery_initial_backoff = Some(v);
        self
    }
    /// Backoff cap of the NOT_FOUND retry (at least 1 ms and the initial; default 2 s).
    pub fn not_found_recovery_max_backoff(mut self, v: Duration) -> Self {
        self.not_found_recovery_max_backoff = Some(v);
        self
    }
    /// Attempts of the NOT_FOUND retry (positive; default 3).
    pub fn not_found_recovery_max_attempts(mut self, v: i32) -> Self {
        self.not_found_recovery_max_attempts = Some(v);
        self
    }
    /// Register per-queue counters (default false).
    pub fn per_destination_metrics(mut self, v: bool) -> Self {
        self.per_destination_metrics = Some(v);
        self
    }

    /// Checks every value and the cross-option rules; the error names the option and the rule.
    pub fn build(self) -> Result<CloudTasksWriterOptions> {
        let mut o = CloudTasksWriterOptions::default();
        if let Some(v) = self.max_in_flight_tasks {
            spec::MAX_IN_FLIGHT_TASKS.check_int(v.into())?;
            o.max_in_flight_tasks = v;
        }
        if let Some(v) = self.channel_pool_size {
            spec::CHANNEL_POOL_SIZE.check_int(v.into())?;
            o.channel_pool_size = Some(v);
        }
        if let Some(v) = self.recovery_initial_backoff {
            spec::RECOVERY_INITIAL_BACKOFF.check_duration(v)?;
            o.recovery_initial_backoff = v;
        }
        if let Some(v) = self.recovery_max_backoff {
            spec::RECOVERY_MAX_BACKOFF.check_duration(v)?;
            o.recovery_max_backoff = v;
        }
        if let Some(v) = self.recovery_max_attempts {
            spec::RECOVERY_MAX_ATTEMPTS.check_int(v.into())?;
            o.recovery_max_attempts = v;
        }
        if let Some(v) = self.not_found_recovery_initial_backoff {
            spec::NOT_FOUND_RECOVERY_INITIAL_BACKOFF.check_duration(v)?;
            o.not_found_recovery_initial_backoff = v;
        }
        if let Some(v) = self.not_found_recovery_max_backoff {
            spec::NOT_FOUND_RECOVERY_MAX_BACKOFF.check_duration(v)?;
            o.not_found_recovery_max_backoff = v;
        }
        if let Some(v) = self.not_found_recovery_max_attempts {
            spec::NOT_FOUND_RECOVERY_MAX_ATTEMPTS.check_int(v.into())?;
            o.not_found_recovery_max_attempts = v;
        }
        if let Some(v) = self.per_destination_metrics {
            o.per_destination_metrics = v;
        }
        for (max_spec, max, initial) in [
            (
                &spec::RECOVERY_MAX_BACKOFF,
                o.recovery_max_backoff,
                o.recovery_initial_backoff,
            ),
            (
                &spec::NOT_FOUND_RECOVERY_MAX_BACKOFF,
                o.not_found_recovery_max_backoff,
                o.not_found_recovery_initial_backoff,
            ),
        ] {
            if max < initial {
                return Err(max_spec.invalid(
                    format_duration(max),
                    format!(
                        "{} (which is {})",
                        max_spec.cross_rule,
                        format_duration(initial)
                    ),
                ));
            }
        }
        Ok(o)
    }
}

/// The HTTP method of a task's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpMethod {
    /// `GET`.
    Get,
    /// `HEAD`.
    Head,
    /// `POST` (the default).
    #[default]
    Post,
    /// `PUT`.
    Put,
    /// `DELETE`.
    Delete,
    /// `PATCH`.
    Patch,
    /// `OPTIONS`.
    Options,
}

impl HttpMethod {
    /// Parses a method name, case-insensitively.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text.trim().to_ascii_uppercase().as_str() {
            "GET" => HttpMethod::Get,
            "HEAD" => HttpMethod::Head,
            "POST" => HttpMethod::Post,
            "PUT" => HttpMethod::Put,
            "DELETE" => HttpMethod::Delete,
            "PATCH" => HttpMethod::Patch,
            "OPTIONS" => HttpMethod::Options,
            _ => return None,
        })
    }

    /// The method name (`POST`).
    pub fn name(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Head => "HEAD",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Delete => "DELETE",
            HttpMethod::Patch => "PATCH",
            HttpMethod::Options => "OPTIONS",
        }
    }

    /// Whether Cloud Tasks sends a body with this method (only `POST`, `PUT` and `PATCH`).
    pub fn has_body(self) -> bool {
        matches!(self, HttpMethod::Post | HttpMethod::Put | HttpMethod::Patch)
    }
}

/// The token a task's request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskAuth {
    /// An OIDC token (for targets such as Cloud Run).
    Oidc {
        /// The service account the token is for.
        service_account_email: String,
        /// The audience; the task URL when `None`.
        audience: Option<String>,
    },
    /// An OAuth access token (for Google APIs).
    OAuth {
        /// The service account the token is for.
        service_account_email: String,
        /// The scope; `cloud-platform` when `None`.
        scope: Option<String>,
    },
}

/// How rows become HTTP tasks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CloudTasksMappingOptions {
    /// Region in which short queue ids are resolved.
    pub location: Option<String>,
    /// Column naming each row's queue, instead of a fixed queue.
    pub queue_column: Option<String>,
    /// Fixed URL of every task.
    pub url: Option<String>,
    /// Column with each task's URL.
    pub url_column: Option<String>,
    /// The request method.
    pub http_method: HttpMethod,
    /// Headers of every task, in order.
    pub headers: Vec<(String, String)>,
    /// Map column of per-row headers.
    pub headers_column: Option<String>,
    /// Column carrying the body as is.
    pub body_column: Option<String>,
    /// How the row is encoded as the body when there is no body column.
    pub format: PayloadFormat,
    /// Timestamp column with the time each task should run.
    pub schedule_time_column: Option<String>,
    /// Column with each task's id (or full name), for de-duplication.
    pub task_name_column: Option<String>,
    /// The token the request carries.
    pub auth: Option<TaskAuth>,
    /// How long the queue waits for the target.
    pub dispatch_deadline: Option<Duration>,
}

impl CloudTasksMappingOptions {
    /// The columns that configure the task rather than form its body.
    pub fn metadata_columns(&self) -> Vec<&str> {
        [
            &self.queue_column,
            &self.url_column,
            &self.headers_column,
            &self.schedule_time_column,
            &self.task_name_column,
        ]
        .into_iter()
        .filter_map(|c| c.as_deref())
        .collect()
    }
}

/// Everything a Cloud Tasks sink needs: connection, queue, mapping, policy and writer options.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudTasksSinkOptions {
    /// Project, endpoint, emulator, credentials.
    pub connection: ConnectionOptions,
    /// The fixed queue (`projects/P/locations/L/queues/Q`), if any.
    pub queue: Option<String>,
    /// The task mapping.
    pub mapping: CloudTasksMappingOptions,
    /// What to do with a refused record.
    pub failure_policy: FailurePolicy,
    /// The writer options.
    pub writer: CloudTasksWriterOptions,
}

fn check_url(spec: &crate::options::OptionSpec, url: &str) -> Result<()> {
    if url.len() > MAX_URL_LEN {
        return Err(spec.invalid(url, format!("at most {MAX_URL_LEN} characters")));
    }
    match url::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(()),
        _ => Err(spec.invalid(url, "expected an http:// or https:// URL with a host")),
    }
}

impl CloudTasksSinkOptions {
    /// Builds the sink options from a statement's `LOCATION` (the queue; empty means none) and
    /// options, reading the emulator variable from the process environment.
    ///
    /// ```
    /// use gcp_sql::connectors::cloud_tasks::options::{CloudTasksSinkOptions, HttpMethod};
    /// use gcp_sql::options::RawOptions;
    ///
    /// let raw = RawOptions::from_pairs([
    ///     ("url".to_string(), "https://worker.example.com/run".to_string()),
    ///     ("http_method".to_string(), "put".to_string()),
    ///     ("headers".to_string(), "Content-Type: text/plain; charset=utf-8; X-A: b".to_string()),
    /// ])?;
    /// let opts = CloudTasksSinkOptions::from_raw(Some("projects/demo/locations/us-central1/queues/jobs"), &raw)?;
    /// assert_eq!(opts.mapping.http_method, HttpMethod::Put);
    /// assert_eq!(opts.mapping.headers[0].1, "text/plain; charset=utf-8");
    /// # Ok::<(), gcp_sql::Error>(())
    /// ```
    pub fn from_raw(location: Option<&str>, raw: &RawOptions) -> Result<Self> {
        Self::from_raw_with_env(location, raw, &ConnectionOptions::process_env)
    }

    /// [`from_raw`](Self::from_raw) with the environment read through `env`.
    pub fn from_raw_with_env(
        location: Option<&str>,
        raw: &RawOptions,
        env: EnvLookup<'_>,
    ) -> Result<Self> {
        let p = ParsedOptions::parse(ConnectorKind::CloudTasks, raw)?;
        let connection = ConnectionOptions::from_parsed(&p, env)?;
        let project = connection.project.as_deref();
        let region = p.non_empty_text(&spec::LOCATION)?;

        let from_location = match location_text(location) {
            Some(l) => Some((
                names::cloud_tasks_queue(l, project, region)
                    .map_err(|rule| Error::invalid("LOCATION", l, rule))?,
                l,
            )),
            None => None,
        };
        let from_option = match p.non_empty_text(&spec::QUEUE)? {
            Some(q) => Some((
                names::cloud_tasks_queue(q, project, region)
                    .map_err(|rule| spec::QUEUE.invalid(q, rule))?,
                q,
            )),
            None => None,
        };
        let queue = merge_location(&spec::QUEUE, from_location, from_option)?;

        let url = p.non_empty_text(&spec::URL)?.map(str::to_string);
        if let Some(u) = &url {
            check_url(&spec::URL, u)?;
        }
        let http_method = match p.text(&spec::HTTP_METHOD)? {
            Some(m) => HttpMethod::parse(m)
                .ok_or_else(|| spec::HTTP_METHOD.invalid(m, "not an HTTP method"))?,
            None => HttpMethod::default(),
        };
        let headers = p
            .headers(&spec::HEADERS)?
            .map(<[(String, String)]>::to_vec)
            .unwrap_or_default();
        let header_bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
        if header_bytes >= MAX_HEADERS_BYTES {
            return Err(spec::HEADERS.invalid(
                p.text_as_written(&spec::HEADERS)
                    .unwrap_or_default()
                    .chars()
                    .take(80)
                    .collect::<String>(),
                format!("{} ({header_bytes} bytes)", spec::HEADERS.cross_rule),
            ));
        }

        let auth = Self::auth_from(&p)?;

        let mapping = CloudTasksMappingOptions {
            location: region.map(str::to_string),
            queue_column: p.text(&spec::QUEUE_COLUMN)?.map(str::to_string),
            url,
            url_column: p.text(&spec::URL_COLUMN)?.map(str::to_string),
            http_method,
            headers,
            headers_column: p.text(&spec::HEADERS_COLUMN)?.map(str::to_string),
            body_column: p.text(&spec::BODY_COLUMN)?.map(str::to_string),
            format: p.payload_format()?,
            schedule_time_column: p.text(&spec::SCHEDULE_TIME_COLUMN)?.map(str::to_string),
            task_name_column: p.text(&spec::TASK_NAME_COLUMN)?.map(str::to_string),
            auth,
            dispatch_deadline: p.duration(&spec::DISPATCH_DEADLINE)?,
        };

        let mut b = CloudTasksWriterOptions::builder();
        if let Some(v) = p.int32(&spec::MAX_IN_FLIGHT_TASKS)? {
            b = b.max_in_flight_tasks(v);
        }
        if let Some(v) = p.int32(&spec::CHANNEL_POOL_SIZE)? {
            b = b.channel_pool_size(v);
        }
        if let Some(v) = p.duration(&spec::RECOVERY_INITIAL_BACKOFF)? {
            b = b.recovery_initial_backoff(v);
        }
        if let Some(v) = p.duration(&spec::RECOVERY_MAX_BACKOFF)? {
            b = b.recovery_max_backoff(v);
        }
        if let Some(v) = p.int32(&spec::RECOVERY_MAX_ATTEMPTS)? {
            b = b.recovery_max_attempts(v);
        }
        if let Some(v) = p.duration(&spec::NOT_FOUND_RECOVERY_INITIAL_BACKOFF)? {
            b = b.not_found_recovery_initial_backoff(v);
        }
        if let Some(v) = p.duration(&spec::NOT_FOUND_RECOVERY_MAX_BACKOFF)? {
            b = b.not_found_recovery_max_backoff(v);
        }
        if let Some(v) = p.int32(&spec::NOT_FOUND_RECOVERY_MAX_ATTEMPTS)? {
            b = b.not_found_recovery_max_attempts(v);
        }
        if let Some(v) = p.bool(&common::PER_DESTINATION_METRICS)? {
            b = b.per_destination_metrics(v);
        }

        let opts = CloudTasksSinkOptions {
            connection,
            queue,
            mapping,
            failure_policy: p.failure_policy()?,
            writer: b.build()?,
        };
        opts.validate()?;
        Ok(opts)
    }

    fn auth_from(p: &ParsedOptions) -> Result<Option<TaskAuth>> {
        let oidc_email = p.non_empty_text(&spec::OIDC_SERVICE_ACCOUNT_EMAIL)?;
        let oidc_audience = p.non_empty_text(&spec::OIDC_AUDIENCE)?;
        let oauth_email = p.non_empty_text(&spec::OAUTH_SERVICE_ACCOUNT_EMAIL)?;
        let oauth_scope = p.non_empty_text(&spec::OAUTH_SCOPE)?;
        for (s, v) in [
            (&spec::OIDC_SERVICE_ACCOUNT_EMAIL, oidc_email),
            (&spec::OAUTH_SERVICE_ACCOUNT_EMAIL, oauth_email),
        ] {
            if let Some(e) = v
                && (!e.contains('@') || e.contains(char::is_whitespace))
            {
                return Err(s.invalid(e, "expected a service account e-mail address"));
            }
        }
        let oidc = oidc_email.is_some() || oidc_audience.is_some();
        let oauth = oauth_email.is_some() || oauth_scope.is_some();
        if oidc && oauth {
            let (s, v) = match (oauth_email, oauth_scope) {
                (Some(e), _) => (&spec::OAUTH_SERVICE_ACCOUNT_EMAIL, e),
                (None, Some(sc)) => (&spec::OAUTH_SCOPE, sc),
                (None, None) => (&spec::OAUTH_SERVICE_ACCOUNT_EMAIL, ""),
            };
            return Err(s.invalid(
                v,
                "cannot be combined with the oidc_* options: a task carries one kind of token",
            ));
        }
        match (oidc_email, oidc_audience, oauth_email, oauth_scope) {
            (None, Some(a), _, _) => Err(spec::OIDC_AUDIENCE.cross_invalid(a)),
            (_, _, None, Some(s)) => Err(spec::OAUTH_SCOPE.cross_invalid(s)),
            (Some(e), a, _, _) => Ok(Some(TaskAuth::Oidc {
                service_account_email: e.to_string(),
                audience: a.map(str::to_string),
            })),
            (_, _, Some(e), s) => Ok(Some(TaskAuth::OAuth {
                service_account_email: e.to_string(),
                scope: s.map(str::to_string),
            })),
            _ => Ok(None),
        }
    }

    /// Checks the rules between sections: a queue and a URL are required (each fixed or from a
    /// column, not both), a body column needs a body-carrying method, and a channel pool cannot
    /// be combined with an emulator.
    pub fn validate(&self) -> Result<()> {
        let m = &self.mapping;
        match (&self.queue, &m.queue_column) {
            (None, None) => {
                return Err(Error::MissingOption {
                    option: spec::QUEUE.name.into(),
                    rule: "a Cloud Tasks sink needs a queue: LOCATION 'projects/P/locations/L/queues/Q', the 'queue' \
                           option, or a per-row 'queue_column'"
                        .into(),
                });
            }
            (Some(q), Some(c)) => {
                return Err(spec::QUEUE_COLUMN.invalid(
                    c,
                    format!("{} (queue '{q}')", spec::QUEUE_COLUMN.cross_rule),
                ));
            }
            _ => {}
        }
        match (&m.url, &m.url_column) {
            (None, None) => {
                return Err(Error::MissingOption {
                    option: spec::URL.name.into(),
                    rule: "a Cloud Tasks sink needs the URL its tasks call: the 'url' option or a per-row 'url_column'"
                        .into(),
                });
            }
            (Some(_), Some(c)) => {
                return Err(spec::URL_COLUMN.invalid(
                    c,
                    "cannot be combined with 'url': give the URL in one place",
                ));
            }
            _ => {}
        }
        if let Some(b) = &m.body_column
            && !m.http_method.has_body()
        {
            return Err(spec::BODY_COLUMN.invalid(
                b,
                format!(
                    "{} ('http_method' is {}, which carries no body)",
                    spec::BODY_COLUMN.cross_rule,
                    m.http_method.name()
                ),
            ));
        }
        if let (Some(pool), Some(emulator)) =
            (self.writer.channel_pool_size(), &self.connection.emulator)
        {
            return Err(spec::CHANNEL_POOL_SIZE.invalid(
                pool.to_string(),
                format!(
                    "cannot be combined with an emulator endpoint ({}): the emulator always uses one plaintext channel, \
                     so the pool would be silently ignored",
                    emulator.describe()
                ),
            ));
        }
        Ok(())
    }

    /// Checks the table's columns against the mapping: every named column exists with a usable
    /// type, and `format = 'raw'` has exactly one string or binary column to send.
    pub fn validate_schema(&self, schema: &Schema) -> Result<()> {
        let m = &self.mapping;
        let string_cols = [
            (spec::QUEUE_COLUMN.name, &m.queue_column),
            (spec::URL_COLUMN.name, &m.url_column),
            (spec::TASK_NAME_COLUMN.name, &m.task_name_column),
        ];
        for (option, col) in string_cols {
            if let Some(c) = col {
                let dt = schema_types::column_type(schema, c, option)?;
                if !schema_types::is_string(dt) {
                    return Err(Error::schema(
                        c,
                        format!("'{option}' needs a string column, found {dt}"),
                    ));
                }
            }
        }
        if let Some(c) = &m.body_column {
            let dt = schema_types::column_type(schema, c, spec::BODY_COLUMN.name)?;
            if !schema_types::is_string(dt) && !schema_types::is_binary(dt) {
                return Err(Error::schema(
                    c,
                    format!("'body_column' needs a binary or string column, found {dt}"),
                ));
            }
        }
        if let Some(c) = &m.schedule_time_column {
            let dt = schema_types::column_type(schema, c, spec::SCHEDULE_TIME_COLUMN.name)?;
            if !matches!(dt, DataType::Timestamp(_, _)) {
                return Err(Error::schema(
                    c,
                    format!("'schedule_time_column' needs a timestamp column, found {dt}"),
                ));
            }
        }
        if let Some(c) = &m.headers_column {
            let dt = schema_types::column_type(schema, c, spec::HEADERS_COLUMN.name)?;
            if !schema_types::is_string_map(dt) {
                return Err(Error::schema(
                    c,
                    format!("'headers_column' needs a map of string to string, found {dt}"),
                ));
            }
        }
        if m.body_column.is_none() && m.http_method.has_body() && m.format == PayloadFormat::Raw {
            let meta = m.metadata_columns();
            let payload: Vec<_> = schema
                .fields()
                .iter()
                .filter(|f| !meta.contains(&f.name().as_str()))
                .collect();
            match payload.as_slice() {
                [f] if schema_types::is_string(f.data_type())
                    || schema_types::is_binary(f.data_type()) => {}
                [f] => {
                    return Err(Error::schema(
                        f.name(),
                        format!(
                            "format 'raw' sends one string or binary column as the body, found {}",
                            f.data_type()
                        ),
                    ));
                }
                other => {
                    return Err(Error::invalid(
                        common::FORMAT.name,
                        "raw",
                        format!(
                            "{} (the table has {} columns besides those the mapping uses)",
                            common::FORMAT.cross_rule,
                            other.len()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The queue of one row: the queue column's value (full name, or short id in `project` and
    /// `location`) or the fixed queue. The error is the reason, for the mapping to report.
    pub fn resolve_queue(&self, column_value: Option<&str>) -> std::result::Result<String, String> {
        match (&self.mapping.queue_column, column_value, &self.queue) {
            (Some(_), Some(v), _) => names::cloud_tasks_queue(
                v,
                self.connection.project.as_deref(),
                self.mapping.location.as_deref(),
            ),
            (Some(c), None, _) => Err(format!("the queue column '{c}' is null")),
            (None, _, Some(q)) => Ok(q.clone()),
            (None, _, None) => Err("the sink has no queue".into()),
        }
    }

    /// The full task name for a task-name column value in `queue` (full name, or short id).
    pub fn resolve_task_name(queue: &str, value: &str) -> std::result::Result<String, String> {
        names::cloud_tasks_task(value, queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_defaults_equal_documented_defaults() {
        assert_eq!(
            CloudTasksWriterOptions::builder().build().unwrap(),
            CloudTasksWriterOptions::default()
        );
    }

    #[test]
    fn body_methods_are_post_put_patch() {
        let with_body: Vec<_> = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
            .into_iter()
            .filter(|m| HttpMethod::parse(m).is_some_and(HttpMethod::has_body))
            .collect();
        assert_eq!(with_body, ["POST", "PUT", "PATCH"]);
    }
}
