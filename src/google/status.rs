//! Transport-error mapping: the one place a broken connection or the client's own deadline
//! becomes the status Google's clients give it (`UNAVAILABLE`, `DEADLINE_EXCEEDED`).

/// What broke, when a status's source chain shows the call never got the server's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TransportFailure {
    /// The connection: refused, reset, closed, a GOAWAY, a reset stream, an I/O error.
    Connection,
    /// The client's own per-attempt deadline (tonic's `TimeoutExpired`, which it reports as
    /// `CANCELLED` "Timeout expired").
    ClientDeadline,
}

/// Walks `status`'s source chain for a transport failure: the first error in it that is a
/// client-side timeout or a connection-level error decides; a `Status` nested in the chain (one
/// a middleware returned) is an answer and stops the walk.
pub(super) fn transport_failure(status: &tonic::Status) -> Option<TransportFailure> {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::Status>() {
            return None;
        }
        if error.is::<tonic::TimeoutExpired>() {
            return Some(TransportFailure::ClientDeadline);
        }
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            // A peer refusing the connection's security is not going to change on a retry.
            return (h2.reason() != Some(h2::Reason::INADEQUATE_SECURITY))
                .then_some(TransportFailure::Connection);
        }
        if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
            // A timeout or a cancellation from hyper itself is the connection's; whatever else
            // it carries is read further down the chain (an h2 or I/O error) first.
            if hyper.is_timeout() || hyper.is_canceled() || hyper.is_closed() {
                return Some(TransportFailure::Connection);
            }
        }
        if error.is::<tonic::ConnectError>() || error.is::<std::io::Error>() {
            return Some(TransportFailure::Connection);
        }
        source = error.source();
    }
    // A chain without a more specific cause: tonic's `transport::Error` or a hyper error alone
    // (tonic words the first "transport error") is still the connection's.
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(transport) = error.downcast_ref::<tonic::transport::Error>()
            && transport.to_string().starts_with("transport error")
        {
            return Some(TransportFailure::Connection);
        }
        if error.is::<hyper::Error>() {
            return Some(TransportFailure::Connection);
        }
        source = error.source();
    }
    None
}

