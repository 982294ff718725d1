//! Where a transport's channels come from: an emulator address (plaintext) or an authenticated
//! Google endpoint.

use std::path::Path;

use gcloud_sdk::{GoogleApi, GoogleAuthMiddleware};
use tonic::transport::Endpoint;

use super::channel::GrpcChannel;
use super::plaintext::plaintext_endpoint;
use super::tls::{connect, require_tls};
use crate::error::Result;

/// Where a transport's channels come from: an emulator address (plaintext channels, connected
/// lazily, without HTTP/2 keepalive pings and without credentials) or an authenticated Google
/// endpoint (TLS, credentials from `credentials_file` or Application Default Credentials).
#[derive(Clone)]
pub enum Connection {
    /// Plaintext channels to this address.
    Plaintext(Box<Endpoint>),
    /// The authenticated client of the first endpoint; further channels share its token source.
    Google(GoogleApi<GoogleAuthMiddleware>),
}

impl Connection {
    /// Prepares the channels of a transport.
    ///
    /// With an `emulator_host` (an empty one counts as none) the address is only parsed
    /// ([`plaintext_endpoint`]); nothing connects until the first call. Else
    /// the credentials are loaded and a TLS channel to `endpoint` is connected here (see
    /// [`connect`]); failures are [`Error::Connect`].
    pub async fn open(
        emulator_host: Option<&str>,
        endpoint: &str,
        credentials_file: Option<&Path>,
    ) -> Result<Self> {
        match emulator_host.filter(|h| !h.trim().is_empty()) {
            Some(host) => Self::plaintext(host),
            None => Ok(Connection::Google(
                connect(endpoint, credentials_file).await?,
            )),
        }
    }

    /// Plaintext channels to `host` (`host:port` or `http://host:port`); connects nothing.
    pub fn plaintext(host: &str) -> Result<Self> {
        Ok(Connection::Plaintext(Box::new(plaintext_endpoint(host)?)))
    }

    /// Whether the channels are plaintext ones (an emulator or a fake server).
    pub fn is_plaintext(&self) -> bool {
        matches!(self, Connection::Plaintext(_))
    }

    /// The first channel: a new lazily connected plaintext channel, or the authenticated channel
    /// [`open`](Self::open) connected.
    pub fn channel(&self) -> GrpcChannel {
        match self {
            Connection::Plaintext(endpoint) => GrpcChannel::Plaintext(endpoint.connect_lazy()),
            Connection::Google(api) => GrpcChannel::Google(api.get()),
        }
    }

    /// Another channel: plaintext ones go to the same address whatever `url` says; Google ones
    /// are connected to `url` now, sharing the first channel's credentials and token source.
    /// The error is the connection failure's message.
    pub async fn channel_to(&self, url: &str) -> std::result::Result<GrpcChannel, String> {
        match self {
            Connection::Plaintext(endpoint) => Ok(GrpcChannel::Plaintext(endpoint.connect_lazy())),
            Connection::Google(api) => {
                require_tls(url)?;
                api.connect_with_endpoint(std::convert::identity, url, None)
                    .await
                    .map(|api| GrpcChannel::Google(api.get()))
                    .map_err(|e| e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{absent_file, connect_error};

    #[tokio::test]
    async fn an_emulator_connection_never_reads_the_credentials_file() {
        // A credentials file that does not exist: reading it would fail the open.
        let (_dir, absent) = absent_file("absent.json");
        let connection = Connection::open(
            Some("127.0.0.1:1"),
            "https://pubsub.googleapis.com",
            Some(&absent),
        )
        .await
        .unwrap();
        assert!(connection.is_plaintext());
        assert!(!connection.channel().is_google());
    }

    #[tokio::test]
    async fn an_emulator_connection_hands_out_plaintext_channels_whatever_the_url() {
        let connection =
            Connection::open(Some("127.0.0.1:1"), "https://pubsub.googleapis.com", None)
                .await
                .unwrap();
        assert!(connection.is_plaintext());
        assert!(!connection.channel().is_google());
        let admin = connection
            .channel_to("https://bigtableadmin.googleapis.com")
            .await
            .unwrap();
        assert!(!admin.is_google());
    }

    #[test]
    fn an_invalid_emulator_address_is_a_connect_error_naming_it() {
        let (endpoint, _) = connect_error(Connection::plaintext("http://[::1"));
        assert_eq!(endpoint, "http://[::1");
    }
}
