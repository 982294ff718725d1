//! The cloud_tasks connector: HTTP tasks created in queues.

pub mod options;
pub mod writer;
