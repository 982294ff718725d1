//! [`FakeServer`]: a scriptable gRPC server on a loopback port, for the faults the emulators
//! cannot produce (partial `MutateRows` failures, `RESOURCE_EXHAUSTED` bursts, a rejected
//! message inside a batch, stalls).
//!
//! It serves the message types of the generated clients without generating server code: each
//! mounted method decodes its request with [`tonic_prost::ProstCodec`] through
//! [`tonic::server::Grpc`], asks its [`Script`] for the reply, and encodes it, unary or
//! server-streaming. Requests are routed on the HTTP/2 path (`/package.Service/Method`).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use tonic::codegen::Service;
use tonic::codegen::http;
use tonic::service::{AxumBody, AxumRouter, Routes};

/// What the fake answers to one call.
#[derive(Debug, Clone)]
pub enum Reply<Resp> {
    /// A response (for a server-streaming method, the messages of the stream).
    Ok(Resp),
    /// A status.
    Status(tonic::Code, String),
    /// A status with details (the bytes of a `google.rpc.Status`, as `grpc-status-details-bin`
    /// carries them: an `ErrorInfo`, ...).
    StatusWithDetails(tonic::Code, String, Vec<u8>),
    /// Waits, then answers.
    Delay(Duration, Box<Reply<Resp>>),
    /// Never answers.
    Stall,
}

impl<Resp> Reply<Resp> {
    /// A status reply with a generic message.
    pub fn code(code: tonic::Code) -> Self {
        Reply::Status(code, format!("scripted {code:?}"))
    }

    /// Plays the reply: sleeps through delays, never returns for a stall.
    pub async fn play(self) -> Result<Resp, tonic::Status> {
        let mut reply = self;
        loop {
            match reply {
                Reply::Ok(r) => return Ok(r),
                Reply::Status(code, message) => return Err(tonic::Status::new(code, message)),
                Reply::StatusWithDetails(code, message, details) => {
                    return Err(tonic::Status::with_details(code, message, details.into()));
                }
                Reply::Delay(d, next) => {
                    tokio::time::sleep(d).await;
                    reply = *next;
                }
                Reply::Stall => std::future::pending::<()>().await,
            }
        }
    }
}

type Fallback<Req, Resp> = Arc<dyn Fn(&Req) -> Reply<Resp> + Send + Sync>;

struct ScriptState<Req, Resp> {
    replies: VecDeque<Reply<Resp>>,
    fallback: Option<Fallback<Req, Resp>>,
    log: Vec<Req>,
}

/// The per-call replies of one method and the log of the requests it received. Cheap to clone:
/// clones share the script, so a test keeps one to inspect after mounting another.
///
/// Calls take the queued replies in order; once the queue is empty the fallback closure answers;
/// without one, the call fails with `UNIMPLEMENTED` naming the exhausted script.
pub struct Script<Req, Resp> {
    state: Arc<Mutex<ScriptState<Req, Resp>>>,
}

impl<Req, Resp> Clone for Script<Req, Resp> {
    fn clone(&self) -> Self {
        Script {
            state: self.state.clone(),
        }
    }
}

impl<Req, Resp> Debug for Script<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Script").finish_non_exhaustive()
    }
}

impl<Req: Clone, Resp: Clone> Default for Script<Req, Resp> {
    fn default() -> Self {
        Self::new()
    }
}

