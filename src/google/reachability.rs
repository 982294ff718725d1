//! Reachability: whether anything has answered at a transport's address yet, so that a refused
//! first connection to an emulator says "nothing answers there" instead of being retried.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::status::transport_failure;

/// Failed attempts in a row, with no answer from the address yet, after which a transport
/// logs one warning that nothing answers there (it goes on retrying within its budget).
pub const NO_ANSWER_WARN_ATTEMPTS: u32 = 3;

/// Whether anything has answered at a transport's address yet, to tell "nothing listens
/// there" from a connection that broke.
///
/// A statement's transport starts knowing nothing. A refused connection to an **emulator**
/// before anything answered there means nothing listens at that address (a wrong
/// `emulator_host`, an emulator not started): [`observe`](Self::observe) turns that failure
/// into a status that says so and that [`nothing_listens`] recognises, which each connector
/// classifies as fatal rather than retrying it for its whole budget. Once anything has answered
/// (any response or status from the server), a refused or broken connection is transient (an
/// emulator restarting, a proxy resetting) and is retried as before. A Google endpoint is never
/// failed this way (its TLS channel is connected before the first send); for it, and for an
/// address that does not refuse but never answers, one warning says after
/// [`NO_ANSWER_WARN_ATTEMPTS`] failed attempts that nothing has answered yet.
///
/// Cloning shares the state: every channel and client of one transport observes through it.
///
/// ```
/// use gcp_sql::google::{Reachability, nothing_listens};
///
/// let reach = Reachability::emulator("127.0.0.1:9", "emulator_host");
/// let refused = tonic::Status::from_error(Box::new(std::io::Error::from(
///     std::io::ErrorKind::ConnectionRefused,
/// )));
/// let seen = reach.observe::<()>(Err(refused)).unwrap_err();
/// assert!(nothing_listens(&seen));
/// assert!(seen.message().starts_with("connection refused at 127.0.0.1:9 (emulator_host)"));
/// ```
#[derive(Clone)]
pub struct Reachability(Arc<ReachState>);

struct ReachState {
    address: String,
    setting: String,
    emulator: bool,
    answered: AtomicBool,
    failures: AtomicU32,
    warned: AtomicBool,
}

impl Debug for Reachability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reachability")
            .field("address", &self.0.address)
            .field("emulator", &self.0.emulator)
            .field("answered", &self.0.answered.load(Ordering::Relaxed))
            .finish()
    }
}

/// The marker [`Reachability::observe`] puts in the source chain of a "nothing listens" status.
#[derive(Debug)]
struct NothingListens(tonic::Status);

impl std::fmt::Display for NothingListens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("nothing listens at the address")
    }
}

impl std::error::Error for NothingListens {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl Reachability {
    /// The state of an emulator at `address`, set by `setting` (`emulator_host`, or the
    /// environment variable it came from; see [`emulator_setting`]).
    pub fn emulator(address: impl Into<String>, setting: impl Into<String>) -> Self {
        Self::new(address.into(), setting.into(), true)
    }

    /// The state of a Google endpoint (`endpoint`, or the service's default).
    pub fn endpoint(address: impl Into<String>) -> Self {
        Self::new(address.into(), "endpoint".into(), false)
    }

    /// The state of `address`: an emulator (plaintext) one or not.
    pub fn for_address(address: &str, emulator: bool, setting: &str) -> Self {
        Self::new(address.to_string(), setting.to_string(), emulator)
    }

    fn new(address: String, setting: String, emulator: bool) -> Self {
        Reachability(Arc::new(ReachState {
            address,
            setting,
            emulator,
            answered: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            warned: AtomicBool::new(false),
        }))
    }

    /// Records that the server answered (a response, or a stream that reported something).
    pub fn answered(&self) {
        self.0.answered.store(true, Ordering::Relaxed);
    }

    /// Whether anything has answered at the address yet.
    pub fn has_answered(&self) -> bool {
        self.0.answered.load(Ordering::Relaxed)
    }

    /// Passes one call's result through: an `Ok` or a status the server sent records an answer;
    /// a transport failure before any answer is counted (one warning at
    /// [`NO_ANSWER_WARN_ATTEMPTS`]), and a refused connection to an emulator becomes the
    /// "nothing listens" status.
    pub fn observe<T>(
        &self,
        result: std::result::Result<T, tonic::Status>,
    ) -> std::result::Result<T, tonic::Status> {
        let status = match result {
            Ok(value) => {
                self.answered();
                return Ok(value);
            }
            Err(status) => status,
        };
        if !is_transport_failure(&status) {
            self.answered();
            return Err(status);
        }
        if self.has_answered() {
            return Err(status);
        }
        let failures = self.0.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if self.0.emulator && chain_has_refused(&status) {
            return Err(self.nothing_listens_status(status));
        }
        if failures >= NO_ANSWER_WARN_ATTEMPTS && !self.0.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                address = %self.0.address,
                setting = %self.0.setting,
                attempts = failures,
                code = crate::error::code_name(status.code()),
                "no answer from {} after {failures} attempts; still retrying (check {})",
                self.0.address,
                self.0.setting
            );
        }
        Err(status)
    }

    fn nothing_listens_status(&self, status: tonic::Status) -> tonic::Status {
        let state = &self.0;
        let message = format!(
            "connection refused at {} ({}): nothing answers at that address; start the emulator \
             there, or point {} at the one that runs",
            state.address, state.setting, state.setting
        );
        let mut marked =
            tonic::Status::with_metadata(status.code(), message, status.metadata().clone());
        marked.set_source(Arc::new(NothingListens(status)));
        marked
    }
}

