//! The options every connector shares, parsed once: [`SharedOptions`]. Each connector's
//! options embed one, and the generic sink reads it through one accessor
//! ([`TableOptions::shared`]). [`TableOptions`] is the one parse-validate-build sequence every
//! connector's options go through: the shared part here, the connector's own part in its
//! `from_parsed`.

use super::dead_letter::{DeadLetterTarget, DeadLetterTopics};
use super::descriptor::ConnectorKind;
use crate::core::{FailurePolicy, FlowConfig};
use crate::error::Result;
use crate::options::common::RunOptions;
use crate::options::{ConnectionOptions, EnvLookup, ParsedOptions, RawOptions};

/// A connector's typed table options (its `*SinkOptions`), built from a declared table's
/// `LOCATION` and `OPTIONS` in one sequence for every connector: the options are parsed against
/// the connector's specs and the shared part read once ([`SharedOptions::parse`]), then the
/// connector reads its own part ([`from_parsed`](Self::from_parsed)).
///
/// Code generic over the connector reads the shared part the same way for each (each
/// connector's options page has a concrete example):
///
/// ```
/// use gcp_sql::connectors::shared::TableOptions;
/// use gcp_sql::options::RawOptions;
///
/// /// The project a table's options name, whatever its connector.
/// fn project_of<O: TableOptions>(
///     location: Option<&str>,
///     raw: &RawOptions,
/// ) -> gcp_sql::Result<Option<String>> {
///     let opts = O::from_raw_with_env(location, raw, &|_| None)?;
///     Ok(opts.shared().connection.project.clone())
/// }
/// ```
pub trait TableOptions: Sized {
    /// The connector whose options these are.
    const KIND: ConnectorKind;
    /// How a `dead_letter_topic` is resolved and reached.
    const DEAD_LETTER_TOPICS: &'static DeadLetterTopics;

    /// Reads the connector's own options from `p` (the table's options, parsed against the
    /// connector's specs) and `location` (the `LOCATION`; `None` or empty means none), beside
    /// the shared part already read.
    fn from_parsed(
        location: Option<&str>,
        p: &ParsedOptions,
        shared: SharedOptions,
    ) -> Result<Self>;

    /// The options every connector shares: connection, failure policy, dead letters, run.
    fn shared(&self) -> &SharedOptions;

    /// Builds the options from a statement's `LOCATION` (empty means none) and options,
    /// reading the emulator variable from the process environment.
    fn from_raw(location: Option<&str>, raw: &RawOptions) -> Result<Self> {
        Self::from_raw_with_env(location, raw, &ConnectionOptions::process_env)
    }

    /// [`from_raw`](Self::from_raw) with the environment read through `env`.
    fn from_raw_with_env(
        location: Option<&str>,
        raw: &RawOptions,
        env: EnvLookup<'_>,
    ) -> Result<Self> {
        let (p, shared) = SharedOptions::parse(Self::KIND, raw, env, Self::DEAD_LETTER_TOPICS)?;
        Self::from_parsed(location, &p, shared)
    }
}

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
