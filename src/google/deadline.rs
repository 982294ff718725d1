//! Per-attempt deadlines.

use std::time::Duration;

use gcloud_sdk::RequestTimeouts;

/// Applies the per-attempt deadline `timeout` to `request`: it travels as `grpc-timeout`, and
/// on an authenticated channel (`google`) it also bounds the token fetch the auth middleware
/// makes before the call. A zero or absent timeout means no deadline, as it does in gax.
pub fn with_deadline<M>(
    mut request: tonic::Request<M>,
    timeout: Option<Duration>,
    google: bool,
) -> tonic::Request<M> {
    if let Some(timeout) = timeout.filter(|t| !t.is_zero()) {
        request.set_timeout(timeout);
        if google {
            // Also bounds the token fetch the auth middleware does before the call.
            request
                .extensions_mut()
                .insert(RequestTimeouts::new().with_total(timeout));
        }
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attempt_timeout_travels_as_grpc_timeout_and_zero_means_none() {
        let timed = with_deadline(
            tonic::Request::new(()),
            Some(Duration::from_millis(1_500)),
            true,
        );
        assert!(timed.metadata().get("grpc-timeout").is_some());
        assert_eq!(
            timed.extensions().get::<RequestTimeouts>(),
            Some(&RequestTimeouts::new().with_total(Duration::from_millis(1_500)))
        );
        let plain = with_deadline(tonic::Request::new(()), Some(Duration::from_secs(1)), false);
        assert!(plain.metadata().get("grpc-timeout").is_some());
        assert!(plain.extensions().get::<RequestTimeouts>().is_none());
        for none in [None, Some(Duration::ZERO)] {
            let request = with_deadline(tonic::Request::new(()), none, true);
            assert!(request.metadata().get("grpc-timeout").is_none(), "{none:?}");
            assert!(
                request.extensions().get::<RequestTimeouts>().is_none(),
                "{none:?}"
            );
        }
    }
}
