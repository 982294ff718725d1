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
///
/// [`ConnectionOptions::from_parsed`] keeps credentials off plaintext: an `endpoint` must be
/// `https://`, and an emulator address (option or environment) must be a loopback address
/// unless `allow_remote_emulator = 'true'`. An emulator connection never carries credentials.
/// A Rust program that fills these fields itself is trusted with the emulator address; the
/// connection refuses a non-TLS endpoint with credentials all the same
/// ([`crate::google::connect`]).
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

/// Where a client connects, as every connector's client settings carry it: the endpoint, the
/// emulator address and the credentials file, resolved from [`ConnectionOptions`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientCore {
    /// The service endpoint (`endpoint`); the service's public endpoint when `None`.
    pub endpoint: Option<String>,
    /// An emulator address, `host:port` (`emulator_host`, or the connector's environment
    /// variable as the table options resolved it).
    pub emulator_host: Option<String>,
    /// A credentials JSON file (`credentials_file`); Application Default Credentials when `None`.
    pub credentials_file: Option<PathBuf>,
}

impl ClientCore {
    /// The emulator address in effect (an empty one counts as none).
    ///
    /// The emulator variable is not read here: the table options resolved it when the table
    /// was declared, where an explicit `endpoint` turns it off. Reading it again at connect
    /// time would send a table with an explicit endpoint to the emulator.
    pub fn effective_emulator_host(&self) -> Option<String> {
        self.emulator_host.clone().filter(|h| !h.trim().is_empty())
    }
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

/// Checks an endpoint URL: `https://host[:port]`; the error shows `example` as a well-formed
/// one.
///
/// `http://` is refused whatever the host: the channel to an endpoint carries credentials
/// (`authorization: Bearer ...`), which must not travel in plaintext. A local emulator is
/// reached through `emulator_host` instead, a plaintext channel that never carries credentials.
/// An endpoint with a user name or password is refused too (credentials come from
/// `credentials_file` or Application Default Credentials, never from the URL).
fn parse_endpoint(text: &str, example: &str) -> std::result::Result<String, String> {
    let t = text.trim();
    let url = url::Url::parse(t).map_err(|e| format!("expected a URL like '{example}' ({e})"))?;
    if url.host_str().is_none() || !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "expected an https:// URL with a host, like '{example}'"
        ));
    }
    if url.scheme() == "http" {
        return Err(format!(
            "an endpoint must be https://: the connection carries credentials, which are never \
             sent in plaintext; for a local emulator use 'emulator_host' (plaintext, without \
             credentials), else '{example}'"
        ));
    }
    if crate::encode::redact::has_userinfo(t) {
        return Err(
            "an endpoint carries no user name or password: credentials come from \
             'credentials_file' or Application Default Credentials"
                .into(),
        );
    }
    Ok(t.trim_end_matches('/').to_string())
}

/// Whether the host of `host_port` (as [`parse_emulator_host`] returns it) is a loopback
/// address: `localhost`, an IPv4 address in `127.0.0.0/8`, `::1` (bracketed or not) or an
/// IPv4-mapped loopback address.
pub fn is_loopback_host(host_port: &str) -> bool {
    let host = match host_port.rsplit_once(':') {
        Some((host, _)) => host,
        None => host_port,
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => ip.is_loopback(),
        Ok(std::net::IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
}

/// The rule an emulator address off the loopback breaks without `allow_remote_emulator`.
fn remote_emulator_rule() -> String {
    format!(
        "an emulator is reached in plaintext, so its address must be a loopback one ('localhost', \
         127.0.0.0/8 or [::1]); set '{}' = 'true' to accept an emulator on another host",
        common::ALLOW_REMOTE_EMULATOR.name
    )
}

impl ConnectionOptions {
    /// Where a client of these options connects.
    pub fn client_core(&self) -> ClientCore {
        ClientCore {
            endpoint: self.endpoint.clone(),
            emulator_host: self.emulator.as_ref().map(|e| e.host.clone()),
            credentials_file: self.credentials_file.clone(),
        }
    }

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
        let allow_remote = parsed
            .bool(&common::ALLOW_REMOTE_EMULATOR)?
            .unwrap_or(false);
        let emulator = match parsed.non_empty_text(&common::EMULATOR_HOST)? {
            Some(h) => {
                if endpoint.is_some() {
                    return Err(common::EMULATOR_HOST.cross_invalid(h));
                }
                let host = parse_emulator_host(h)
                    .map_err(|rule| common::EMULATOR_HOST.invalid(h, rule))?;
                if !allow_remote && !is_loopback_host(&host) {
                    return Err(common::EMULATOR_HOST.invalid(h, remote_emulator_rule()));
                }
                Some(EmulatorHost {
                    host,
                    source: EmulatorSource::Option,
                })
            }
            None if endpoint.is_none() => {
                let from_env = Self::emulator_from_env(service.emulator_env_var, env)?;
                if let Some(e) = &from_env
                    && !allow_remote
                    && !is_loopback_host(&e.host)
                {
                    return Err(Error::InvalidOption {
                        option: format!(
                            "emulator_host (from environment variable {})",
                            service.emulator_env_var
                        ),
                        value: e.host.clone(),
                        rule: remote_emulator_rule(),
                    });
                }
                from_env
            }
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
    ///
    /// Only its form is checked here; [`ConnectionOptions::from_parsed`] also refuses an
    /// address off the loopback unless `allow_remote_emulator` is set.
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
        for (host, address) in [
            ("localhost:8085", "localhost:8085"),
            ("http://127.0.0.1:9000/", "127.0.0.1:9000"),
        ] {
            assert_eq!(parse_emulator_host(host).unwrap(), address, "{host}");
        }
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
        let http = parse_endpoint("http://acme.googleapis.com", EXAMPLE).unwrap_err();
        assert!(
            http.contains("https://") && http.contains("emulator_host"),
            "{http}"
        );
        assert!(parse_endpoint("http://127.0.0.1:8085", EXAMPLE).is_err());
        let userinfo = parse_endpoint("https://u:p@acme.googleapis.com", EXAMPLE).unwrap_err();
        assert!(!userinfo.contains("u:p"), "{userinfo}");
        assert_eq!(
            parse_endpoint("https://acme.googleapis.com/", EXAMPLE).unwrap(),
            "https://acme.googleapis.com"
        );
    }

    #[test]
    fn loopback_hosts_are_localhost_127_slash_8_and_ipv6_one() {
        for host in [
            "localhost:8085",
            "LOCALHOST:1",
            "127.0.0.1:8085",
            "127.255.0.9:1",
            "[::1]:8085",
            "::1:8085",
            "[::ffff:127.0.0.1]:80",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "10.0.0.5:8085",
            "192.168.1.2:8085",
            "0.0.0.0:8085",
            "[::]:8085",
            "pubsub-emulator:8085",
            "localhost.example.com:8085",
            "128.0.0.1:8085",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
