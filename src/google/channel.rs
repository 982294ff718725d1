//! The one channel type every client calls through: plaintext (an emulator or a fake server)
//! or TLS to Google with OAuth tokens; every call's failure, and its response body's, passes
//! through [`transport_status`].

use std::fmt::Debug;
use std::task::{Context, Poll};

use futures::TryFutureExt;
use futures::future::{Either, MapErr, MapOk};
use gcloud_sdk::GoogleAuthMiddleware;
use http_body_util::BodyExt;
use tonic::codegen::{BoxFuture, Service, StdError, http};
use tonic::transport::channel::ResponseFuture;

use super::status::transport_status;

/// One gRPC channel a client calls through: plaintext (an emulator or a fake server: no TLS,
/// no credentials) or TLS to Google with OAuth tokens added by gcloud-sdk's auth middleware.
///
/// It is a tower service, so a generated client (`PublisherClient::new(channel)`) or
/// [`unary_pre_encoded`] takes either kind without the caller matching on it. Cloning is cheap
/// and shares the underlying HTTP/2 connection.
#[derive(Clone)]
pub enum GrpcChannel {
    /// A plaintext channel (see [`plaintext_endpoint`](super::plaintext_endpoint)).
    Plaintext(tonic::transport::Channel),
    /// An authenticated TLS channel to a Google endpoint.
    Google(GoogleAuthMiddleware),
}

impl GrpcChannel {
    /// Whether calls go to Google through the auth middleware (and so whether a deadline also
    /// bounds the token fetch; see [`with_deadline`]).
    pub fn is_google(&self) -> bool {
        matches!(self, GrpcChannel::Google(_))
    }
}

impl Debug for GrpcChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GrpcChannel::Plaintext(_) => "GrpcChannel::Plaintext",
            GrpcChannel::Google(_) => "GrpcChannel::Google",
        })
    }
}

type PlaintextFuture = MapErr<ResponseFuture, fn(tonic::transport::Error) -> StdError>;

type GrpcResponse = http::Response<tonic::body::Body>;

fn boxed_error(error: tonic::transport::Error) -> StdError {
    error.into()
}

/// A call's failure as tonic would turn it into a status, passed through [`transport_status`];
/// tonic takes a boxed `Status` as it is.
fn call_error(error: StdError) -> StdError {
    Box::new(transport_status(tonic::Status::from_error(error)))
}

/// The response with its body's failures (a connection broken mid-response) passed through
/// [`transport_status`].
fn response_errors(response: GrpcResponse) -> GrpcResponse {
    response.map(|body| tonic::body::Body::new(body.map_err(transport_status)))
}

impl Service<http::Request<tonic::body::Body>> for GrpcChannel {
    type Response = GrpcResponse;
    type Error = StdError;
    /// The channel's own future, its failures and its response body's failures passed through
    /// [`transport_status`].
    type Future = MapOk<
        MapErr<
            Either<PlaintextFuture, BoxFuture<GrpcResponse, StdError>>,
            fn(StdError) -> StdError,
        >,
        fn(GrpcResponse) -> GrpcResponse,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), StdError>> {
        match self {
            GrpcChannel::Plaintext(channel) => channel.poll_ready(cx).map_err(Into::into),
            GrpcChannel::Google(service) => service.poll_ready(cx),
        }
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let call = match self {
            GrpcChannel::Plaintext(channel) => Either::Left(
                channel
                    .call(request)
                    .map_err(boxed_error as fn(tonic::transport::Error) -> StdError),
            ),
            GrpcChannel::Google(service) => Either::Right(service.call(request)),
        };
        call.map_err(call_error as fn(StdError) -> StdError)
            .map_ok(response_errors as fn(GrpcResponse) -> GrpcResponse)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::pre_encoded::{PreEncoded, unary_pre_encoded};
    use super::super::test_support::{call_through_channel, one_connection};
    use super::*;

    #[tokio::test]
    async fn a_plaintext_grpc_channel_fails_a_call_as_the_bare_channel_does() {
        let endpoint = super::super::plaintext_endpoint("127.0.0.1:1").unwrap();
        let call = || tonic::Request::new(PreEncoded(vec![0x0a, 0x01, b't']));
        let path = "/google.pubsub.v1.Publisher/Publish";
        let bare: std::result::Result<tonic::Response<PreEncoded>, _> =
            unary_pre_encoded(endpoint.connect_lazy(), call(), path).await;
        let wrapped: std::result::Result<tonic::Response<PreEncoded>, _> = unary_pre_encoded(
            GrpcChannel::Plaintext(endpoint.connect_lazy()),
            call(),
            path,
        )
        .await;
        let (bare, wrapped) = (bare.unwrap_err(), wrapped.unwrap_err());
        assert_eq!(bare.code(), wrapped.code());
        assert_eq!(bare.message(), wrapped.message());
    }

    #[tokio::test]
    async fn a_connection_reset_by_the_server_is_unavailable_through_a_grpc_channel() {
        let address = one_connection(|mut stream| async move {
            let mut buf = [0u8; 64];
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
            // A reset (RST) rather than an orderly close.
            stream.set_zero_linger().unwrap();
            drop(stream);
        })
        .await;
        let status = call_through_channel(&address, Some(Duration::from_secs(5))).await;
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }

    #[tokio::test]
    async fn a_silent_server_past_the_attempt_deadline_is_deadline_exceeded() {
        let address = one_connection(|stream| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(stream);
        })
        .await;
        let status = call_through_channel(&address, Some(Duration::from_millis(200))).await;
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(status.message().contains("Timeout expired"), "{status:?}");
    }
}
