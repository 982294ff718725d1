//! Windows over a subscription (ADR 0068): a `GROUP BY` with a window over a source's event
//! time, between a source and a sink, kept exact after any kill with a progress marker and no
//! state store.
//!
//! ```sql
//! INSERT INTO page_counts
//! SELECT user_id, date_bin(INTERVAL '1 minute', event_time) AS minute, count(*) AS views
//! FROM clicks_sub
//! GROUP BY user_id, date_bin(INTERVAL '1 minute', event_time);
//! ```
//!
//! - [`plan`]: DataFusion's aggregate over a source becomes one [`WindowAggregateExec`], or is
//!   refused with what to write instead.
//! - [`exec`]: the node: watermarks, emission, late rows, held delivery handles, the marker's
//!   keeper.
//! - [`state`]: the open windows' accumulators (DataFusion's own group values and
//!   accumulators, one set per open window).
//! - [`progress`]: the progress marker.
//! - [`seen`]: the messages a run counted, so that a copy delivered again is not counted twice.
//! - [`udf`]: `tumble(width)` and `hop(slide, width)`, and the analyzer rule that gives them
//!   the source's event time.

pub mod exec;
pub mod plan;
pub mod progress;
pub mod seen;
pub mod state;
pub mod udf;

pub use exec::WindowAggregateExec;