/// Turns a failure of the transport into the status Google's clients give it, before a
/// connector's `classify` sees it: a broken connection (refused, reset, closed, a GOAWAY or a
/// reset stream, an I/O error) is `UNAVAILABLE`, and the client's own attempt deadline is
/// `DEADLINE_EXCEEDED`. tonic reports the first as `UNKNOWN` ("transport error", "error reading
/// a body from connection"), `INTERNAL` or `CANCELLED` ("h2 protocol error: ...", "operation was
/// canceled"), and the second as `CANCELLED` ("Timeout expired"); each connector retries both
/// under its own retry budget.
///
/// Only a status whose source chain shows the failure is changed: a status the server sent
/// (from its trailers, so with no source), whatever its code, is returned as it is. The new
/// status keeps the old one's message after the cause, the error chain, and its metadata.
///
/// Every call through a [`GrpcChannel`] (its own failure and its response body's) already
/// passes through here.
///
/// # Example
///
/// ```
/// use gcp_sql::google::transport_status;
/// use tonic::{Code, Status};
///
/// let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
/// let status = Status::from_error(Box::new(reset));
/// assert_eq!(status.code(), Code::Unknown);
/// assert_eq!(transport_status(status).code(), Code::Unavailable);
///
/// // A status the server sent stays what it is.
/// let server = Status::unknown("the server could not say");
/// assert_eq!(transport_status(server).code(), Code::Unknown);
/// ```
pub fn transport_status(status: tonic::Status) -> tonic::Status {
    let Some(failure) = transport_failure(&status) else {
        return status;
    };
    let code = match failure {
        TransportFailure::Connection => tonic::Code::Unavailable,
        TransportFailure::ClientDeadline => tonic::Code::DeadlineExceeded,
    };
    if status.code() == code {
        // Already what a retry looks for (tonic's own `UNAVAILABLE` for a refused connection).
        return status;
    }
    let mut chain = String::new();
    let mut source = std::error::Error::source(&status);
    while let Some(error) = source {
        let text = error.to_string();
        if !text.is_empty() && !status.message().contains(&text) && !chain.contains(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        source = error.source();
    }
    let cause = match failure {
        TransportFailure::Connection => "the connection failed",
        TransportFailure::ClientDeadline => "the attempt deadline passed on the client",
    };
    let message = format!(
        "{cause} (reported as {}: {}{chain})",
        crate::error::code_name(status.code()),
        status.message()
    );
    let mut normalised = tonic::Status::with_metadata(code, message, status.metadata().clone());
    // The original status, its chain with it, is the new one's source; a status in the chain
    // also makes a second pass leave the new one as it is.
    normalised.set_source(std::sync::Arc::new(status));
    normalised
}

#[cfg(test)]
mod tests {
    use tonic::metadata::MetadataValue;

    use super::super::test_support::{Wrapped, from_error};
    use super::*;

    #[test]
    fn an_io_error_in_the_chain_is_unavailable_whatever_tonic_called_it() {
        for kind in [
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            let status = from_error(Wrapped(Box::new(std::io::Error::from(kind))));
            assert_eq!(status.code(), tonic::Code::Unknown, "{kind:?}");
            let normalised = transport_status(status);
            assert_eq!(normalised.code(), tonic::Code::Unavailable, "{kind:?}");
            assert!(
                normalised
                    .message()
                    .starts_with("the connection failed (reported as UNKNOWN: wrapped"),
                "{}",
                normalised.message()
            );
        }
    }

    #[test]
    fn a_client_side_timeout_is_deadline_exceeded_not_cancelled() {
        let status = from_error(Wrapped(Box::new(tonic::TimeoutExpired(()))));
        assert_eq!(status.code(), tonic::Code::Cancelled);
        assert_eq!(status.message(), "Timeout expired");
        let normalised = transport_status(status);
        assert_eq!(normalised.code(), tonic::Code::DeadlineExceeded);
        assert!(
            normalised.message().contains("Timeout expired"),
            "{}",
            normalised.message()
        );
    }

    #[test]
    fn h2_stream_and_connection_errors_are_unavailable_except_a_security_refusal() {
        for reason in [
            h2::Reason::REFUSED_STREAM,
            h2::Reason::CANCEL,
            h2::Reason::INTERNAL_ERROR,
            h2::Reason::PROTOCOL_ERROR,
            h2::Reason::NO_ERROR,
        ] {
            let status = from_error(h2::Error::from(reason));
            assert_eq!(
                transport_status(status).code(),
                tonic::Code::Unavailable,
                "{reason:?}"
            );
        }
        let security = from_error(h2::Error::from(h2::Reason::INADEQUATE_SECURITY));
        let code = security.code();
        assert_eq!(transport_status(security).code(), code);
    }

    #[test]
    fn statuses_the_server_sent_stay_as_they_are() {
        for status in [
            tonic::Status::unknown("transport error"),
            tonic::Status::cancelled("Timeout expired"),
            tonic::Status::internal("h2 protocol error"),
            tonic::Status::aborted("contention"),
            tonic::Status::invalid_argument("bad row"),
        ] {
            let (code, message) = (status.code(), status.message().to_string());
            let same = transport_status(status);
            assert_eq!((same.code(), same.message()), (code, message.as_str()));
        }
    }

    #[test]
    fn a_status_nested_in_the_chain_is_an_answer_and_stays() {
        let inner = tonic::Status::cancelled("the caller gave up");
        let status = from_error(Wrapped(Box::new(Wrapped(Box::new(inner)))));
        assert_eq!(status.code(), tonic::Code::Cancelled);
        assert_eq!(transport_status(status).code(), tonic::Code::Cancelled);
    }

    #[test]
    fn a_status_already_retryable_is_kept_and_normalising_twice_changes_nothing() {
        let refused = from_error(tonic::ConnectError(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ))));
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        let message = refused.message().to_string();
        assert_eq!(transport_status(refused).message(), message);

        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert("x-kept", MetadataValue::from_static("1"));
        let reset = tonic::Status::with_metadata(tonic::Code::Unknown, "transport error", metadata);
        let mut reset = reset;
        reset.set_source(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        let once = transport_status(reset);
        assert_eq!(once.code(), tonic::Code::Unavailable);
        assert!(once.metadata().get("x-kept").is_some());
        let message = once.message().to_string();
        let twice = transport_status(once);
        assert_eq!(
            (twice.code(), twice.message()),
            (tonic::Code::Unavailable, message.as_str())
        );
    }
}