/// Whether `status` is the one [`Reachability::observe`] gives a refused first connection to
/// an emulator: nothing listens at the address, so retrying cannot help.
pub fn nothing_listens(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<NothingListens>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// The setting an emulator address came from, for messages: `env_var` when that variable holds
/// `host` (the `emulator_host` option overrides it, but then it would rarely be the same),
/// else `emulator_host`.
pub fn emulator_setting(host: &str, env_var: &'static str) -> String {
    match std::env::var(env_var) {
        Ok(v) if v.trim() == host.trim() => env_var.to_string(),
        _ => "emulator_host".to_string(),
    }
}

/// Whether the call failed in the transport (never got the server's answer), before or after
/// [`transport_status`] rewrote its status.
fn is_transport_failure(status: &tonic::Status) -> bool {
    if transport_failure(status).is_some() {
        return true;
    }
    std::error::Error::source(status)
        .and_then(|e| e.downcast_ref::<tonic::Status>())
        .is_some_and(|inner| transport_failure(inner).is_some())
}

/// Whether a refused TCP connection is anywhere in `status`'s source chain.
fn chain_has_refused(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::status::transport_status;
    use super::super::test_support::{Wrapped, call_through_channel, closed_port};
    use super::*;

    #[tokio::test]
    async fn a_refused_first_call_to_an_emulator_says_nothing_listens() {
        let address = closed_port();
        let status = call_through_channel(&address, Some(Duration::from_secs(5))).await;
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let reach = Reachability::emulator(&address, "emulator_host");
        let seen = reach.observe::<()>(Err(status)).unwrap_err();
        assert!(nothing_listens(&seen), "{seen:?}");
        assert_eq!(seen.code(), tonic::Code::Unavailable);
        assert!(
            seen.message()
                .starts_with(&format!("connection refused at {address} (emulator_host)")),
            "{}",
            seen.message()
        );
    }

    #[tokio::test]
    async fn a_refused_call_after_an_answer_stays_retryable() {
        let address = closed_port();
        let reach = Reachability::emulator(&address, "emulator_host");
        // A status the server sent is an answer.
        let answer = reach
            .observe::<()>(Err(tonic::Status::not_found("no topic")))
            .unwrap_err();
        assert!(!nothing_listens(&answer));
        assert!(reach.has_answered());
        let status = call_through_channel(&address, Some(Duration::from_secs(5))).await;
        let seen = reach.observe::<()>(Err(status)).unwrap_err();
        assert!(!nothing_listens(&seen), "{seen:?}");
        assert_eq!(seen.code(), tonic::Code::Unavailable);
    }

    #[tokio::test]
    async fn a_google_endpoint_is_never_failed_as_unreachable() {
        let address = closed_port();
        let reach = Reachability::endpoint(format!("https://{address}"));
        for _ in 0..NO_ANSWER_WARN_ATTEMPTS + 1 {
            let status = call_through_channel(&address, Some(Duration::from_secs(5))).await;
            let seen = reach.observe::<()>(Err(status)).unwrap_err();
            assert!(!nothing_listens(&seen), "{seen:?}");
        }
        assert!(!reach.has_answered());
    }

    #[test]
    fn a_normalised_transport_failure_is_not_an_answer() {
        let reach = Reachability::emulator("127.0.0.1:9", "emulator_host");
        let reset = tonic::Status::from_error(Box::new(Wrapped(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )))));
        let normalised = transport_status(reset);
        assert_eq!(normalised.code(), tonic::Code::Unavailable);
        let seen = reach.observe::<()>(Err(normalised)).unwrap_err();
        assert!(!nothing_listens(&seen), "a reset is not a refusal");
        assert!(!reach.has_answered());
        reach.observe(Ok(())).unwrap();
        assert!(reach.has_answered());
    }

    #[cfg(feature = "cli")]
    #[test]
    fn an_address_that_keeps_failing_without_an_answer_is_warned_about_once() {
        let (captured, _guard) = crate::testing::logs::capture_warnings();
        let reach = Reachability::endpoint("https://pubsub.example.test");
        let reset = || {
            tonic::Status::from_error(Box::new(Wrapped(Box::new(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            )))))
        };
        for attempt in 1..=NO_ANSWER_WARN_ATTEMPTS + 3 {
            let seen = reach
                .observe::<()>(Err(transport_status(reset())))
                .unwrap_err();
            assert!(!nothing_listens(&seen), "attempt {attempt}");
            let log = captured.text();
            assert_eq!(
                log.contains("no answer from"),
                attempt >= NO_ANSWER_WARN_ATTEMPTS,
                "attempt {attempt}: {log}"
            );
        }
        let log = captured.text();
        assert_eq!(log.matches("no answer from").count(), 1, "{log}");
        assert!(
            log.contains(&format!(
                "no answer from https://pubsub.example.test after {NO_ANSWER_WARN_ATTEMPTS} attempts; \
                 still retrying (check endpoint)"
            )),
            "{log}"
        );
    }

    #[test]
    fn the_emulator_setting_names_the_option_unless_the_variable_holds_the_address() {
        assert_eq!(
            emulator_setting("127.0.0.1:9", "GCP_SQL_TEST_UNSET_EMULATOR_HOST"),
            "emulator_host"
        );
    }
}
