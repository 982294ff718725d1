//! Row-key predicates to `ReadRows` row ranges (pure: no I/O).
//!
//! A set of row keys is a sorted list of disjoint half-open byte ranges `[start, end)` (an empty
//! start is the first key, no end is past the last). A predicate on the key columns becomes such
//! a set, and whether the set is exactly the rows the predicate keeps (the filter then needs no
//! second check) or a superset of them (DataFusion checks it again):
//!
//! | predicate | one key column (string or binary) | one key column (integer) | composite key `a#b#c` |
//! |---|---|---|---|
//! | `=`, `IN` | row keys, exact | the decimal text, exact | on leading parts: a prefix `a#`, `a#b#`; on every part: row keys; exact |
//! | `<`, `<=`, `>`, `>=`, `BETWEEN` | a range, exact | not used (text order is not number order) | on the last part after `=` on all others: a range under the prefix, exact |
//! | `LIKE 'p%'` | the prefix range, exact; `LIKE 'p_x%'`: the prefix `p`, inexact | not used | like a range |
//! | `AND`, `OR` inside one filter | intersection, union | | |
//!
//! A composite key is read back by splitting it at the first `n - 1` delimiters (the last part
//! keeps any further delimiter), so an equality on a leading part whose value contains the
//! delimiter matches no row.

use std::fmt;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Like, Operator};
use gcloud_sdk::google::bigtable::v2::row_range::{EndKey, StartKey};
use gcloud_sdk::google::bigtable::v2::{RowRange, RowSet};

/// Most row keys or prefixes one filter may expand to (a product of `IN` lists); beyond it the
/// filter is left to DataFusion.
pub const MAX_KEYS: usize = 100_000;

/// A half-open range of row keys: `start` (inclusive, empty = the first key) to `end`
/// (exclusive, `None` = past the last key).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyRange {
    /// First key in the range.
    pub start: Vec<u8>,
    /// First key past the range; `None`: unbounded.
    pub end: Option<Vec<u8>>,
}

impl KeyRange {
    /// The one key `key`.
    pub fn point(key: Vec<u8>) -> Self {
        let mut end = key.clone();
        end.push(0);
        KeyRange {
            start: key,
            end: Some(end),
        }
    }

    /// Every key starting with `prefix`.
    pub fn prefix(prefix: Vec<u8>) -> Self {
        let end = prefix_end(&prefix);
        KeyRange { start: prefix, end }
    }

    /// Whether this is the one key `start`.
    pub fn is_point(&self) -> bool {
        self.end.as_deref().is_some_and(|e| {
            e.len() == self.start.len() + 1 && e.last() == Some(&0) && e.starts_with(&self.start)
        })
    }

    fn is_empty(&self) -> bool {
        self.end.as_deref().is_some_and(|e| e <= &self.start[..])
    }

    fn intersect(&self, other: &KeyRange) -> Option<KeyRange> {
        let start = self.start.clone().max(other.start.clone());
        let end = match (&self.end, &other.end) {
            (Some(a), Some(b)) => Some(a.clone().min(b.clone())),
            (Some(a), None) | (None, Some(a)) => Some(a.clone()),
            (None, None) => None,
        };
        let r = KeyRange { start, end };
        (!r.is_empty()).then_some(r)
    }

    /// Whether `key` is in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= &self.start[..] && self.end.as_deref().is_none_or(|e| key < e)
    }
}

/// The first key after every key starting with `prefix` (`None` when there is none: the prefix
/// is empty or all `0xFF`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The first key greater than `key`.
pub fn key_after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// A set of row keys: sorted, disjoint, non-empty ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet {
    ranges: Vec<KeyRange>,
}

impl KeySet {
    /// Every row.
    pub fn all() -> Self {
        KeySet {
            ranges: vec![KeyRange {
                start: Vec::new(),
                end: None,
            }],
        }
    }

    /// No row.
    pub fn none() -> Self {
        KeySet { ranges: Vec::new() }
    }

