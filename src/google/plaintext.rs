//! The plaintext endpoint: how every client and inspection path reaches an emulator (or a fake
//! server): plaintext gRPC, no credentials, no HTTP/2 keepalive pings.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};

/// TCP connect timeout of [`plaintext_endpoint`]: a loopback emulator either accepts at once or
/// is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Renders an error with its chain of causes (tonic's transport errors say little on their own).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// An endpoint for a plaintext gRPC connection to an emulator at `host` (`127.0.0.1:8085`, or a
/// full `http://` URL).
///
/// It sends no HTTP/2 keepalive pings: the Pub/Sub emulator never answers them, so a client that
/// sends them sees its idle connections reset. Keepalive settings meant for Google's endpoints
/// must not be applied to it.
pub fn plaintext_endpoint(host: &str) -> Result<Endpoint> {
    let uri = if host.contains("://") {
        host.to_string()
    } else {
        format!("http://{host}")
    };
    let endpoint = Endpoint::from_shared(uri).map_err(|e| Error::Connect {
        endpoint: host.to_string(),
        message: format!("not a valid emulator address: {}", error_chain(&e)),
    })?;
    Ok(endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true))
}

/// Connects a plaintext gRPC channel to an emulator at `host`; see [`plaintext_endpoint`].
///
/// ```no_run
/// # async fn demo() -> gcp_sql::Result<()> {
/// // Any generated client takes the channel (`XxxClient::new(channel)`).
/// let channel = gcp_sql::google::plaintext_channel("127.0.0.1:8085").await?;
/// # drop(channel);
/// # Ok(())
/// # }
/// ```
pub async fn plaintext_channel(host: &str) -> Result<Channel> {
    plaintext_endpoint(host)?
        .connect()
        .await
        .map_err(|e| Error::Connect {
            endpoint: host.to_string(),
            message: error_chain(&e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_accepts_host_port_and_url() {
        assert_eq!(
            plaintext_endpoint("127.0.0.1:8085")
                .unwrap()
                .uri()
                .to_string(),
            "http://127.0.0.1:8085/"
        );
        assert_eq!(
            plaintext_endpoint("http://localhost:9")
                .unwrap()
                .uri()
                .to_string(),
            "http://localhost:9/"
        );
        assert!(plaintext_endpoint("not a host").is_err());
    }
}
