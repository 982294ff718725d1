//! Operating a running process: a Prometheus metrics and health endpoint.
//!
//! [`MetricsServer::start`] serves, on one address:
//!
//! - `/metrics`: every sink statement of the process in Prometheus' text format (version
//!   0.0.4), encoded by the Prometheus project's `prometheus-client` crate from the counters
//!   the flow-control core already keeps ([`crate::core::telemetry`]): records sent,
//!   acknowledged, rejected, dropped, dead-lettered; bytes; in-flight records and bytes; a
//!   send latency histogram; send errors and retries by status code; throttled time; and for a
//!   subscription source, messages received, acknowledged and nacked, lease extensions, held
//!   messages and the age of the oldest unacknowledged one. Labels: `statement`, `table`,
//!   `connector` and `destination` (a source: `source`), plus `code` where it says so; never a
//!   value of a row.
//! - `/healthz`: `200 ok` while the process runs.
//! - `/readyz`: `200 ready` when every running statement's writers reach their service, its
//!   streams are connected and no writer failed (no rejection breaker is open); else `503`
//!   with one line per reason ([`crate::core::telemetry::readiness`]).
//!
//! The `gcp-sql` tool starts it with `--metrics-addr HOST:PORT`; the Python package with
//! `gcp_sql.serve_metrics("HOST:PORT")`. docs/architecture.md ("Metrics and health") lists the
//! metrics and what they cost.

mod exposition;
mod server;

pub use exposition::{CONTENT_TYPE, render, render_statements};
pub use server::{MetricsServer, parse_address};