    /// The union of `ranges`, normalized.
    pub fn from_ranges(ranges: impl IntoIterator<Item = KeyRange>) -> Self {
        let mut ranges: Vec<KeyRange> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
        ranges.sort();
        let mut out: Vec<KeyRange> = Vec::with_capacity(ranges.len());
        for r in ranges {
            if let Some(last) = out.last_mut() {
                match &last.end {
                    None => continue,
                    Some(end) if r.start[..] <= end[..] => {
                        last.end = match (&last.end, r.end) {
                            (Some(a), Some(b)) => Some(a.clone().max(b)),
                            _ => None,
                        };
                        continue;
                    }
                    Some(_) => {}
                }
            }
            out.push(r);
        }
        KeySet { ranges: out }
    }

    /// The ranges, sorted and disjoint.
    pub fn ranges(&self) -> &[KeyRange] {
        &self.ranges
    }

    /// Whether no key is in the set.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether the set is every row.
    pub fn is_all(&self) -> bool {
        self == &KeySet::all()
    }

    /// Whether every range is one key.
    pub fn is_points(&self) -> bool {
        !self.ranges.is_empty() && self.ranges.iter().all(KeyRange::is_point)
    }

    /// The keys in both sets.
    pub fn intersect(&self, other: &KeySet) -> KeySet {
        let mut out = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < self.ranges.len() && j < other.ranges.len() {
            let (a, b) = (&self.ranges[i], &other.ranges[j]);
            if let Some(r) = a.intersect(b) {
                out.push(r);
            }
            // Advance the range that ends first.
            let a_first = match (&a.end, &b.end) {
                (Some(x), Some(y)) => x <= y,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if a_first {
                i += 1;
            } else {
                j += 1;
            }
        }
        KeySet { ranges: out }
    }

    /// The keys in either set.
    pub fn union(&self, other: &KeySet) -> KeySet {
        KeySet::from_ranges(self.ranges.iter().chain(other.ranges.iter()).cloned())
    }

    /// The keys of the set after `key` (what a broken stream still has to read).
    pub fn after(&self, key: &[u8]) -> KeySet {
        self.intersect(&KeySet::from_ranges([KeyRange {
            start: key_after(key),
            end: None,
        }]))
    }

    /// The set as a `ReadRows` row set: single keys as `row_keys`, the rest as ranges. An
    /// unbounded set is an empty `RowSet` (the whole table).
    pub fn to_row_set(&self) -> RowSet {
        let mut set = RowSet::default();
        if self.is_all() {
            return set;
        }
        for r in &self.ranges {
            if r.is_point() {
                set.row_keys.push(r.start.clone());
            } else {
                set.row_ranges.push(RowRange {
                    start_key: Some(StartKey::StartKeyClosed(r.start.clone())),
                    end_key: r.end.clone().map(EndKey::EndKeyOpen),
                });
            }
        }
        set
    }

    /// Splits the set at `boundaries` (sorted keys) into at most `boundaries.len() + 1` parts,
    /// empty parts left out.
    pub fn split_at(&self, boundaries: &[Vec<u8>]) -> Vec<KeySet> {
        let mut parts = Vec::new();
        let mut start: Vec<u8> = Vec::new();
        for b in boundaries.iter().chain(std::iter::once(&Vec::new())) {
            let end = (!b.is_empty()).then(|| b.clone());
            if end.as_deref().is_some_and(|e| e <= &start[..]) {
                continue;
            }
            let part = self.intersect(&KeySet::from_ranges([KeyRange {
                start: start.clone(),
                end: end.clone(),
            }]));
            if !part.is_empty() {
                parts.push(part);
            }
            match end {
                Some(e) => start = e,
                None => break,
            }
        }
        parts
    }
}

/// Shows a key as text: printable ASCII as is, other bytes escaped.
pub fn show_key(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}

impl fmt::Display for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_all() {
            return f.write_str("all");
        }
        if self.is_empty() {
            return f.write_str("none");
        }
        const SHOWN: usize = 8;
        f.write_str("[")?;
        for (i, r) in self.ranges.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if r.is_point() {
                write!(f, "'{}'", show_key(&r.start))?;
            } else {
                write!(f, "['{}'..", show_key(&r.start))?;
                match &r.end {
                    Some(e) => write!(f, "'{}')", show_key(e))?,
                    None => f.write_str(")")?,
                }
            }
        }
        if self.ranges.len() > SHOWN {
            write!(f, ", ... {} in all", self.ranges.len())?;
        }
        f.write_str("]")
    }
}

/// How a key column's values become row-key bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// A string: its UTF-8 bytes (byte order is string order).
    Text,
    /// Binary: the bytes.
    Bytes,
    /// An integer: its decimal text (text order is not number order).
    Integer,
}

