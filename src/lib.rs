//! Google Cloud Pub/Sub, Cloud Tasks and Bigtable as SQL table sinks for Apache DataFusion.
#![warn(missing_docs)]

pub mod bench;
pub mod cli;
pub mod connectors;
pub mod core;
pub mod emulators;
pub mod encode;
pub mod error;
pub mod options;
pub mod sql;

pub mod testing;

pub use error::{Error, Result};
