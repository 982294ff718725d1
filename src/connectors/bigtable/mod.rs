//! The Bigtable connector: rows written as row mutations (`MutateRows`), one entry per row.
//!
//! Split like every connector: [`options`] (the typed options and their builder), [`mapping`]
//! (Arrow rows to serialized entries, pure), [`client`] (the gRPC side, a
//! [`Transport`](crate::core::Transport)) and [`writer`] (the glue onto the flow-control core).
//! See `docs/bigtable.md` for the user's view.

pub mod client;
pub mod inspect;
pub mod mapping;
pub mod names;
pub mod options;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod probe;
pub mod writer;
