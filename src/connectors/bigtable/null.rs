//! The null method of this connector's service (feature `testing`): what
//! `gcp-sql serve-null --service bigtable` answers, written straight from the counted request
//! (see [`crate::bench::null_method`]).

use prost::bytes::BufMut;
use prost::encoding::WireType;

use crate::bench::null_method::{
    CountedRequest, MAX_MUTATE_ROWS_REQUEST_BYTES, NullAnswer, NullMethod, NullService, WriteOnly,
    routes,
};

/// The gRPC service of the method.
const SERVICE_NAME: &str = "google.bigtable.v2.Bigtable";

/// This service's null method, as its descriptor carries it.
pub static NULL_METHOD: NullMethod = NullMethod {
    name: "bigtable",
    method_path: super::client::MUTATE_ROWS_PATH,
    records_word: "entries",
    max_request_bytes: MAX_MUTATE_ROWS_REQUEST_BYTES,
    routes: routes::<NullMutateRowsResponse>,
};

impl NullService {
    /// The Bigtable null service.
    #[allow(non_upper_case_globals)]
    pub const Bigtable: NullService = NullService::of(&NULL_METHOD);
}

/// A `MutateRowsResponse` with one entry per request entry, indexes `0 .. count`, each with an
/// OK status (an empty `google.rpc.Status`, as proto3 writes code 0).
#[derive(Debug)]
struct NullMutateRowsResponse {
    count: u64,
}

/// Field number of `MutateRowsResponse.entries`.
const MUTATE_ENTRIES_FIELD: u32 = 1;
/// Field numbers of `MutateRowsResponse.Entry.index` and `.status`.
const ENTRY_INDEX_FIELD: u32 = 1;
const ENTRY_STATUS_FIELD: u32 = 2;

impl NullMutateRowsResponse {
    /// Bytes of the `Entry` for `index` (without its key and length prefix): the index (left out
    /// at 0, as proto3 does) and the empty status.
    fn entry_len(index: u64) -> usize {
        let index_len = if index == 0 {
            0
        } else {
            1 + prost::encoding::encoded_len_varint(index)
        };
        index_len + 2
    }
}

impl WriteOnly for NullMutateRowsResponse {
    fn write(&self, buf: &mut impl BufMut) {
        for index in 0..self.count {
            prost::encoding::encode_key(MUTATE_ENTRIES_FIELD, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(Self::entry_len(index) as u64, buf);
            if index != 0 {
                prost::encoding::encode_key(ENTRY_INDEX_FIELD, WireType::Varint, buf);
                prost::encoding::encode_varint(index, buf);
            }
            prost::encoding::encode_key(ENTRY_STATUS_FIELD, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(0, buf);
        }
    }

    fn written_len(&self) -> usize {
        (0..self.count)
            // Key (1 byte), length (1 byte: an entry is at most 13 bytes), the entry.
            .map(|index| 2 + Self::entry_len(index))
            .sum()
    }
}

impl NullAnswer for NullMutateRowsResponse {
    const SERVICE: &'static str = SERVICE_NAME;
    const STREAMING: bool = true;
    fn answer(request: CountedRequest, _first_id: u64) -> Self {
        NullMutateRowsResponse {
            count: request.records,
        }
    }
}

#[cfg(test)]
mod tests {
    use gcloud_sdk::google::bigtable::v2::MutateRowsResponse;
    use prost::Message as _;

    use super::*;
    use crate::bench::null_method::Answer;

    #[test]
    fn mutate_rows_response_encodes_as_the_generated_type_with_ok_for_every_entry() {
        for count in [0u64, 1, 3, 200] {
            let response = Answer(NullMutateRowsResponse { count });
            let bytes = response.encode_to_vec();
            assert_eq!(bytes.len(), response.encoded_len(), "{count} entries");
            let decoded = MutateRowsResponse::decode(bytes.as_slice()).unwrap();
            let indexes: Vec<i64> = decoded.entries.iter().map(|e| e.index).collect();
            assert_eq!(indexes, (0..count as i64).collect::<Vec<_>>());
            assert!(
                decoded
                    .entries
                    .iter()
                    .all(|e| e.status.as_ref().is_some_and(|s| s.code == 0)),
                "every entry has an OK status"
            );
        }
    }
}
