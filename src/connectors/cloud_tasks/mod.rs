//! The Cloud Tasks connector: one HTTP task created in a queue per row.
//!
//! Split as the other connectors are: [`options`] (the typed options and their builder),
//! [`mapping`] (rows to serialized tasks, pure), [`client`] (the `CreateTask` transport) and
//! [`writer`] (the sink, glue onto the flow-control core). See `docs/cloud_tasks.md`.

pub mod client;
pub mod inspect;
pub mod mapping;
pub mod names;
pub mod options;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod probe;
pub mod writer;