impl<Req: Clone, Resp: Clone> Script<Req, Resp> {
    /// An empty script.
    pub fn new() -> Self {
        Script {
            state: Arc::new(Mutex::new(ScriptState {
                replies: VecDeque::new(),
                fallback: None,
                log: Vec::new(),
            })),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ScriptState<Req, Resp>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues the reply of the next call.
    pub fn push(&self, reply: Reply<Resp>) -> &Self {
        self.state().replies.push_back(reply);
        self
    }

    /// Answers calls with `f` once the queue is empty.
    pub fn fallback(&self, f: impl Fn(&Req) -> Reply<Resp> + Send + Sync + 'static) -> &Self {
        self.state().fallback = Some(Arc::new(f));
        self
    }

    /// The requests received so far, in order.
    pub fn requests(&self) -> Vec<Req> {
        self.state().log.clone()
    }

    /// Logs `req` and takes its reply.
    pub fn next(&self, req: &Req) -> Reply<Resp> {
        let mut s = self.state();
        s.log.push(req.clone());
        if let Some(r) = s.replies.pop_front() {
            return r;
        }
        match s.fallback.clone() {
            Some(f) => {
                drop(s);
                f(req)
            }
            None => Reply::Status(
                tonic::Code::Unimplemented,
                "the fake's script is exhausted".into(),
            ),
        }
    }
}

type Handler = Arc<
    dyn Fn(http::Request<AxumBody>) -> BoxFuture<'static, http::Response<tonic::body::Body>>
        + Send
        + Sync,
>;

struct UnaryCall<Req, Resp>(Script<Req, Resp>);

impl<Req, Resp> tonic::server::UnaryService<Req> for UnaryCall<Req, Resp>
where
    Req: Clone + Send + 'static,
    Resp: Clone + Send + 'static,
{
    type Response = Resp;
    type Future = BoxFuture<'static, Result<tonic::Response<Resp>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        let reply = self.0.next(request.get_ref());
        Box::pin(async move { reply.play().await.map(tonic::Response::new) })
    }
}

struct StreamingCall<Req, Resp>(Script<Req, Vec<Resp>>);

type RespStream<Resp> = Pin<Box<dyn futures::Stream<Item = Result<Resp, tonic::Status>> + Send>>;

impl<Req, Resp> tonic::server::ServerStreamingService<Req> for StreamingCall<Req, Resp>
where
    Req: Clone + Send + 'static,
    Resp: Clone + Send + 'static,
{
    type Response = Resp;
    type ResponseStream = RespStream<Resp>;
    type Future = BoxFuture<'static, Result<tonic::Response<RespStream<Resp>>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        let reply = self.0.next(request.get_ref());
        Box::pin(async move {
            let messages = reply.play().await?;
            let stream: RespStream<Resp> =
                Box::pin(futures::stream::iter(messages.into_iter().map(Ok)));
            Ok(tonic::Response::new(stream))
        })
    }
}

struct BidiCall<Req, Resp>(Script<Req, Vec<Resp>>);

impl<Req, Resp> tonic::server::StreamingService<Req> for BidiCall<Req, Resp>
where
    Req: Clone + Send + 'static,
    Resp: Clone + Send + 'static,
{
    type Response = Resp;
    type ResponseStream = RespStream<Resp>;
    type Future = BoxFuture<'static, Result<tonic::Response<RespStream<Resp>>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<Req>>) -> Self::Future {
        let script = self.0.clone();
        Box::pin(async move {
            let mut incoming = request.into_inner();
            let first = incoming
                .message()
                .await?
                .ok_or_else(|| tonic::Status::invalid_argument("the stream sent no request"))?;
            let messages = script.next(&first).play().await?;
            // The stream stays open after its messages, as a service's does, until the client
            // closes it; what the client sends later is read and dropped.
            let rest = futures::stream::unfold(incoming, |mut incoming| async move {
                match incoming.message().await {
                    Ok(Some(_)) => Some((None, incoming)),
                    _ => None,
                }
            })
            .filter_map(|m: Option<Resp>| async move { m.map(Ok) })
            .chain(futures::stream::pending());
            let stream: RespStream<Resp> =
                Box::pin(futures::stream::iter(messages.into_iter().map(Ok)).chain(rest));
            Ok(tonic::Response::new(stream))
        })
    }
}

/// Routes requests to the mounted methods by path.
#[derive(Clone)]
struct Router {
    routes: Arc<HashMap<String, Handler>>,
}

impl Service<http::Request<AxumBody>> for Router {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<AxumBody>) -> Self::Future {
        let path = req.uri().path().to_string();
        match self.routes.get(&path) {
            Some(handler) => {
                let fut = handler(req);
                Box::pin(async move { Ok(fut.await) })
            }
            None => {
                let status = tonic::Status::unimplemented(format!(
                    "the fake server mounts no method at {path}"
                ));
                Box::pin(async move { Ok(status.into_http::<tonic::body::Body>()) })
            }
        }
    }
}

/// Builds a [`FakeServer`] from mounted methods.
#[derive(Default)]
pub struct FakeServerBuilder {
    routes: HashMap<String, Handler>,
}

