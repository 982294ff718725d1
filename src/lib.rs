//! Google Cloud Pub/Sub, Cloud Tasks and Bigtable as SQL table sinks for Apache DataFusion.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `cli` | yes | [`cli`], the `gcp-sql` tool (clap, rustyline, indicatif, tracing-subscriber, `gs://` `s3://` `http(s)://` object stores, DataFusion's default features and Avro); implies `testing` |
//! | `testing` | with `cli` | [`testing`] (fake gRPC servers, a fake transport), the emulator launcher in [`emulators`], and [`bench`](mod@bench) (null Pub/Sub, Bigtable and Cloud Tasks servers) |
//!
//! A DataFusion application that only needs the sinks depends on the crate with
//! `default-features = false` and calls [`sql::register`]:
//!
//! ```toml
//! gcp-sql = { version = "0.1", default-features = false }
//! ```
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod bench;
#[cfg(feature = "cli")]
#[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
pub mod cli;
#[cfg(feature = "ballista")]
#[cfg_attr(docsrs, doc(cfg(feature = "ballista")))]
pub mod cluster;
pub mod connectors;
pub mod core;
pub mod emulators;
pub mod encode;
pub mod error;
pub mod google;
pub mod ops;
pub mod options;
pub mod plan;
pub mod sql;

#[cfg(test)]
mod test_util;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use error::{Error, Result};
