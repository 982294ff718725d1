//! Calls whose request body is already serialized.

use std::fmt::Debug;

use tonic::codegen::{Body, Bytes, StdError, http};

/// A request message already serialized (by the connector's mapping), written to the wire as
/// it is, so a batch is sent without building and re-encoding the generated prost types.
///
/// `B` is the buffer: a `Vec<u8>` by default, or anything else that reads as bytes (such as
/// [`Bytes`], to share one body between calls). The type is only ever encoded; decoding one
/// skips every field.
///
/// # Example
///
/// ```
/// use gcp_sql::google::PreEncoded;
/// use prost::Message;
///
/// // A `Topic` whose `name` (field 1) is "t".
/// let body = PreEncoded(vec![0x0a, 0x01, b't']);
/// assert_eq!(body.encoded_len(), 3);
/// assert_eq!(body.encode_to_vec(), [0x0a, 0x01, b't']);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreEncoded<B = Vec<u8>>(pub B);

impl<B> prost::Message for PreEncoded<B>
where
    B: AsRef<[u8]> + Default + Debug + Send + Sync,
{
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(self.0.as_ref());
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> std::result::Result<(), prost::DecodeError> {
        // Only ever encoded; a decode (which nothing does) would skip every field.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.as_ref().len()
    }

    fn clear(&mut self) {
        self.0 = B::default();
    }
}

/// Waits until `service` can take a call and returns a gRPC client on it; a service that
/// cannot become ready is `UNAVAILABLE` ("channel not ready: ...").
pub async fn ready<T>(service: T) -> std::result::Result<tonic::client::Grpc<T>, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    let mut grpc = tonic::client::Grpc::new(service);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("channel not ready: {}", e.into())))?;
    Ok(grpc)
}

/// Makes one unary call of the method at `path` (`/package.Service/Method`) on `service`,
/// sending the pre-serialized body of `request` and decoding the response as `R`.
pub async fn unary_pre_encoded<T, B, R>(
    service: T,
    request: tonic::Request<PreEncoded<B>>,
    path: &'static str,
) -> std::result::Result<tonic::Response<R>, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
    B: AsRef<[u8]> + Default + Debug + Send + Sync + 'static,
    R: prost::Message + Default + Send + 'static,
{
    let mut grpc = ready(service).await?;
    let codec = tonic_prost::ProstCodec::<PreEncoded<B>, R>::default();
    grpc.unary(request, http::uri::PathAndQuery::from_static(path), codec)
        .await
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn pre_encoded_bytes_go_to_the_wire_unchanged() {
        let body = vec![0x0a, 0x03, b'a', b'b', b'c', 0x10, 0x01];
        let message = PreEncoded(body.clone());
        assert_eq!(message.encoded_len(), body.len());
        assert_eq!(message.encode_to_vec(), body);
        let shared = PreEncoded(Bytes::from(body.clone()));
        assert_eq!(shared.encode_to_vec(), body);
    }

    #[test]
    fn decoding_into_pre_encoded_skips_every_field() {
        let decoded = PreEncoded::<Vec<u8>>::decode(&[0x0a, 0x01, b't', 0x10, 0x05][..]).unwrap();
        assert!(decoded.0.is_empty());
        assert!(PreEncoded::<Vec<u8>>::decode(&[0x0a, 0x05, b't'][..]).is_err());
    }
}