impl PartKind {
    /// The kind of a key column of type `dt`, `None` for a type a key cannot have.
    pub fn of(dt: &DataType) -> Option<PartKind> {
        match dt {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(PartKind::Text),
            DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_) => Some(PartKind::Bytes),
            dt if dt.is_integer() => Some(PartKind::Integer),
            DataType::Dictionary(_, v) => PartKind::of(v),
            _ => None,
        }
    }

    fn ordered(self) -> bool {
        self != PartKind::Integer
    }
}

/// The row key layout: the key columns (name and kind) and the delimiter between them.
#[derive(Debug, Clone)]
pub struct KeyLayout {
    /// The key columns, in key order.
    pub parts: Vec<(String, PartKind)>,
    /// The delimiter between parts.
    pub delimiter: Vec<u8>,
}

/// What the key predicates of a query select, and how exactly.
#[derive(Debug, Clone)]
pub struct KeyPlan {
    /// The row keys to read.
    pub keys: KeySet,
    /// Per filter (in the order given): `Some(true)` when the key set is exactly what it keeps,
    /// `Some(false)` when it is a superset, `None` when it was not used.
    pub used: Vec<Option<bool>>,
}

impl KeyPlan {
    /// Whether every filter is exact (so a `LIMIT` may be pushed down).
    pub fn all_exact(&self) -> bool {
        self.used.iter().all(|u| *u == Some(true))
    }
}

/// A literal as the row-key bytes of a part of `kind`; `None` for one of another type.
fn literal_bytes(value: &ScalarValue, kind: PartKind) -> Option<Option<Vec<u8>>> {
    use ScalarValue as S;
    if value.is_null() {
        return Some(None);
    }
    Some(Some(match (kind, value) {
        (PartKind::Text, S::Utf8(Some(s)) | S::LargeUtf8(Some(s)) | S::Utf8View(Some(s))) => {
            s.as_bytes().to_vec()
        }
        (
            PartKind::Bytes,
            S::Binary(Some(b))
            | S::LargeBinary(Some(b))
            | S::BinaryView(Some(b))
            | S::FixedSizeBinary(_, Some(b)),
        ) => b.clone(),
        (PartKind::Integer, v) if v.data_type().is_integer() => v.to_string().into_bytes(),
        (kind, S::Dictionary(_, inner)) => return literal_bytes(inner, kind),
        _ => return None,
    }))
}

fn column_of(expr: &Expr) -> Option<&str> {
    match expr {
        Expr::Column(c) => Some(c.name.as_str()),
        _ => None,
    }
}

fn literal_of(expr: &Expr) -> Option<&ScalarValue> {
    match expr {
        Expr::Literal(v, _) => Some(v),
        _ => None,
    }
}

/// The keys one comparison `part op literal` selects, on the part's own bytes.
fn compare(op: Operator, value: Vec<u8>) -> Option<KeySet> {
    let r = match op {
        Operator::Eq => KeyRange::point(value),
        Operator::Lt => KeyRange {
            start: Vec::new(),
            end: Some(value),
        },
        Operator::LtEq => KeyRange {
            start: Vec::new(),
            end: Some(key_after(&value)),
        },
        Operator::Gt => KeyRange {
            start: key_after(&value),
            end: None,
        },
        Operator::GtEq => KeyRange {
            start: value,
            end: None,
        },
        _ => return None,
    };
    Some(KeySet::from_ranges([r]))
}

fn flip(op: Operator) -> Operator {
    match op {
        Operator::Lt => Operator::Gt,
        Operator::LtEq => Operator::GtEq,
        Operator::Gt => Operator::Lt,
        Operator::GtEq => Operator::LtEq,
        other => other,
    }
}

/// A `LIKE` pattern's literal prefix, and whether the pattern is exactly that prefix followed by
/// one `%` (or nothing: then it is an equality).
fn like_prefix(pattern: &str, escape: Option<char>) -> (String, Option<bool>) {
    let escape = escape.unwrap_or('\\');
    let mut prefix = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c == '%' || c == '_' || c == escape {
            let rest: String = std::iter::once(c).chain(chars).collect();
            // Some(true): 'p%' (a prefix); Some(false): anything after is a residual.
            return (prefix, Some(rest == "%"));
        }
        prefix.push(c);
    }
    // No wildcard: an equality.
    (prefix, None)
}

