//! The null method of this connector's service (feature `testing`): what
//! `gcp-sql serve-null --service pubsub` answers, written straight from the counted request
//! (see [`crate::bench::null_method`]).

use prost::bytes::BufMut;
use prost::encoding::WireType;

use crate::bench::null_method::{
    CountedRequest, MAX_REQUEST_BYTES, NullAnswer, NullMethod, NullService, WriteOnly, routes,
};

/// The gRPC service of the method.
const SERVICE_NAME: &str = "google.pubsub.v1.Publisher";

/// This service's null method, as its descriptor carries it.
pub static NULL_METHOD: NullMethod = NullMethod {
    name: "pubsub",
    method_path: super::client::PUBLISH_PATH,
    records_word: "messages",
    max_request_bytes: MAX_REQUEST_BYTES,
    routes: routes::<NullPublishResponse>,
};

impl NullService {
    /// The Pub/Sub null service.
    #[allow(non_upper_case_globals)]
    pub const PubSub: NullService = NullService::of(&NULL_METHOD);
}

/// A `PublishResponse` with ids `first .. first + count`, written as decimal strings.
#[derive(Debug)]
struct NullPublishResponse {
    first: u64,
    count: u64,
}

/// Field number of `PublishResponse.message_ids`.
const MESSAGE_IDS_FIELD: u32 = 1;

impl WriteOnly for NullPublishResponse {
    fn write(&self, buf: &mut impl BufMut) {
        let mut text = itoa::Buffer::new();
        for id in self.first..self.first + self.count {
            let id = text.format(id);
            prost::encoding::encode_key(MESSAGE_IDS_FIELD, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(id.len() as u64, buf);
            buf.put_slice(id.as_bytes());
        }
    }

    fn written_len(&self) -> usize {
        let mut text = itoa::Buffer::new();
        (self.first..self.first + self.count)
            // Key (1 byte), length (1 byte: an id has at most 20 digits), digits.
            .map(|id| 2 + text.format(id).len())
            .sum()
    }
}

impl NullAnswer for NullPublishResponse {
    const SERVICE: &'static str = SERVICE_NAME;
    const STREAMING: bool = false;
    fn answer(request: CountedRequest, first_id: u64) -> Self {
        NullPublishResponse {
            first: first_id,
            count: request.records,
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::bench::null_method::Answer;

    #[test]
    fn response_encodes_as_the_generated_type_with_one_id_per_message() {
        let response = Answer(NullPublishResponse {
            first: 98,
            count: 4,
        });
        let bytes = response.encode_to_vec();
        assert_eq!(bytes.len(), response.encoded_len());
        let decoded =
            gcloud_sdk::google::pubsub::v1::PublishResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.message_ids, vec!["98", "99", "100", "101"]);
    }
}
