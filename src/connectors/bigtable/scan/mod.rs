//! Reading a Bigtable table: `SELECT` on a table declared for the sink.
//!
//! [`table`] plans a scan: the row-key predicates become `ReadRows` row ranges ([`keys`]), the
//! projected columns a family/qualifier row filter reading the latest version of each cell, a
//! `LIMIT` the rows limit when every filter is exact, and `SampleRowKeys` splits the scan into
//! partitions. [`exec`] reads each partition's stream (its responses read in place by [`chunks`]), resuming a broken one after the last row
//! it read, and [`decode`] turns cells back into the values the sink wrote. See
//! `docs/bigtable.md` ("Reading") and ADR 0074.

pub mod chunks;
pub mod decode;
pub mod exec;
pub mod keys;
pub mod table;

pub use exec::BigtableScanExec;
pub use table::BigtableScanTable;
