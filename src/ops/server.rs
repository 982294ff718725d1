//! The HTTP endpoint: `/metrics`, `/healthz` and `/readyz` on one address, served by hyper's
//! HTTP/1 server (already in the tree through tonic).

use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use super::exposition;
use crate::core::telemetry::{ReadinessSettings, global, readiness};
use crate::error::{Error, Result};

/// The option an address is checked as, in errors.
const OPTION: &str = "metrics_addr";

/// Reads a listening address: `IP:PORT` (`127.0.0.1:9464`, `[::1]:9464`, `0.0.0.0:9464`) or
/// `HOST:PORT` with a host name that resolves (`localhost:9464`); port 0 picks a free one.
/// `option` names what the address was given as, in the error (`--metrics-addr`).
///
/// ```
/// let at = gcp_sql::ops::parse_address("127.0.0.1:9464", "--metrics-addr").unwrap();
/// assert_eq!(at.port(), 9464);
/// let bad = gcp_sql::ops::parse_address("9464", "--metrics-addr").unwrap_err();
/// assert!(bad.to_string().contains("--metrics-addr"), "{bad}");
/// ```
pub fn parse_address(text: &str, option: &str) -> Result<SocketAddr> {
    let rule = |why: &str| {
        Error::invalid(
            option,
            text,
            format!("{why}; expected HOST:PORT, such as 127.0.0.1:9464"),
        )
    };
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(address);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(rule("no port"));
    };
    if host.is_empty() {
        return Err(rule("no host (0.0.0.0 listens on every interface)"));
    }
    let Ok(port) = port.parse::<u16>() else {
        return Err(rule(&format!("'{port}' is not a port number (0 to 65535)")));
    };
    match (host, port).to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(address)) => Ok(SocketAddr::new(address.ip(), address.port())),
        Ok(None) | Err(_) => Err(rule(&format!("the host '{host}' does not resolve"))),
    }
}

/// A running metrics and health endpoint (see [`crate::ops`]). Stops when [`stop`]ped or
/// dropped.
///
/// [`stop`]: MetricsServer::stop
#[derive(Debug)]
pub struct MetricsServer {
    address: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `address` (see [`parse_address`]) and serves the process's statements
    /// ([`crate::core::telemetry::global`]) with the default readiness settings. Must be called
    /// on a Tokio runtime, which runs the endpoint.
    ///
    /// ```no_run
    /// # async fn demo() -> gcp_sql::Result<()> {
    /// let server = gcp_sql::ops::MetricsServer::start("127.0.0.1:9464").await?;
    /// println!("scrape http://{}/metrics", server.local_addr());
    /// // ... run statements; then
    /// server.stop().await;
    /// # Ok(()) }
    /// ```
    pub async fn start(address: &str) -> Result<MetricsServer> {
        Self::start_with(address, ReadinessSettings::default()).await
    }

