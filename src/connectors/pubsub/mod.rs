//! The Pub/Sub connector: messages published to topics.

pub mod client;
pub mod inspect;
pub mod mapping;
pub mod names;
pub mod options;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod probe;
pub mod writer;