impl Debug for FakeServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeServerBuilder")
            .field("methods", &self.routes.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl FakeServerBuilder {
    /// Mounts a unary method at `path` (`/google.pubsub.v1.Publisher/Publish`).
    pub fn unary<Req, Resp>(self, path: &str, script: Script<Req, Resp>) -> Self
    where
        Req: prost::Message + Default + Clone + Send + 'static,
        Resp: prost::Message + Clone + Send + 'static,
    {
        self.mount::<Req, Resp, _, _>(path, move |mut grpc, req| {
            let script = script.clone();
            async move { grpc.unary(UnaryCall(script), req).await }
        })
    }

    /// Mounts a server-streaming method at `path` (`/google.bigtable.v2.Bigtable/MutateRows`);
    /// a [`Reply::Ok`] carries the messages of the stream.
    pub fn server_streaming<Req, Resp>(self, path: &str, script: Script<Req, Vec<Resp>>) -> Self
    where
        Req: prost::Message + Default + Clone + Send + 'static,
        Resp: prost::Message + Clone + Send + 'static,
    {
        self.mount::<Req, Resp, _, _>(path, move |mut grpc, req| {
            let script = script.clone();
            async move { grpc.server_streaming(StreamingCall(script), req).await }
        })
    }

    /// Mounts a bidirectional-streaming method at `path`
    /// (`/google.pubsub.v1.Subscriber/StreamingPull`): the script answers the stream's first
    /// request, a [`Reply::Ok`] carrying the messages sent down the stream, which then stays
    /// open until the client closes it (later requests are read and dropped).
    pub fn bidi_streaming<Req, Resp>(self, path: &str, script: Script<Req, Vec<Resp>>) -> Self
    where
        Req: prost::Message + Default + Clone + Send + 'static,
        Resp: prost::Message + Clone + Send + 'static,
    {
        self.mount::<Req, Resp, _, _>(path, move |mut grpc, req| {
            let script = script.clone();
            async move { grpc.streaming(BidiCall(script), req).await }
        })
    }

    /// Mounts at `path` a method that `call` answers, given a gRPC server of its messages and
    /// the request.
    fn mount<Req, Resp, F, Fut>(mut self, path: &str, call: F) -> Self
    where
        Req: prost::Message + Default + Send + 'static,
        Resp: prost::Message + Send + 'static,
        F: Fn(
                tonic::server::Grpc<tonic_prost::ProstCodec<Resp, Req>>,
                http::Request<AxumBody>,
            ) -> Fut
            + Send
            + Sync
            + 'static,
        Fut: Future<Output = http::Response<tonic::body::Body>> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |req| {
            let grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<Resp, Req>::default());
            Box::pin(call(grpc, req))
        });
        self.routes.insert(path.to_string(), handler);
        self
    }

    /// Binds `127.0.0.1:0` and serves until the [`FakeServer`] is dropped.
    pub async fn start(self) -> std::io::Result<FakeServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let router = Router {
            routes: Arc::new(self.routes),
        };
        let routes = Routes::from(AxumRouter::new().fallback_service(router));
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let serving = Serving::spawn(
            tonic::transport::Server::builder(),
            routes,
            incoming,
            "fake gRPC server",
        );
        Ok(FakeServer {
            addr,
            _serving: serving,
        })
    }
}

/// A tonic server serving on a task of its own until this is dropped: what [`FakeServer`] and
/// the null server of `gcp-sql serve-null` hold.
#[derive(Debug)]
pub(crate) struct Serving {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Serving {
    /// Serves `routes` on `incoming` with `server`'s settings; `name` is what the warning of a
    /// server that ends with an error calls it.
    pub(crate) fn spawn(
        mut server: tonic::transport::Server,
        routes: Routes,
        incoming: tonic::transport::server::TcpIncoming,
        name: &'static str,
    ) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = server
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = served {
                tracing::warn!(%error, "{name} ended");
            }
        });
        Serving {
            stop: Some(stop),
            task,
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// A running fake gRPC server on a loopback port; stops when dropped.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use gcp_sql::testing::{FakeServer, Reply, Script};
/// // Any unary method, by its gRPC path (here with empty messages): its first call answers
/// // UNAVAILABLE.
/// let call: Script<(), ()> = Script::new();
/// call.push(Reply::code(tonic::Code::Unavailable));
/// let server = FakeServer::builder().unary("/demo.v1.Demo/Call", call.clone()).start().await?;
/// println!("serving at {}", server.uri());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FakeServer {
    addr: SocketAddr,
    /// Held for its drop, which stops the server.
    _serving: Serving,
}

