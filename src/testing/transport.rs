//! [`FakeTransport`]: an in-process [`Transport`] scripted per call, for tests of the core and
//! of connector writers.

use std::collections::{HashSet, VecDeque};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::core::{Class, Destination, LoadHint, SendOutcome, Transport};
use crate::error::is_transient_code;
use crate::error::{Error, Result};

/// What one scripted send answers.
#[derive(Debug, Clone)]
pub enum FakeReply {
    /// Every record delivered.
    Ok,
    /// One status for the whole batch.
    Status(tonic::Status),
    /// One status per record, in batch order.
    PerRecord(Vec<std::result::Result<(), tonic::Status>>),
    /// Waits, then answers.
    Delay(Duration, Box<FakeReply>),
    /// Never answers.
    Stall,
    /// Answers as the inner reply does, and asks the core to change its load
    /// ([`Transport::take_load_hint`]) once that answer is given.
    WithHint(LoadHint, Box<FakeReply>),
}

impl FakeReply {
    /// A whole-batch status with `code`.
    pub fn code(code: tonic::Code) -> Self {
        FakeReply::Status(tonic::Status::new(code, format!("scripted {code:?}")))
    }
}

/// One send the fake received.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeCall<R> {
    /// The destination.
    pub destination: Destination,
    /// The records, in batch order.
    pub records: Vec<R>,
    /// The attempt deadline the core passed.
    pub timeout: Option<Duration>,
}

/// The client the fake hands out: just its destination.
#[derive(Debug)]
pub struct FakeClient {
    /// The destination it was opened for.
    pub destination: Destination,
}

type Responder<R> = Arc<dyn Fn(&FakeCall<R>) -> FakeReply + Send + Sync>;

struct State<R> {
    script: VecDeque<FakeReply>,
    responder: Option<Responder<R>>,
    calls: Vec<FakeCall<R>>,
    opened: Vec<Destination>,
    closed: Vec<Destination>,
    created: Vec<Destination>,
    missing: HashSet<Destination>,
    create_restores: bool,
    close_delay: Duration,
    open_error: Option<String>,
    hint: Option<LoadHint>,
}

/// A scripted [`Transport`]: answers sends from a queue of [`FakeReply`] (then from a
/// responder closure, then `Ok`), records every call, and simulates missing destinations.
///
/// Default classification: `ALREADY_EXISTS` is a duplicate, `NOT_FOUND` a missing destination,
/// `INVALID_ARGUMENT` a rejection, the transient codes are retryable, anything else is fatal.
///
/// ```
/// use gcp_sql::testing::{FakeReply, FakeTransport};
/// let fake = FakeTransport::<u32>::new();
/// fake.push(FakeReply::code(tonic::Code::Unavailable)).push(FakeReply::Ok);
/// fake.respond_with(|call| if call.records.contains(&7) { FakeReply::code(tonic::Code::InvalidArgument) } else { FakeReply::Ok });
/// assert!(fake.calls().is_empty());
/// ```
pub struct FakeTransport<R> {
    state: Mutex<State<R>>,
}

impl<R> Debug for FakeTransport<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeTransport").finish_non_exhaustive()
    }
}

