//! The Pub/Sub connector: messages published to topics.

pub mod client;
pub mod inspect;
pub mod mapping;
pub mod names;
pub mod options;
pub mod source;
pub mod writer;