/// What one expression selects of a single part's values (as bytes), and whether exactly.
/// `None`: not a predicate on `column`.
fn part_predicate(expr: &Expr, column: &str, kind: PartKind) -> Option<(KeySet, bool)> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And => {
                let l = part_predicate(left, column, kind);
                let r = part_predicate(right, column, kind);
                match (l, r) {
                    (Some((a, ea)), Some((b, eb))) => Some((a.intersect(&b), ea && eb)),
                    (Some((a, _)), None) | (None, Some((a, _))) => Some((a, false)),
                    (None, None) => None,
                }
            }
            Operator::Or => {
                let (a, ea) = part_predicate(left, column, kind)?;
                let (b, eb) = part_predicate(right, column, kind)?;
                Some((a.union(&b), ea && eb))
            }
            _ => {
                let (op, lit) = match (column_of(left), column_of(right)) {
                    (Some(c), _) if c == column => (*op, literal_of(right)?),
                    (_, Some(c)) if c == column => (flip(*op), literal_of(left)?),
                    _ => return None,
                };
                if op != Operator::Eq && !kind.ordered() {
                    return None;
                }
                match literal_bytes(lit, kind)? {
                    // A comparison with NULL keeps no row.
                    None => Some((KeySet::none(), true)),
                    Some(v) => Some((compare(op, v)?, true)),
                }
            }
        },
        Expr::InList(list) if !list.negated && column_of(&list.expr) == Some(column) => {
            if list.list.len() > MAX_KEYS {
                return None;
            }
            let mut ranges = Vec::with_capacity(list.list.len());
            for item in &list.list {
                if let Some(v) = literal_bytes(literal_of(item)?, kind)? {
                    ranges.push(KeyRange::point(v));
                }
            }
            Some((KeySet::from_ranges(ranges), true))
        }
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) if column_of(expr) == Some(column) && kind.ordered() => {
            let (Some(lo), Some(hi)) = (
                literal_bytes(literal_of(low)?, kind)?,
                literal_bytes(literal_of(high)?, kind)?,
            ) else {
                return Some((KeySet::none(), true));
            };
            Some((
                KeySet::from_ranges([KeyRange {
                    start: lo,
                    end: Some(key_after(&hi)),
                }]),
                true,
            ))
        }
        Expr::Like(Like {
            negated: false,
            expr,
            pattern,
            escape_char,
            case_insensitive: false,
        }) if column_of(expr) == Some(column) && kind == PartKind::Text => {
            let pattern = match literal_of(pattern)? {
                ScalarValue::Utf8(p) | ScalarValue::LargeUtf8(p) | ScalarValue::Utf8View(p) => {
                    p.as_deref()
                }
                _ => return None,
            };
            let Some(pattern) = pattern else {
                return Some((KeySet::none(), true));
            };
            match like_prefix(pattern, *escape_char) {
                (p, None) => Some((KeySet::from_ranges([KeyRange::point(p.into_bytes())]), true)),
                (p, Some(exact)) => Some((
                    KeySet::from_ranges([KeyRange::prefix(p.into_bytes())]),
                    exact,
                )),
            }
        }
        Expr::IsNotNull(inner) if column_of(inner) == Some(column) => Some((KeySet::all(), true)),
        _ => None,
    }
}

/// The equality values of a part (`=`, `IN`, or an `OR` of them: DataFusion rewrites a short
/// `IN` list so), `None` for anything else.
fn part_values(expr: &Expr, column: &str, kind: PartKind) -> Option<Vec<Vec<u8>>> {
    let (set, exact) = part_predicate(expr, column, kind)?;
    (exact && (set.is_empty() || set.is_points()))
        .then(|| set.ranges().iter().map(|r| r.start.clone()).collect())
}