impl<R: Clone + Debug + Send + Sync + 'static> Default for FakeTransport<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R: Clone + Debug + Send + Sync + 'static> FakeTransport<R> {
    /// A fake where every destination exists and every send succeeds.
    pub fn new() -> Self {
        FakeTransport {
            state: Mutex::new(State {
                script: VecDeque::new(),
                responder: None,
                calls: Vec::new(),
                opened: Vec::new(),
                closed: Vec::new(),
                created: Vec::new(),
                missing: HashSet::new(),
                create_restores: true,
                close_delay: Duration::ZERO,
                open_error: None,
                hint: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<R>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues the answer of the next unscripted send.
    pub fn push(&self, reply: FakeReply) -> &Self {
        self.state().script.push_back(reply);
        self
    }

    /// Answers sends with `f` once the queue is empty.
    pub fn respond_with(
        &self,
        f: impl Fn(&FakeCall<R>) -> FakeReply + Send + Sync + 'static,
    ) -> &Self {
        self.state().responder = Some(Arc::new(f));
        self
    }

    /// Makes `destination` missing: sends to it answer `NOT_FOUND` until it is created.
    pub fn set_missing(&self, destination: &str) -> &Self {
        self.state().missing.insert(Arc::from(destination));
        self
    }

    /// Whether `create_destination` brings a missing destination back (default true).
    pub fn set_create_restores(&self, restores: bool) -> &Self {
        self.state().create_restores = restores;
        self
    }

    /// How long each client close takes.
    pub fn set_close_delay(&self, delay: Duration) -> &Self {
        self.state().close_delay = delay;
        self
    }

    /// Makes every `open` fail with [`Error::Connect`] carrying `message`.
    pub fn set_open_error(&self, message: &str) -> &Self {
        self.state().open_error = Some(message.to_string());
        self
    }

    /// Every send received, in order.
    pub fn calls(&self) -> Vec<FakeCall<R>> {
        self.state().calls.clone()
    }

    /// The batches received (records only), in order.
    pub fn batches(&self) -> Vec<Vec<R>> {
        self.state()
            .calls
            .iter()
            .map(|c| c.records.clone())
            .collect()
    }

    /// Destinations opened, in order.
    pub fn opened(&self) -> Vec<Destination> {
        self.state().opened.clone()
    }

    /// Destinations whose client was closed (completely), in order.
    pub fn closed(&self) -> Vec<Destination> {
        self.state().closed.clone()
    }

    /// Destinations created, in order.
    pub fn created(&self) -> Vec<Destination> {
        self.state().created.clone()
    }
}

async fn play(reply: FakeReply, n: usize, hint: &mut Option<LoadHint>) -> SendOutcome {
    let mut reply = reply;
    loop {
        match reply {
            FakeReply::WithHint(h, next) => {
                *hint = Some(h);
                reply = *next;
            }
            FakeReply::Ok => return SendOutcome::Whole(Ok(())),
            FakeReply::Status(s) => return SendOutcome::Whole(Err(s)),
            FakeReply::PerRecord(mut v) => {
                v.resize_with(n, || Ok(()));
                return SendOutcome::PerRecord(v);
            }
            FakeReply::Delay(d, next) => {
                tokio::time::sleep(d).await;
                reply = *next;
            }
            FakeReply::Stall => std::future::pending::<()>().await,
        }
    }
}

#[async_trait]
impl<R: Clone + Debug + Send + Sync + 'static> Transport for FakeTransport<R> {
    type Record = R;
    type Client = FakeClient;

    fn operation(&self) -> &'static str {
        "FakeSend"
    }

    async fn open(&self, destination: &Destination) -> Result<FakeClient> {
        let mut s = self.state();
        if let Some(message) = &s.open_error {
            return Err(Error::Connect {
                endpoint: destination.to_string(),
                message: message.clone(),
            });
        }
        s.opened.push(destination.clone());
        Ok(FakeClient {
            destination: destination.clone(),
        })
    }

    async fn send(
        &self,
        _client: &FakeClient,
        destination: &Destination,
        batch: &[&R],
        timeout: Option<Duration>,
    ) -> SendOutcome {
        let call = FakeCall {
            destination: destination.clone(),
            records: batch.iter().map(|r| (*r).clone()).collect(),
            timeout,
        };
        let reply = {
            let mut s = self.state();
            s.calls.push(call.clone());
            if s.missing.contains(destination) {
                FakeReply::Status(tonic::Status::not_found(format!("{destination} not found")))
            } else if let Some(r) = s.script.pop_front() {
                r
            } else if let Some(f) = s.responder.clone() {
                drop(s);
                f(&call)
            } else {
                FakeReply::Ok
            }
        };
        let mut hint = None;
        let outcome = play(reply, batch.len(), &mut hint).await;
        if hint.is_some() {
            self.state().hint = hint;
        }
        outcome
    }

    fn take_load_hint(&self) -> Option<LoadHint> {
        self.state().hint.take()
    }

    fn classify(&self, status: &tonic::Status, _solo: bool) -> Class {
        match status.code() {
            tonic::Code::Ok => Class::Ok,
            tonic::Code::AlreadyExists => Class::Duplicate,
            tonic::Code::NotFound => Class::NotFound,
            tonic::Code::InvalidArgument => Class::Rejected,
            c if is_transient_code(c) => Class::Retryable,
            _ => Class::Fatal,
        }
    }

    async fn create_destination(
        &self,
        _client: &FakeClient,
        destination: &Destination,
    ) -> Result<bool> {
        let mut s = self.state();
        s.created.push(destination.clone());
        if s.create_restores {
            Ok(s.missing.remove(destination))
        } else {
            Ok(true)
        }
    }

    async fn close(&self, client: FakeClient) {
        let delay = self.state().close_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.state().closed.push(client.destination);
    }
}
