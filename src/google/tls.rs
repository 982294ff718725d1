//! The authenticated TLS connection to a Google endpoint, and the rule that credentials never
//! travel without TLS.

use std::path::Path;

use gcloud_sdk::{GoogleApi, GoogleAuthMiddleware};

use super::credentials::credentials_from_file;
use crate::error::{Error, Result};

/// Selects the process-wide TLS crypto provider (ring) unless one is installed already.
///
/// The dependency tree enables two rustls providers, and rustls then refuses to pick one by
/// itself; every TLS connection this crate opens (Google endpoints, `gs://`, `s3://`) calls this
/// first.
pub fn install_crypto_provider() {
    // An Err only says that a provider is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Opens an authenticated TLS connection to a Google endpoint.
///
/// Installs the process-wide crypto provider first
/// ([`install_crypto_provider`]). Credentials come
/// from `credentials_file` when given (see [`credentials_from_file`]), else from Application
/// Default Credentials. The channel is connected here, so every failure — an unreadable
/// credentials file as much as an unreachable endpoint — is an [`Error::Connect`] naming
/// `endpoint`.
///
/// More channels sharing the same token source can be opened from the result with
/// `GoogleApi::connect_with_endpoint`.
///
/// Credentials never travel in plaintext: an `endpoint` that is not `https://` is refused
/// before any credential is loaded (see [`require_tls`]). An emulator is reached through
/// [`Connection::plaintext`] instead, which carries none.
pub async fn connect(
    endpoint: &str,
    credentials_file: Option<&Path>,
) -> Result<GoogleApi<GoogleAuthMiddleware>> {
    install_crypto_provider();
    let connect_error = |message: String| Error::Connect {
        endpoint: endpoint.to_string(),
        message,
    };
    require_tls(endpoint).map_err(connect_error)?;
    match credentials_file {
        Some(path) => {
            let credentials = credentials_from_file(path).map_err(connect_error)?;
            GoogleApi::from_function_with_credentials(
                std::convert::identity,
                endpoint,
                None,
                credentials,
            )
            .await
        }
        None => GoogleApi::from_function(std::convert::identity, endpoint, None).await,
    }
    .map_err(|e| connect_error(e.to_string()))
}

/// Refuses an endpoint that would carry credentials without TLS: anything but `https://`.
pub fn require_tls(endpoint: &str) -> std::result::Result<(), String> {
    match endpoint.trim().get(..8) {
        Some(scheme) if scheme.eq_ignore_ascii_case("https://") => Ok(()),
        _ => Err(
            "refusing to send credentials without TLS: an endpoint must be https:// (an emulator \
             is reached with emulator_host, in plaintext and without credentials)"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{absent_file, connect_error};

    #[tokio::test]
    async fn an_unreadable_credentials_file_fails_the_connection_naming_the_endpoint() {
        let (_dir, absent) = absent_file("absent.json");
        let (endpoint, message) =
            connect_error(connect("https://pubsub.googleapis.com", Some(&absent)).await);
        assert_eq!(endpoint, "https://pubsub.googleapis.com");
        assert!(message.contains("cannot read"), "{message}");
    }

    #[tokio::test]
    async fn a_plaintext_endpoint_with_credentials_is_refused_before_they_are_loaded() {
        let (_dir, absent) = absent_file("absent.json");
        for (endpoint, credentials) in [
            ("http://pubsub.googleapis.com", Some(absent.as_path())),
            ("http://127.0.0.1:1", None),
            ("pubsub.googleapis.com:443", None),
        ] {
            let (e, message) = connect_error(connect(endpoint, credentials).await);
            assert_eq!(e, endpoint);
            assert!(message.contains("without TLS"), "{message}");
        }
        assert!(require_tls("HTTPS://pubsub.googleapis.com").is_ok());
    }
}