impl KeyLayout {
    /// The keys `filters` (a conjunction) select; see the module docs.
    pub fn plan(&self, filters: &[&Expr]) -> KeyPlan {
        let mut used = vec![None; filters.len()];
        let n = self.parts.len();
        if n == 0 {
            return KeyPlan {
                keys: KeySet::all(),
                used,
            };
        }
        if n == 1 {
            let (column, kind) = &self.parts[0];
            let mut keys = KeySet::all();
            for (i, f) in filters.iter().enumerate() {
                if let Some((set, exact)) = part_predicate(f, column, *kind) {
                    keys = keys.intersect(&set);
                    used[i] = Some(exact);
                }
            }
            return KeyPlan { keys, used };
        }
        // Composite: equalities on the leading parts make prefixes (or whole keys); a predicate
        // on the last part narrows within them when every other part is fixed.
        let mut prefixes: Vec<Vec<u8>> = vec![Vec::new()];
        let mut fixed = 0;
        for (j, (column, kind)) in self.parts.iter().enumerate() {
            let mut values: Option<Vec<Vec<u8>>> = None;
            let mut users = Vec::new();
            for (i, f) in filters.iter().enumerate() {
                if let Some(v) = part_values(f, column, *kind) {
                    values = Some(match values {
                        None => v,
                        Some(prev) => prev.into_iter().filter(|x| v.contains(x)).collect(),
                    });
                    users.push(i);
                }
            }
            let Some(mut values) = values else { break };
            let last = j + 1 == n;
            if !last {
                // A leading part never contains the delimiter once read back.
                values.retain(|v| !contains(v, &self.delimiter));
            }
            if prefixes.len().saturating_mul(values.len().max(1)) > MAX_KEYS {
                break;
            }
            let mut next = Vec::with_capacity(prefixes.len() * values.len());
            for p in &prefixes {
                for v in &values {
                    let mut key = p.clone();
                    key.extend_from_slice(v);
                    if !last {
                        key.extend_from_slice(&self.delimiter);
                    }
                    next.push(key);
                }
            }
            prefixes = next;
            for i in users {
                used[i] = Some(true);
            }
            fixed += 1;
        }
        let keys = if fixed == n {
            KeySet::from_ranges(prefixes.into_iter().map(KeyRange::point))
        } else if fixed == 0 {
            KeySet::all()
        } else if fixed + 1 == n {
            // Every leading part fixed: a predicate on the last part applies to the rest of
            // the key.
            let (column, kind) = &self.parts[n - 1];
            let mut suffix = KeySet::all();
            for (i, f) in filters.iter().enumerate() {
                if used[i].is_some() {
                    continue;
                }
                if let Some((set, exact)) = part_predicate(f, column, *kind) {
                    suffix = suffix.intersect(&set);
                    used[i] = Some(exact);
                }
            }
            let mut ranges = Vec::new();
            for p in &prefixes {
                for r in suffix.ranges() {
                    let mut start = p.clone();
                    start.extend_from_slice(&r.start);
                    let end = match &r.end {
                        Some(e) => {
                            let mut end = p.clone();
                            end.extend_from_slice(e);
                            Some(end)
                        }
                        None => prefix_end(p),
                    };
                    ranges.push(KeyRange { start, end });
                }
            }
            KeySet::from_ranges(ranges)
        } else {
            KeySet::from_ranges(prefixes.into_iter().map(KeyRange::prefix))
        };
        KeyPlan { keys, used }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::{col, lit};

    use super::*;

    fn text(names: &[&str]) -> KeyLayout {
        KeyLayout {
            parts: names
                .iter()
                .map(|n| (n.to_string(), PartKind::Text))
                .collect(),
            delimiter: b"#".to_vec(),
        }
    }

    fn plan(layout: &KeyLayout, filters: &[Expr]) -> KeyPlan {
        let refs: Vec<&Expr> = filters.iter().collect();
        layout.plan(&refs)
    }

    #[test]
    fn equalities_in_lists_and_ranges_of_one_text_key_are_exact() {
        let l = text(&["k"]);
        let p = plan(&l, &[col("k").eq(lit("a"))]);
        assert_eq!(p.keys.to_row_set().row_keys, vec![b"a".to_vec()]);
        assert!(p.all_exact());
        let p = plan(&l, &[col("k").in_list(vec![lit("b"), lit("a")], false)]);
        assert_eq!(p.keys.to_string(), "['a', 'b']");
        let p = plan(&l, &[col("k").gt_eq(lit("b")), col("k").lt(lit("d"))]);
        assert_eq!(p.keys.to_string(), "[['b'..'d')]");
        assert!(p.all_exact());
        let p = plan(&l, &[col("k").between(lit("b"), lit("d"))]);
        assert_eq!(p.keys.to_string(), "[['b'..'d\\x00')]");
        let p = plan(&l, &[lit("c").gt(col("k"))]);
        assert_eq!(p.keys.to_string(), "[[''..'c')]");
        let p = plan(
            &l,
            &[col("k").eq(lit("a")).or(col("k").like(lit("user-%")))],
        );
        assert_eq!(p.keys.to_string(), "['a', ['user-'..'user.')]");
        assert!(p.all_exact());
    }

    #[test]
    fn like_is_a_prefix_exact_only_for_a_trailing_percent() {
        let l = text(&["k"]);
        let p = plan(&l, &[col("k").like(lit("ab%"))]);
        assert_eq!(p.keys.to_string(), "[['ab'..'ac')]");
        assert_eq!(p.used, vec![Some(true)]);
        let p = plan(&l, &[col("k").like(lit("ab_c%"))]);
        assert_eq!(p.keys.to_string(), "[['ab'..'ac')]");
        assert_eq!(p.used, vec![Some(false)]);
        let p = plan(&l, &[col("k").like(lit("%x"))]);
        assert!(p.keys.is_all());
        assert_eq!(p.used, vec![Some(false)]);
        let p = plan(&l, &[col("k").ilike(lit("ab%"))]);
        assert_eq!(p.used, vec![None]);
    }

    #[test]
    fn an_integer_key_takes_equalities_as_decimal_text_and_leaves_ranges() {
        let l = KeyLayout {
            parts: vec![("id".into(), PartKind::Integer)],
            delimiter: b"#".to_vec(),
        };
        let p = plan(
            &l,
            &[col("id").in_list(vec![lit(42i64), lit(-7i64)], false)],
        );
        assert_eq!(p.keys.to_string(), "['-7', '42']");
        let p = plan(&l, &[col("id").gt(lit(5i64))]);
        assert!(p.keys.is_all());
        assert_eq!(p.used, vec![None]);
    }

    #[test]
    fn composite_keys_make_prefixes_points_and_ranges_under_a_prefix() {
        let l = text(&["a", "b", "c"]);
        let p = plan(&l, &[col("a").eq(lit("x"))]);
        assert_eq!(p.keys.to_string(), "[['x#'..'x$')]");
        let p = plan(
            &l,
            &[
                col("a").eq(lit("x")),
                col("b").eq(lit("1")).or(col("b").eq(lit("2"))),
                col("c").eq(lit("z")),
            ],
        );
        assert_eq!(p.keys.to_string(), "['x#1#z', 'x#2#z']");
        assert!(p.all_exact());
        let p = plan(
            &l,
            &[
                col("a").eq(lit("x")),
                col("b").eq(lit("1")),
                col("c").gt_eq(lit("m")),
            ],
        );
        assert_eq!(p.keys.to_string(), "[['x#1#m'..'x#1$')]");
        assert!(p.all_exact());
        // A filter on a later part without the ones before it is left to DataFusion.
        let p = plan(&l, &[col("b").eq(lit("1"))]);
        assert!(p.keys.is_all());
        assert_eq!(p.used, vec![None]);
        // A leading part containing the delimiter matches no row.
        let p = plan(&l, &[col("a").eq(lit("x#y"))]);
        assert!(p.keys.is_empty());
    }

    #[test]
    fn sets_intersect_unite_split_and_resume_after_a_key() {
        let s = KeySet::from_ranges([
            KeyRange::prefix(b"a".to_vec()),
            KeyRange::point(b"c".to_vec()),
            KeyRange {
                start: b"e".to_vec(),
                end: None,
            },
        ]);
        assert_eq!(
            s.after(b"a5").to_string(),
            "[['a5\\x00'..'b'), 'c', ['e'..)]"
        );
        let parts = s.split_at(&[b"b".to_vec(), b"f".to_vec()]);
        let shown: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
        assert_eq!(shown, ["[['a'..'b')]", "['c', ['e'..'f')]", "[['f'..)]"]);
        assert!(KeySet::all().split_at(&[]).first().unwrap().is_all());
        assert!(s.intersect(&KeySet::none()).is_empty());
        assert_eq!(
            KeySet::from_ranges([KeyRange::point(b"a".to_vec())])
                .union(&KeySet::all())
                .to_string(),
            "all"
        );
        assert_eq!(prefix_end(&[0x61, 0xFF]), Some(vec![0x62]));
        assert_eq!(prefix_end(&[0xFF]), None);
    }
}
