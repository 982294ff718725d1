//! Helpers the transport tests share: a wrapped error, a closed port, a one-connection server,
//! and one call through a plaintext [`GrpcChannel`].

use std::time::Duration;

use super::channel::GrpcChannel;
use super::deadline::with_deadline;
use super::plaintext::plaintext_endpoint;
use super::pre_encoded::{PreEncoded, unary_pre_encoded};

/// An error with a source, as a middleware might wrap one.
#[derive(Debug)]
pub(super) struct Wrapped(pub(super) Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("wrapped")
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

pub(super) fn from_error(error: impl std::error::Error + Send + Sync + 'static) -> tonic::Status {
    tonic::Status::from_error(Box::new(error))
}

/// A loopback port where nothing listens (bound, then released).
pub(super) fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    address
}

/// A listener that takes one connection and then does `then` with it.
pub(super) async fn one_connection<F, Fut>(then: F) -> String
where
    F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        if let Ok((stream, _)) = listener.accept().await {
            then(stream).await;
        }
    });
    address
}

pub(super) async fn call_through_channel(
    address: &str,
    timeout: Option<Duration>,
) -> tonic::Status {
    let endpoint = plaintext_endpoint(address).unwrap();
    let request = with_deadline(
        tonic::Request::new(PreEncoded(vec![0x0a, 0x01, b't'])),
        timeout,
        false,
    );
    let result: std::result::Result<tonic::Response<PreEncoded>, _> = unary_pre_encoded(
        GrpcChannel::Plaintext(endpoint.connect_lazy()),
        request,
        "/google.pubsub.v1.Publisher/Publish",
    )
    .await;
    result.unwrap_err()
}
