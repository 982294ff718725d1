//! The options every connector shares, parsed once: [`SharedOptions`]. Each connector's
//! options embed one, and the generic sink reads it through one accessor
//! ([`Connector::shared`](super::sink::Connector::shared)).

use super::dead_letter::{DeadLetterTarget, DeadLetterTopics};
use super::descriptor::ConnectorKind;
use crate::core::{FailurePolicy, FlowConfig};
use crate::error::Result;
use crate::options::common::RunOptions;
use crate::options::{ConnectionOptions, EnvLookup, ParsedOptions, RawOptions};

/// The part of a table's options every connector accepts with one meaning: where it connects,
/// what happens to a refused row, where dead rows go, and how a statement runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedOptions {
    /// Project, endpoint, emulator, credentials.
    pub connection: ConnectionOptions,
    /// What to do with a refused record.
    pub failure_policy: FailurePolicy,
    /// Where the `dead_letter` policy puts rows (`dead_letter_topic`, `dead_letter_path`);
    /// `Some` exactly under that policy.
    pub dead_letter: Option<DeadLetterTarget>,
    /// How a statement runs: writers and flush points.
    pub run: RunOptions,
}

impl SharedOptions {
    /// Parses `raw` against `kind`'s options ([`ConnectorKind::parse_options`]) and reads the
    /// shared part: the start of every connector's `from_raw_with_env`.
    pub fn parse(
        kind: ConnectorKind,
        raw: &RawOptions,
        env: EnvLookup<'_>,
        topics: &'static DeadLetterTopics,
    ) -> Result<(ParsedOptions, Self)> {
        let parsed = kind.parse_options(raw)?;
        let shared = Self::from_parsed(kind, &parsed, env, topics)?;
        Ok((parsed, shared))
    }

    /// Reads the shared options of `kind`'s parsed options, the emulator variable through
    /// `env`; `topics` is how a `dead_letter_topic` is resolved and reached.
    pub fn from_parsed(
        kind: ConnectorKind,
        p: &ParsedOptions,
        env: EnvLookup<'_>,
        topics: &'static DeadLetterTopics,
    ) -> Result<Self> {
        let connection = ConnectionOptions::from_parsed(p, kind.service(), env)?;
        let failure_policy = p.failure_policy()?;
        let dead_letter =
            DeadLetterTarget::from_parsed(p, failure_policy, kind, &connection, env, topics)?;
        Ok(SharedOptions {
            connection,
            failure_policy,
            dead_letter,
            run: p.run_options()?,
        })
    }

    /// Sets the core settings the shared options decide, over what the connector's own
    /// translation filled in (the generic sink calls it for every connector, so a shared
    /// writer option is read and applied here and nowhere else).
    pub fn apply(&self, flow: &mut FlowConfig) {
        flow.failure_policy = self.failure_policy;
    }

    /// Options for a connection alone: the `fail` policy, no dead letters, one writer per
    /// input partition and no flush points (the Rust API's starting point).
    pub fn with_connection(connection: ConnectionOptions) -> Self {
        SharedOptions {
            connection,
            failure_policy: FailurePolicy::Fail,
            dead_letter: None,
            run: RunOptions::default(),
        }
    }
}
