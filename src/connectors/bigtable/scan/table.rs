//! The reading side of a Bigtable table: what `SELECT` on a declared table plans.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use gcloud_sdk::google::bigtable::v2::row_filter::{Chain, Filter, Interleave};
use gcloud_sdk::google::bigtable::v2::{RowFilter, SampleRowKeysRequest};

use super::exec::{BigtableScanExec, ScanSpec, Source};
use super::keys::{KeyLayout, KeySet, PartKind};
use crate::connectors::bigtable::client::ClientSettings;
use crate::connectors::bigtable::options::BigtableSinkOptions;
use crate::error::{Error, Result};

/// Deadline of the `SampleRowKeys` call that splits a scan.
const SAMPLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A cell a scan reads: `(family, qualifier)`.
type Cell = (String, Vec<u8>);

/// A declared Bigtable table, read: `SELECT` becomes [`BigtableScanExec`].
#[derive(Debug, Clone)]
pub struct BigtableScanTable {
    schema: SchemaRef,
    options: BigtableSinkOptions,
    settings: ClientSettings,
    layout: Option<KeyLayout>,
}

impl BigtableScanTable {
    /// The reading side of a table declared with `options` and `schema` (already checked by
    /// the sink's mapping); contacts no service.
    pub fn new(options: BigtableSinkOptions, schema: SchemaRef, settings: ClientSettings) -> Self {
        let m = &options.mapping;
        let layout = m
            .row_key
            .iter()
            .map(|c| {
                let field = schema.field_with_name(c).ok()?;
                Some((c.clone(), PartKind::of(field.data_type())?))
            })
            .collect::<Option<Vec<_>>>()
            .map(|parts| KeyLayout {
                parts,
                delimiter: m.row_key_delimiter.as_bytes().to_vec(),
            });
        BigtableScanTable {
            schema,
            options,
            settings,
            layout,
        }
    }

    fn table(&self) -> Result<&str> {
        self.options.table.as_deref().ok_or_else(|| {
            Error::Unsupported(
                "this Bigtable table writes to a table per row ('table_column'), so it has no one table to read; declare another with 'table' (or LOCATION) to read it".into(),
            )
        })
    }

    fn layout(&self) -> Result<&KeyLayout> {
        self.layout.as_ref().ok_or_else(|| {
            Error::Unsupported(
                "a row_key column of this table has a type a row key cannot be read back as".into(),
            )
        })
    }

    /// Plans which cells to read and how each output column is filled.
    fn sources(&self, projection: &[usize]) -> Result<(Vec<Source>, Vec<Cell>)> {
        let m = &self.options.mapping;
        let mut sources = Vec::with_capacity(projection.len());
        let mut cells: Vec<Cell> = Vec::new();
        let mut cell = |family: &str, qualifier: &str| {
            cells.push((family.to_string(), qualifier.as_bytes().to_vec()));
            cells.len() - 1
        };
        for &i in projection {
            let field = self.schema.field(i);
            let name = field.name();
            let source = if let Some(n) = m.row_key.iter().position(|k| k == name) {
                Source::KeyPart(n)
            } else if m.timestamp_column.as_deref() == Some(name.as_str()) {
                Source::Timestamp
            } else if m.table_column.as_deref() == Some(name.as_str())
                || m.instance_column.as_deref() == Some(name.as_str())
            {
                return Err(Error::Unsupported(format!(
                    "column '{name}' names where rows are written; it is not stored in Bigtable"
                )));
            } else if let DataType::Struct(children) = field.data_type() {
                Source::Struct(children.iter().map(|c| cell(name, c.name())).collect())
            } else {
                Source::Cell(cell(&m.column_family, name))
            };
            sources.push(source);
        }
        Ok((sources, cells))
    }

    async fn sample_boundaries(
        &self,
        spec: &ScanSpec,
        keys: &KeySet,
        partitions: usize,
    ) -> Result<Vec<Vec<u8>>> {
        let (mut client, google) = spec.client().await?;
        let request = spec.request(
            SampleRowKeysRequest {
                table_name: spec.table.clone(),
                app_profile_id: spec.app_profile_id.clone(),
                ..Default::default()
            },
            google,
            Some(SAMPLE_TIMEOUT),
        )?;
        let rpc = |s: tonic::Status| Error::rpc("SampleRowKeys", &spec.table, &s, 1);
        let mut stream = client
            .sample_row_keys(request)
            .await
            .map_err(rpc)?
            .into_inner();
        let mut all: Vec<(Vec<u8>, i64)> = Vec::new();
        while let Some(r) = stream.message().await.map_err(rpc)? {
            all.push((r.row_key, r.offset_bytes));
        }
        // Fewer partitions for a small key set: each should hold at least MIN_PARTITION_BYTES.
        let bytes = estimate_bytes(&all, keys);
        let partitions =
            partitions.min(usize::try_from(bytes / MIN_PARTITION_BYTES).unwrap_or(usize::MAX));
        let mut samples: Vec<Vec<u8>> = all
            .into_iter()
            .map(|(key, _)| key)
            .filter(|key| !key.is_empty() && keys.ranges().iter().any(|k| k.contains(key)))
            .collect();
        samples.sort();
        samples.dedup();
        Ok(choose_boundaries(&samples, partitions))
    }
}

