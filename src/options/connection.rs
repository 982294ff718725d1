//! Connection options shared by every connector: project, endpoint, emulator, credentials.

use std::path::PathBuf;

use crate::error::{Error, Result};

use super::{ParsedOptions, common};

/// What the connection options need to know of the service a connector talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service {
    /// The environment variable that points the connector at an emulator when the
    /// `emulator_host` option is absent (`ACME_EMULATOR_HOST`).
    pub emulator_env_var: &'static str,
    /// The service's public endpoint (`https://acme.googleapis.com`), shown as the example of
    /// a well-formed `endpoint`.
    pub public_endpoint: &'static str,
}

/// Reads an environment variable; [`std::env::var`] in production, a map in tests.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Where an emulator address came from, so an error can say which setting to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmulatorSource {
    /// The `emulator_host` option.
    Option,
    /// An environment variable such as `ACME_EMULATOR_HOST`.
    EnvVar(&'static str),
}

/// An emulator address (`host:port`, plaintext gRPC) and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulatorHost {
    /// `host:port`, without a scheme.
    pub host: String,
    /// Where it was set.
    pub source: EmulatorSource,
}

impl EmulatorHost {
    /// Names the setting, for messages: `option 'emulator_host'` or
    /// `environment variable ACME_EMULATOR_HOST`.
    pub fn describe(&self) -> String {
        match self.source {
            EmulatorSource::Option => format!("option 'emulator_host' = '{}'", self.host),
            EmulatorSource::EnvVar(var) => format!("environment variable {var} = '{}'", self.host),
        }
    }

    /// The URI a gRPC channel connects to: `http://host:port`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.host)
    }
}

/// Where and how a sink connects. Shared by every connector.
///
/// The emulator address is resolved when the options are built: the `emulator_host` option
/// first, else the service's environment variable ([`Service::emulator_env_var`]) — unless an
/// explicit `endpoint` is given, which the environment does not override.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionOptions {
    /// The Google Cloud project short resource names are resolved in.
    pub project: Option<String>,
    /// A service endpoint replacing the default (`https://...googleapis.com`).
    pub endpoint: Option<String>,
    /// The emulator to talk to in plaintext, if any.
    pub emulator: Option<EmulatorHost>,
    /// A service-account key file; Application Default Credentials when absent.
    pub credentials_file: Option<PathBuf>,
}

/// Checks `host:port` (a `http://` prefix is tolerated and dropped).
fn parse_emulator_host(text: &str) -> std::result::Result<String, String> {
    let t = text.trim();
    let t = t.strip_prefix("http://").unwrap_or(t).trim_end_matches('/');
    let Some((host, port)) = t.rsplit_once(':') else {
        return Err("expected 'host:port', for example 'localhost:8085'".into());
    };
    if host.is_empty() || host.contains('/') {
        return Err("expected 'host:port', for example 'localhost:8085'".into());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(t.to_string()),
        _ => Err(format!("'{port}' is not a port number (1..=65535)")),
    }
}

/// Checks an endpoint URL: `https://host[:port]` (or `http://` for a plaintext proxy); the
/// error shows `example` as a well-formed one.
fn parse_endpoint(text: &str, example: &str) -> std::result::Result<String, String> {
    let t = text.trim();
    let url = url::Url::parse(t).map_err(|e| format!("expected a URL like '{example}' ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("expected an http:// or https:// URL with a host".into());
    }
    Ok(t.trim_end_matches('/').to_string())
}

impl ConnectionOptions {
    /// Options for an emulator at `host:port`, as a Rust program would set them.
    pub fn emulator(project: impl Into<String>, host: impl Into<String>) -> Self {
        ConnectionOptions {
            project: Some(project.into()),
            emulator: Some(EmulatorHost {
                host: host.into(),
                source: EmulatorSource::Option,
            }),
            ..Default::default()
        }
    }

    /// Reads the connection options of parsed options for `service`, consulting the
    /// environment through `env` for the emulator address.
    pub fn from_parsed(
        parsed: &ParsedOptions,
        service: Service,
        env: EnvLookup<'_>,
    ) -> Result<Self> {
        let project = parsed.non_empty_text(&common::PROJECT)?.map(str::to_string);
        if let Some(p) = &project {
            super::names::check_project(p).map_err(|rule| common::PROJECT.invalid(p, rule))?;
        }
        let endpoint = match parsed.non_empty_text(&common::ENDPOINT)? {
            Some(e) => Some(
                parse_endpoint(e, service.public_endpoint)
                    .map_err(|rule| common::ENDPOINT.invalid(e, rule))?,
            ),
            None => None,
        };
        let emulator = match parsed.non_empty_text(&common::EMULATOR_HOST)? {
            Some(h) => {
                if endpoint.is_some() {
                    return Err(common::EMULATOR_HOST.cross_invalid(h));
                }
                let host = parse_emulator_host(h)
                    .map_err(|rule| common::EMULATOR_HOST.invalid(h, rule))?;
                Some(EmulatorHost {
                    host,
                    source: EmulatorSource::Option,
                })
            }
            None if endpoint.is_none() => Self::emulator_from_env(service.emulator_env_var, env)?,
            None => None,
        };
        let credentials_file = parsed
            .non_empty_text(&common::CREDENTIALS_FILE)?
            .map(PathBuf::from);
        Ok(ConnectionOptions {
            project,
            endpoint,
            emulator,
            credentials_file,
        })
    }

    /// The emulator named by the environment variable `var`, if it is set and not empty.
    pub fn emulator_from_env(
        var: &'static str,
        env: EnvLookup<'_>,
    ) -> Result<Option<EmulatorHost>> {
        match env(var)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
        {
            None => Ok(None),
            Some(v) => {
                let host = parse_emulator_host(&v).map_err(|rule| Error::InvalidOption {
                    option: format!("emulator_host (from environment variable {var})"),
                    value: v.clone(),
                    rule,
                })?;
                Ok(Some(EmulatorHost {
                    host,
                    source: EmulatorSource::EnvVar(var),
                }))
            }
        }
    }

    /// The process environment, for [`ConnectionOptions::from_parsed`].
    pub fn process_env(name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_host_port_and_drops_http_scheme() {
        assert_eq!(
            parse_emulator_host("localhost:8085").unwrap(),
            "localhost:8085"
        );
        assert_eq!(
            parse_emulator_host("http://127.0.0.1:9000/").unwrap(),
            "127.0.0.1:9000"
        );
    }

    #[test]
    fn rejects_emulator_host_without_port() {
        assert!(parse_emulator_host("localhost").is_err());
        assert!(parse_emulator_host("localhost:http").is_err());
        assert!(parse_emulator_host(":8085").is_err());
    }

    #[test]
    fn rejects_endpoint_without_scheme() {
        const EXAMPLE: &str = "https://acme.googleapis.com";
        let err = parse_endpoint("acme.googleapis.com", EXAMPLE).unwrap_err();
        assert!(
            err.contains("expected a URL like 'https://acme.googleapis.com'"),
            "{err}"
        );
        assert!(parse_endpoint("ftp://x", EXAMPLE).is_err());
        assert_eq!(
            parse_endpoint("https://acme.googleapis.com/", EXAMPLE).unwrap(),
            "https://acme.googleapis.com"
        );
    }
}