    /// [`MetricsServer::start`] with readiness judged by `settings`.
    pub async fn start_with(address: &str, settings: ReadinessSettings) -> Result<MetricsServer> {
        let at = parse_address(address, OPTION)?;
        let listener = TcpListener::bind(at)
            .await
            .map_err(|e| Error::invalid(OPTION, address, format!("cannot listen at {at}: {e}")))?;
        let address = listener.local_addr()?;
        let (shutdown, stopped) = oneshot::channel();
        let task = tokio::spawn(serve(listener, settings, stopped));
        tracing::info!(%address, "serving /metrics, /healthz and /readyz");
        Ok(MetricsServer {
            address,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    /// Where it listens (the port picked, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Stops listening and closes the open connections; returns once it did.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// Accepts connections until `stopped`; each is served on a task of its own, aborted at the
/// stop.
async fn serve(
    listener: TcpListener,
    settings: ReadinessSettings,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stopped => break,
            // Reaps finished connections so the set does not grow with them.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // A transient accept failure (too many open files, say): logged, and the
                // endpoint keeps listening.
                tracing::warn!(error = %e, "the metrics endpoint could not accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| async move {
                Ok::<_, Infallible>(answer(&request, &settings))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The paths the endpoint serves.
const PATHS: [&str; 3] = ["/metrics", "/healthz", "/readyz"];

fn response(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

/// The answer to one request.
fn answer(request: &Request<Incoming>, settings: &ReadinessSettings) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let path = request.uri().path();
    if !PATHS.contains(&path) {
        return response(
            StatusCode::NOT_FOUND,
            TEXT,
            format!(
                "no {path} here: this endpoint serves {}\n",
                PATHS.join(", ")
            ),
        );
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        let mut refused = response(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            format!("{path} answers GET and HEAD\n"),
        );
        refused
            .headers_mut()
            .insert(ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        return refused;
    }
    match path {
        "/metrics" => response(
            StatusCode::OK,
            exposition::CONTENT_TYPE,
            exposition::render(settings),
        ),
        "/readyz" => {
            let judged = readiness(&global().statements(), settings);
            if judged.ready {
                response(StatusCode::OK, TEXT, "ready\n".into())
            } else {
                let mut body = String::from("not ready\n");
                for reason in &judged.reasons {
                    body.push_str(reason);
                    body.push('\n');
                }
                response(StatusCode::SERVICE_UNAVAILABLE, TEXT, body)
            }
        }
        _ => response(StatusCode::OK, TEXT, "ok\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_or_refused_naming_the_option() {
        assert_eq!(
            parse_address("127.0.0.1:9464", "--metrics-addr").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(parse_address("[::1]:0", "x").unwrap().port(), 0);
        assert_eq!(parse_address("localhost:9464", "x").unwrap().port(), 9464);
        for (bad, why) in [
            ("9464", "no port"),
            (":9464", "no host"),
            ("127.0.0.1:http", "not a port number"),
            ("127.0.0.1:70000", "not a port number"),
        ] {
            let e = parse_address(bad, "--metrics-addr")
                .unwrap_err()
                .to_string();
            assert!(e.contains("--metrics-addr"), "{e}");
            assert!(e.contains(why), "{bad}: {e}");
            assert!(e.contains("127.0.0.1:9464"), "the expected form: {e}");
        }
    }

    /// One request over a plain TCP connection: the status line and the body.
    async fn get(address: SocketAddr, method: &str, path: &str) -> (String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream
            .write_all(
                format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).await.unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        (
            head.lines().next().unwrap_or_default().to_string(),
            body.to_string(),
        )
    }

    #[tokio::test]
    async fn it_serves_the_three_paths_and_refuses_the_rest() {
        let server = MetricsServer::start("127.0.0.1:0").await.unwrap();
        let at = server.local_addr();
        assert_ne!(at.port(), 0);
        assert_eq!(
            get(at, "GET", "/healthz").await,
            ("HTTP/1.1 200 OK".into(), "ok\n".into())
        );
        let (status, _) = get(at, "GET", "/metrics").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        let (status, _) = get(at, "GET", "/readyz").await;
        assert!(
            status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.1 503"),
            "{status}"
        );
        let (status, body) = get(at, "GET", "/nope").await;
        assert_eq!(status, "HTTP/1.1 404 Not Found");
        assert!(body.contains("/metrics, /healthz, /readyz"), "{body}");
        let (status, _) = get(at, "POST", "/metrics").await;
        assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
        server.stop().await;
        assert!(tokio::net::TcpStream::connect(at).await.is_err(), "stopped");
    }

    #[tokio::test]
    async fn an_address_in_use_is_an_error_naming_it() {
        let first = MetricsServer::start("127.0.0.1:0").await.unwrap();
        let taken = first.local_addr().to_string();
        let e = MetricsServer::start(&taken).await.unwrap_err().to_string();
        assert!(e.contains(&taken) && e.contains("cannot listen"), "{e}");
    }
}