/// The least share of the table, in bytes as `SampleRowKeys` estimates them, that a scan
/// partition is given: a key set smaller than two of these is read by one stream.
pub const MIN_PARTITION_BYTES: u64 = 1 << 20;

/// The bytes of the table inside `keys`, from the samples `(row key, bytes of the rows before
/// it)` in key order (the service ends them with the empty key and the table's size; the
/// emulator with its last row).
pub fn estimate_bytes(samples: &[(Vec<u8>, i64)], keys: &KeySet) -> u64 {
    let total = samples.iter().map(|(_, o)| *o).max().unwrap_or(0);
    // The bytes before the first sample at or after `key` (`None`: the end).
    let before = |key: Option<&[u8]>| -> i64 {
        match key {
            None => total,
            Some([]) => 0,
            Some(k) => samples
                .iter()
                .find(|(s, _)| !s.is_empty() && &s[..] >= k)
                .map_or(total, |(_, o)| *o),
        }
    };
    keys.ranges()
        .iter()
        .map(|r| {
            let span = before(r.end.as_deref()) - before(Some(&r.start));
            u64::try_from(span.max(0)).unwrap_or(0)
        })
        .sum()
}

/// At most `partitions - 1` of `samples` (sorted), evenly spaced.
pub fn choose_boundaries(samples: &[Vec<u8>], partitions: usize) -> Vec<Vec<u8>> {
    if partitions <= 1 || samples.is_empty() {
        return Vec::new();
    }
    let groups = partitions.min(samples.len() + 1);
    let mut out: Vec<Vec<u8>> = (1..groups)
        .map(|g| samples[(g * samples.len() / groups).min(samples.len() - 1)].clone())
        .collect();
    out.dedup();
    out
}

/// Splits a set of single keys into at most `partitions` runs of about equal length.
fn split_points(keys: &KeySet, partitions: usize) -> Vec<KeySet> {
    let ranges = keys.ranges();
    let per = ranges.len().div_ceil(partitions.max(1)).max(1);
    ranges
        .chunks(per)
        .map(|c| KeySet::from_ranges(c.iter().cloned()))
        .collect()
}

/// An RE2 pattern matching exactly `text`.
fn exact_pattern(text: &str) -> String {
    let mut out = String::from("^");
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || !c.is_ascii() {
            out.push(c);
        } else if c.is_ascii_punctuation() {
            out.push('\\');
            out.push(c);
        } else {
            out.push_str(&format!("\\x{{{:02x}}}", c as u32));
        }
    }
    out.push('$');
    out
}

fn filter(f: Filter) -> RowFilter {
    RowFilter { filter: Some(f) }
}

fn chain(filters: Vec<RowFilter>) -> RowFilter {
    filter(Filter::Chain(Chain { filters }))
}

/// The row filter: the latest version of each projected cell, plus the row's first cell
/// emptied so that a row with none of them still counts; and how EXPLAIN shows it. When the
/// projection reads `every` cell column of the table, the latest version of every cell is read
/// with no other filter (cells of no column are dropped on this side), which costs the server
/// the least.
pub fn row_filter(cells: &[(String, Vec<u8>)], every: bool) -> (RowFilter, String) {
    if every && !cells.is_empty() {
        return (
            filter(Filter::CellsPerColumnLimitFilter(1)),
            "every cell column, latest version".into(),
        );
    }
    let marker = chain(vec![
        filter(Filter::CellsPerRowLimitFilter(1)),
        filter(Filter::StripValueTransformer(true)),
    ]);
    if cells.is_empty() {
        return (
            marker,
            "row keys only (first cell of each row, value stripped)".into(),
        );
    }
    let mut families: Vec<(&str, Vec<String>)> = Vec::new();
    for (family, qualifier) in cells {
        let q = String::from_utf8_lossy(qualifier).into_owned();
        match families.iter_mut().find(|(f, _)| f == family) {
            Some((_, qs)) => qs.push(q),
            None => families.push((family, vec![q])),
        }
    }
    let mut per_family = Vec::new();
    let mut text = Vec::new();
    for (family, qualifiers) in &families {
        let alternatives: Vec<String> = qualifiers
            .iter()
            .map(|q| {
                exact_pattern(q)
                    .trim_start_matches('^')
                    .trim_end_matches('$')
                    .to_string()
            })
            .collect();
        per_family.push(chain(vec![
            filter(Filter::FamilyNameRegexFilter(exact_pattern(family))),
            filter(Filter::ColumnQualifierRegexFilter(
                format!("^({})$", alternatives.join("|")).into_bytes(),
            )),
        ]));
        text.push(format!("{family}:{{{}}}", qualifiers.join(",")));
    }
    let projection = if per_family.len() == 1 {
        per_family.pop().expect("one family")
    } else {
        filter(Filter::Interleave(Interleave {
            filters: per_family,
        }))
    };
    (
        filter(Filter::Interleave(Interleave {
            filters: vec![
                chain(vec![
                    projection,
                    filter(Filter::CellsPerColumnLimitFilter(1)),
                ]),
                marker,
            ],
        })),
        format!("{} latest version + row marker", text.join(" ")),
    )
}

