//! `ReadRowsResponse`s read in place: the scan takes each response as the bytes tonic received
//! ([`ReadRowsCodec`]) and walks its cell chunks as slices of them ([`for_each_chunk`]), where
//! the generated type would allocate a row key, a family name, a qualifier and a value for
//! every chunk and copy each of them once more into the scan's row. A profile of a full scan
//! put half of its CPU time in that decoding and the allocator (docs/benchmarks.md, "Reading
//! Bigtable on the null `ReadRows` server").
//!
//! What is read of each chunk is exactly what the generated type would hold: fields 1 to 9 of
//! `google.bigtable.v2.ReadRowsResponse.CellChunk` (labels skipped), the `StringValue` /
//! `BytesValue` wrappers of family and qualifier told apart from their absence, and every
//! unknown field skipped by its wire type, so a newer server's additions are harmless.

use gcloud_sdk::google::bigtable::v2::ReadRowsRequest;
use prost::bytes::{Buf, Bytes};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};

use crate::error::{Error, Result};

/// One `CellChunk`, borrowed from its response's bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRef<'a> {
    /// The row key (empty: the row of the previous chunk).
    pub row_key: &'a [u8],
    /// The family, when the chunk sets one.
    pub family: Option<&'a [u8]>,
    /// The qualifier, when the chunk sets one.
    pub qualifier: Option<&'a [u8]>,
    /// The cell's version.
    pub timestamp_micros: i64,
    /// This chunk's part of the value.
    pub value: &'a [u8],
    /// Nonzero while the value continues in the next chunk.
    pub value_size: i32,
    /// The row so far is to be dropped.
    pub reset_row: bool,
    /// The row is complete.
    pub commit_row: bool,
}

/// Field numbers of `ReadRowsResponse`.
const RESPONSE_CHUNKS: u32 = 1;
const RESPONSE_LAST_SCANNED: u32 = 2;
/// Field numbers of `CellChunk`.
const ROW_KEY: u32 = 1;
const FAMILY: u32 = 2;
const QUALIFIER: u32 = 3;
const TIMESTAMP: u32 = 4;
const VALUE: u32 = 6;
const VALUE_SIZE: u32 = 7;
const RESET_ROW: u32 = 8;
const COMMIT_ROW: u32 = 9;

/// Wire types.
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LENGTH_DELIMITED: u64 = 2;
const FIXED32: u64 = 5;

/// What was wrong with a response (kept to a word, so that the hot path returns no large
/// error type).
#[derive(Debug, Clone, Copy)]
struct Malformed(&'static str);

impl From<Malformed> for Error {
    fn from(m: Malformed) -> Error {
        Error::Unsupported(format!("ReadRows sent a malformed response: {}", m.0))
    }
}

#[inline(always)]
fn varint(buf: &mut &[u8]) -> std::result::Result<u64, Malformed> {
    // Tags, short lengths and booleans are one byte.
    if let Some(&b) = buf.first()
        && b < 0x80
    {
        *buf = &buf[1..];
        return Ok(u64::from(b));
    }
    prost::encoding::decode_varint(buf).map_err(|_| Malformed("a bad varint"))
}

/// One field: its number, its wire type, and its bytes (length-delimited) or its value.
type Field<'a> = (u32, u64, &'a [u8], u64);

/// The next field of `buf`.
#[inline(always)]
fn field<'a>(buf: &mut &'a [u8]) -> std::result::Result<Field<'a>, Malformed> {
    let key = varint(buf)?;
    let (tag, wire) = ((key >> 3) as u32, key & 7);
    match wire {
        VARINT => Ok((tag, wire, &[], varint(buf)?)),
        LENGTH_DELIMITED => {
            let len = usize::try_from(varint(buf)?).map_err(|_| Malformed("a huge length"))?;
            if len > buf.len() {
                return Err(Malformed("a field longer than its message"));
            }
            let (bytes, rest) = buf.split_at(len);
            *buf = rest;
            Ok((tag, wire, bytes, 0))
        }
        FIXED64 if buf.len() >= 8 => {
            let v = buf.get_u64_le();
            Ok((tag, wire, &[], v))
        }
        FIXED32 if buf.len() >= 4 => {
            let v = u64::from(buf.get_u32_le());
            Ok((tag, wire, &[], v))
        }
        _ => Err(Malformed("an unexpected wire type")),
    }
}

/// The value of a `StringValue` / `BytesValue` message (empty when it has none).
#[inline(always)]
fn wrapped(mut message: &[u8]) -> std::result::Result<&[u8], Malformed> {
    let mut value: &[u8] = &[];
    while !message.is_empty() {
        let (tag, wire, bytes, _) = field(&mut message)?;
        if tag == 1 && wire == LENGTH_DELIMITED {
            value = bytes;
        }
    }
    Ok(value)
}

#[inline(always)]
fn chunk(mut message: &[u8]) -> std::result::Result<ChunkRef<'_>, Malformed> {
    let mut c = ChunkRef::default();
    while !message.is_empty() {
        let (tag, wire, bytes, number) = field(&mut message)?;
        match (tag, wire) {
            (ROW_KEY, LENGTH_DELIMITED) => c.row_key = bytes,
            (FAMILY, LENGTH_DELIMITED) => c.family = Some(wrapped(bytes)?),
            (QUALIFIER, LENGTH_DELIMITED) => c.qualifier = Some(wrapped(bytes)?),
            (TIMESTAMP, VARINT) => c.timestamp_micros = number as i64,
            (VALUE, LENGTH_DELIMITED) => c.value = bytes,
            (VALUE_SIZE, VARINT) => c.value_size = number as i32,
            // The row status is a oneof: the last one set wins.
            (RESET_ROW, VARINT) => (c.reset_row, c.commit_row) = (number != 0, false),
            (COMMIT_ROW, VARINT) => (c.reset_row, c.commit_row) = (false, number != 0),
            _ => {}
        }
    }
    Ok(c)
}