impl FakeServer {
    /// A builder with no method mounted.
    pub fn builder() -> FakeServerBuilder {
        FakeServerBuilder::default()
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`, for a plaintext channel.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A plaintext channel to the server.
    pub async fn channel(&self) -> Result<tonic::transport::Channel, tonic::transport::Error> {
        tonic::transport::Endpoint::from_shared(self.uri())?
            .connect()
            .await
    }
}

#[cfg(test)]
mod tests {
    use gcloud_sdk::google::bigtable::v2::bigtable_client::BigtableClient;
    use gcloud_sdk::google::bigtable::v2::{
        MutateRowsRequest, MutateRowsResponse, mutate_rows_response,
    };
    use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
    use gcloud_sdk::google::pubsub::v1::{PublishRequest, PublishResponse, PubsubMessage};

    use super::*;

    #[tokio::test]
    async fn generated_publisher_client_sees_unavailable_then_ok() {
        let publish: Script<PublishRequest, PublishResponse> = Script::new();
        publish
            .push(Reply::code(tonic::Code::Unavailable))
            .push(Reply::Ok(PublishResponse {
                message_ids: vec!["m-1".into()],
            }));
        let server = FakeServer::builder()
            .unary("/google.pubsub.v1.Publisher/Publish", publish.clone())
            .start()
            .await
            .expect("bind");
        let mut client = PublisherClient::new(server.channel().await.expect("connect"));
        let request = PublishRequest {
            topic: "projects/p/topics/clicks".into(),
            messages: vec![PubsubMessage {
                data: b"hello".to_vec(),
                ..Default::default()
            }],
        };
        let first = client
            .publish(request.clone())
            .await
            .expect_err("scripted UNAVAILABLE");
        assert_eq!(first.code(), tonic::Code::Unavailable);
        let second = client.publish(request.clone()).await.expect("scripted OK");
        assert_eq!(second.into_inner().message_ids, vec!["m-1".to_string()]);
        let seen = publish.requests();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].topic, "projects/p/topics/clicks");
        assert_eq!(seen[1].messages[0].data, b"hello");
        // The script is exhausted now: the fake says so rather than inventing an answer.
        let third = client.publish(request).await.expect_err("exhausted");
        assert_eq!(third.code(), tonic::Code::Unimplemented);
    }

    #[tokio::test]
    async fn server_streaming_method_streams_per_entry_statuses() {
        let mutate: Script<MutateRowsRequest, Vec<MutateRowsResponse>> = Script::new();
        let entry = |index: i64, code: tonic::Code| mutate_rows_response::Entry {
            index,
            status: Some(gcloud_sdk::google::rpc::Status {
                code: code as i32,
                message: String::new(),
                details: vec![],
            }),
        };
        mutate.push(Reply::Ok(vec![
            MutateRowsResponse {
                entries: vec![entry(0, tonic::Code::Ok)],
                rate_limit_info: None,
            },
            MutateRowsResponse {
                entries: vec![entry(1, tonic::Code::Unavailable)],
                rate_limit_info: None,
            },
        ]));
        let server = FakeServer::builder()
            .server_streaming("/google.bigtable.v2.Bigtable/MutateRows", mutate.clone())
            .start()
            .await
            .expect("bind");
        let mut client = BigtableClient::new(server.channel().await.expect("connect"));
        let request = MutateRowsRequest {
            table_name: "projects/p/instances/i/tables/t".into(),
            ..Default::default()
        };
        let mut stream = client
            .mutate_rows(request)
            .await
            .expect("stream")
            .into_inner();
        let mut codes = Vec::new();
        while let Some(message) = stream.message().await.expect("message") {
            codes.extend(
                message
                    .entries
                    .iter()
                    .map(|e| e.status.as_ref().map_or(0, |s| s.code)),
            );
        }
        assert_eq!(
            codes,
            vec![tonic::Code::Ok as i32, tonic::Code::Unavailable as i32]
        );
        assert_eq!(
            mutate.requests()[0].table_name,
            "projects/p/instances/i/tables/t"
        );
    }

    #[tokio::test]
    async fn unmounted_method_answers_unimplemented() {
        let server = FakeServer::builder().start().await.expect("bind");
        let mut client = PublisherClient::new(server.channel().await.expect("connect"));
        let err = client
            .publish(PublishRequest::default())
            .await
            .expect_err("nothing mounted");
        assert_eq!(err.code(), tonic::Code::Unimplemented);
    }
}