#[async_trait]
impl TableProvider for BigtableScanTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        let Some(layout) = &self.layout else {
            return Ok(vec![
                TableProviderFilterPushDown::Unsupported;
                filters.len()
            ]);
        };
        Ok(layout
            .plan(filters)
            .used
            .into_iter()
            .map(|u| match u {
                Some(true) => TableProviderFilterPushDown::Exact,
                Some(false) => TableProviderFilterPushDown::Inexact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let table = self.table()?.to_string();
        let layout = self.layout()?;
        let refs: Vec<&Expr> = filters.iter().collect();
        let plan = layout.plan(&refs);
        let projection: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.schema.fields().len()).collect(),
        };
        let (sources, cells) = self.sources(&projection)?;
        let every = self
            .sources(&(0..self.schema.fields().len()).collect::<Vec<_>>())
            .map(|(_, all)| all.len() == cells.len())
            .unwrap_or(false);
        let (row_filter, filter_text) = row_filter(&cells, every);
        let limit = limit.filter(|_| plan.all_exact()).map(|l| l as u64);
        let spec = Arc::new(ScanSpec {
            table,
            app_profile_id: self.options.app_profile_id.clone().unwrap_or_default(),
            settings: self.settings.clone(),
            schema: Arc::new(self.schema.project(&projection)?),
            sources,
            cells,
            key_parts: layout.parts.len(),
            delimiter: layout.delimiter.clone(),
            filter: row_filter,
            filter_text,
            limit,
            connection: tokio::sync::OnceCell::new(),
        });
        let target = state.config().target_partitions().max(1);
        let partitions = if plan.keys.is_empty() {
            vec![plan.keys.clone()]
        } else if plan.keys.is_points() {
            split_points(&plan.keys, target)
        } else if target > 1 && limit.is_none() {
            let boundaries = self.sample_boundaries(&spec, &plan.keys, target).await?;
            plan.keys.split_at(&boundaries)
        } else {
            vec![plan.keys.clone()]
        };
        Ok(Arc::new(
            BigtableScanExec::new(spec, plan.keys, partitions)
                .with_lookup_cache(self.options.lookup_cache),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_the_name_exactly() {
        assert_eq!(exact_pattern("cf"), "^cf$");
        assert_eq!(exact_pattern("a.b-c"), "^a\\.b\\-c$");
        assert_eq!(exact_pattern("a b"), "^a\\x{20}b$");
    }

    #[test]
    fn the_bytes_of_a_key_set_come_from_the_sample_offsets() {
        let samples = vec![
            (b"b".to_vec(), 100),
            (b"d".to_vec(), 300),
            (Vec::new(), 1_000),
        ];
        assert_eq!(estimate_bytes(&samples, &KeySet::all()), 1_000);
        let range = KeySet::from_ranges([super::super::keys::KeyRange {
            start: b"b".to_vec(),
            end: Some(b"d".to_vec()),
        }]);
        assert_eq!(estimate_bytes(&samples, &range), 200);
        // Inside one sample interval: nothing to split.
        let small = KeySet::from_ranges([super::super::keys::KeyRange::point(b"c".to_vec())]);
        assert_eq!(estimate_bytes(&samples, &small), 0);
        assert_eq!(estimate_bytes(&[], &KeySet::all()), 0);
    }

    #[test]
    fn boundaries_are_evenly_spaced_samples() {
        let samples: Vec<Vec<u8>> = (0..10u8).map(|i| vec![b'a' + i]).collect();
        assert_eq!(choose_boundaries(&samples, 1), Vec::<Vec<u8>>::new());
        assert_eq!(
            choose_boundaries(&samples, 3),
            vec![b"d".to_vec(), b"g".to_vec()]
        );
        assert_eq!(choose_boundaries(&samples[..1], 4), vec![b"a".to_vec()]);
    }

    #[test]
    fn the_filter_reads_the_latest_projected_cells_and_a_row_marker() {
        let (_, text) = row_filter(&[], true);
        assert!(text.starts_with("row keys only"), "{text}");
        let (f, text) = row_filter(
            &[
                ("cf".into(), b"a".to_vec()),
                ("cf".into(), b"b".to_vec()),
                ("s".into(), b"x".to_vec()),
            ],
            false,
        );
        assert_eq!(text, "cf:{a,b} s:{x} latest version + row marker");
        let debug = format!("{f:?}");
        assert!(debug.contains("CellsPerColumnLimitFilter(1)"), "{debug}");
        let (f, text) = row_filter(&[("cf".into(), b"a".to_vec())], true);
        assert_eq!(text, "every cell column, latest version");
        assert_eq!(f, filter(Filter::CellsPerColumnLimitFilter(1)));
    }
}