/// Calls `each` with every chunk of the serialized `ReadRowsResponse` `response`, in order;
/// returns its `last_scanned_row_key` (empty when it has none).
pub fn for_each_chunk<'a>(
    mut response: &'a [u8],
    mut each: impl FnMut(ChunkRef<'a>) -> Result<()>,
) -> Result<&'a [u8]> {
    let mut last_scanned: &[u8] = &[];
    while !response.is_empty() {
        let (tag, wire, bytes, _) = field(&mut response)?;
        match (tag, wire) {
            (RESPONSE_CHUNKS, LENGTH_DELIMITED) => each(chunk(bytes)?)?,
            (RESPONSE_LAST_SCANNED, LENGTH_DELIMITED) => last_scanned = bytes,
            _ => {}
        }
    }
    Ok(last_scanned)
}

/// Takes a whole response message as the bytes received, without copying them.
#[derive(Debug, Default)]
pub struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> std::result::Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// `ReadRows` with the request encoded by prost and each response kept as its bytes.
#[derive(Debug, Default)]
pub struct ReadRowsCodec;

impl Codec for ReadRowsCodec {
    type Encode = ReadRowsRequest;
    type Decode = Bytes;
    type Encoder = tonic_prost::ProstEncoder<ReadRowsRequest>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstCodec::<ReadRowsRequest, ReadRowsRequest>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

#[cfg(test)]
mod tests {
    use gcloud_sdk::google::bigtable::v2::ReadRowsResponse;
    use gcloud_sdk::google::bigtable::v2::read_rows_response::CellChunk;
    use gcloud_sdk::google::bigtable::v2::read_rows_response::cell_chunk::RowStatus;
    use prost::Message as _;

    use super::*;

    fn read(response: &ReadRowsResponse) -> (Vec<CellChunk>, Vec<u8>) {
        let bytes = response.encode_to_vec();
        let mut out = Vec::new();
        let last = for_each_chunk(&bytes, |c| {
            out.push(CellChunk {
                row_key: c.row_key.to_vec(),
                family_name: c
                    .family
                    .map(|f| String::from_utf8(f.to_vec()).expect("a UTF-8 family")),
                qualifier: c.qualifier.map(<[u8]>::to_vec),
                timestamp_micros: c.timestamp_micros,
                labels: Vec::new(),
                value: c.value.to_vec(),
                value_size: c.value_size,
                row_status: if c.reset_row {
                    Some(RowStatus::ResetRow(true))
                } else if c.commit_row {
                    Some(RowStatus::CommitRow(true))
                } else {
                    None
                },
            });
            Ok(())
        })
        .unwrap();
        (out, last.to_vec())
    }

    #[test]
    fn chunks_read_in_place_equal_what_the_generated_type_decodes() {
        let response = ReadRowsResponse {
            chunks: vec![
                CellChunk {
                    row_key: b"k1".to_vec(),
                    family_name: Some("cf".into()),
                    qualifier: Some(b"q".to_vec()),
                    timestamp_micros: 1_700_000_000_000_000,
                    labels: vec!["skipped".into()],
                    value: b"va".to_vec(),
                    value_size: 3,
                    row_status: None,
                },
                CellChunk {
                    value: b"l".to_vec(),
                    row_status: Some(RowStatus::CommitRow(true)),
                    ..Default::default()
                },
                CellChunk {
                    row_key: b"k2".to_vec(),
                    // Present but empty: an empty family and qualifier, not absent ones.
                    family_name: Some(String::new()),
                    qualifier: Some(Vec::new()),
                    timestamp_micros: -1,
                    ..Default::default()
                },
                CellChunk {
                    row_status: Some(RowStatus::ResetRow(true)),
                    ..Default::default()
                },
            ],
            last_scanned_row_key: b"k9".to_vec(),
            request_stats: None,
        };
        let (chunks, last) = read(&response);
        let mut expected = response.chunks.clone();
        expected[0].labels.clear();
        assert_eq!(chunks, expected);
        assert_eq!(last, b"k9");
    }

    #[test]
    fn unknown_fields_are_skipped_and_a_truncated_response_is_refused() {
        // A chunk with an unknown fixed64 (field 20), fixed32 (21) and varint (22) field.
        let mut bytes = Vec::new();
        let mut chunk = Vec::new();
        prost::encoding::bytes::encode(ROW_KEY, &b"k".to_vec(), &mut chunk);
        prost::encoding::fixed64::encode(20, &7, &mut chunk);
        prost::encoding::fixed32::encode(21, &7, &mut chunk);
        prost::encoding::uint64::encode(22, &7, &mut chunk);
        prost::encoding::bool::encode(COMMIT_ROW, &true, &mut chunk);
        prost::encoding::bytes::encode(RESPONSE_CHUNKS, &chunk, &mut bytes);
        let mut keys = Vec::new();
        for_each_chunk(&bytes, |c| {
            keys.push((c.row_key.to_vec(), c.commit_row));
            Ok(())
        })
        .unwrap();
        assert_eq!(keys, vec![(b"k".to_vec(), true)]);
        let cut = &bytes[..bytes.len() - 3];
        let e = for_each_chunk(cut, |_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("malformed"), "{e}");
    }
}
