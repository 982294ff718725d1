//! The bigtable connector: rows written as mutations.

pub mod options;
pub mod writer;
