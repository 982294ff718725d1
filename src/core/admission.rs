//! The admission gate: caps the records and bytes a writer keeps unresolved.
//!
//! A [`Permit`] is taken before a record goes anywhere and released when the record resolves
//! (acknowledged, dropped, or abandoned with a failed writer), in the style of tower's
//! concurrency limit. Records parked for a retry keep their permits, so they stay counted.
//!
//! A record larger than the byte cap is admitted when nothing else is in flight: it is never
//! refused, and exceeds the cap until it completes.

use std::sync::{Arc, Mutex};

use super::metrics::SinkMetrics;
use super::progress::Progress;
use crate::error::Result;

#[derive(Debug, Default)]
struct Counts {
    records: u64,
    bytes: u64,
}

/// The in-flight count and byte gate of one writer.
#[derive(Debug)]
pub(crate) struct Gate {
    max_records: u64,
    max_bytes: u64,
    counts: Mutex<Counts>,
    progress: Arc<Progress>,
    metrics: SinkMetrics,
}

impl Gate {
    /// A gate admitting at most `max_records` records and `max_bytes` bytes (`u64::MAX`:
    /// count only). Each release counts as a completion on `progress`.
    pub(crate) fn new(
        max_records: usize,
        max_bytes: u64,
        progress: Arc<Progress>,
        metrics: SinkMetrics,
    ) -> Arc<Self> {
        Arc::new(Gate {
            max_records: (max_records as u64).max(1),
            max_bytes,
            counts: Mutex::default(),
            progress,
            metrics,
        })
    }

    /// Takes a permit for a record of `bytes` if it fits now.
    pub(crate) fn try_admit(self: &Arc<Self>, bytes: u64) -> Option<Permit> {
        self.try_admit_many([bytes]).pop()
    }

    /// Whether a record of `bytes` fits on top of `c`. Alone, a record larger than the byte cap
    /// goes when nothing else is in flight.
    fn fits(&self, c: &Counts, bytes: u64) -> bool {
        c.records < self.max_records
            && (c.records == 0 || c.bytes.saturating_add(bytes) <= self.max_bytes)
    }

    /// Takes permits for the longest prefix of `sizes` that fits now, under one lock: the same
    /// decisions as calling [`Gate::try_admit`] for each size in turn until one does not fit, at
    /// the cost of one. Returns the permits, in order (empty when the first does not fit).
    pub(crate) fn try_admit_many(
        self: &Arc<Self>,
        sizes: impl IntoIterator<Item = u64>,
    ) -> Vec<Permit> {
        let sizes = sizes.into_iter();
        let mut permits = Vec::with_capacity(sizes.size_hint().0);
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        for bytes in sizes {
            if !self.fits(&c, bytes) {
                break;
            }
            c.records += 1;
            c.bytes = c.bytes.saturating_add(bytes);
            permits.push(Permit {
                gate: Some(self.clone()),
                bytes,
            });
        }
        if !permits.is_empty() {
            // Counts only grow while the lock is held, so the final values are the high water.
            self.metrics.set_in_flight(c.records, c.bytes);
        }
        permits
    }

    /// Takes a permit, awaiting completions while the gate is full (never blocking a runtime
    /// thread), under the progress watchdog. `check` is consulted at every wake-up (it reports
    /// a failed writer). `on_block` runs once if the record has to wait.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        bytes: u64,
        mut check: impl FnMut() -> Result<()>,
        on_block: impl FnOnce(),
    ) -> Result<Permit> {
        check()?;
        if let Some(p) = self.try_admit(bytes) {
            return Ok(p);
        }
        on_block();
        let mut permit = None;
        self.progress
            .wait_until("waiting for in-flight room (admission)", || {
                check()?;
                permit = self.try_admit(bytes);
                Ok(permit.is_some())
            })
            .await?;
        permit.ok_or_else(|| crate::error::Error::Failed("admission ended without a permit".into()))
    }

    /// Records and bytes in flight now.
    pub(crate) fn in_flight(&self) -> (u64, u64) {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        (c.records, c.bytes)
    }

    /// Releases `records` permits holding `bytes` in all: one lock and one completion however
    /// many, so a resolved batch leaves the gate at the cost of one record.
    fn release(&self, records: u64, bytes: u64) {
        {
            let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            c.records = c.records.saturating_sub(records);
            c.bytes = c.bytes.saturating_sub(bytes);
            self.metrics.set_in_flight(c.records, c.bytes);
        }
        self.progress.completed();
    }
}

/// One admitted record's share of the gate; released (a completion) when dropped.
#[derive(Debug)]
pub(crate) struct Permit {
    /// `None` once released.
    gate: Option<Arc<Gate>>,
    bytes: u64,
}

impl Permit {
    /// The bytes this permit holds.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Releases every permit of `permits` with one gate lock and one completion per run of
    /// permits of the same gate, instead of one per permit (the send path releases a resolved
    /// batch of up to 1000 records at once). Dropping them one by one has the same effect on the
    /// counts.
    pub(crate) fn release_all(permits: impl IntoIterator<Item = Permit>) {
        let mut run: Option<(Arc<Gate>, u64, u64)> = None;
        for mut permit in permits {
            let Some(gate) = permit.gate.take() else {
                continue;
            };
            match &mut run {
                Some((current, records, bytes)) if Arc::ptr_eq(current, &gate) => {
                    *records += 1;
                    *bytes = bytes.saturating_add(permit.bytes);
                }
                _ => {
                    if let Some((done, records, bytes)) = run.take() {
                        done.release(records, bytes);
                    }
                    run = Some((gate, 1, permit.bytes));
                }
            }
        }
        if let Some((gate, records, bytes)) = run {
            gate.release(records, bytes);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.release(1, self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
    use tokio::time::Instant;

    use super::*;
    use crate::core::metrics::names;
    use crate::error::Error;

    fn gate(records: usize, bytes: u64) -> (Arc<Gate>, ExecutionPlanMetricsSet) {
        let set = ExecutionPlanMetricsSet::new();
        let progress = Arc::new(Progress::new(
            Some(Duration::from_secs(60)),
            "progress_timeout",
        ));
        (
            Gate::new(records, bytes, progress, SinkMetrics::new(&set)),
            set,
        )
    }

    fn metric(set: &ExecutionPlanMetricsSet, name: &str) -> usize {
        set.clone_inner()
            .sum_by_name(name)
            .map(|v| v.as_usize())
            .unwrap_or(usize::MAX)
    }

    #[test]
    fn admitting_many_stops_at_the_first_record_that_does_not_fit() {
        let (g, set) = gate(10, 1_000);
        let permits = g.try_admit_many([400, 400, 300, 100]);
        assert_eq!(
            permits.iter().map(Permit::bytes).collect::<Vec<_>>(),
            [400, 400],
            "the third record would pass the byte cap, so it and everything after it wait"
        );
        assert_eq!(g.in_flight(), (2, 800));
        assert_eq!(metric(&set, names::IN_FLIGHT_BYTES_HIGH_WATER), 800);
        drop(permits);
        assert_eq!(g.in_flight(), (0, 0));
        // Alone, an oversize record goes; nothing joins it.
        let alone = g.try_admit_many([5_000, 1]);
        assert_eq!(alone.len(), 1);
        assert!(g.try_admit_many([1]).is_empty());
        drop(alone);
        let (counted, _) = gate(3, u64::MAX);
        assert_eq!(counted.try_admit_many([1; 5]).len(), 3);
    }

    #[test]
    fn releasing_permits_together_frees_their_records_and_bytes() {
        let (g, set) = gate(10, 1_000);
        let other_set = ExecutionPlanMetricsSet::new();
        let other = Gate::new(
            10,
            1_000,
            Arc::new(Progress::new(None, "p")),
            SinkMetrics::new(&other_set),
        );
        let permits: Vec<Permit> = (1..=4)
            .map(|b| g.try_admit(b * 10).expect("fits"))
            .collect();
        let kept = g.try_admit(7).expect("fits");
        let foreign = other.try_admit(5).expect("fits");
        assert_eq!(g.in_flight(), (5, 107));
        // Permits of two gates in one call: each gate gets back exactly its own.
        Permit::release_all(permits.into_iter().chain(std::iter::once(foreign)));
        assert_eq!(g.in_flight(), (1, 7));
        assert_eq!(other.in_flight(), (0, 0));
        assert_eq!(metric(&set, names::IN_FLIGHT_RECORDS), 1);
        assert_eq!(metric(&set, names::IN_FLIGHT_BYTES), 7);
        drop(kept);
        assert_eq!(g.in_flight(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn oversize_record_is_admitted_alone() {
        let (g, set) = gate(10, 100);
        let big = g
            .admit(1_000, || Ok(()), || {})
            .await
            .expect("admitted alone");
        assert_eq!(metric(&set, names::IN_FLIGHT_BYTES), 1_000);
        // Nothing else fits beside it, not even a small record.
        assert!(g.try_admit(1).is_none());
        drop(big);
        let small = g.try_admit(60).expect("room again");
        // An oversize record waits while something else is in flight.
        assert!(g.try_admit(1_000).is_none());
        drop(small);
        assert!(g.try_admit(1_000).is_some());
        assert_eq!(metric(&set, names::IN_FLIGHT_BYTES_HIGH_WATER), 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn write_at_count_cap_waits_until_a_completion() {
        let (g, set) = gate(2, u64::MAX);
        let a = g.try_admit(1).expect("first");
        let _b = g.try_admit(1).expect("second");
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(a);
        });
        let start = Instant::now();
        let mut blocked = false;
        let _c = g
            .admit(1, || Ok(()), || blocked = true)
            .await
            .expect("admitted after completion");
        assert!(blocked);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert_eq!(metric(&set, names::IN_FLIGHT_RECORDS), 2);
        assert_eq!(metric(&set, names::IN_FLIGHT_RECORDS_HIGH_WATER), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn write_at_byte_cap_waits_until_a_completion() {
        let (g, _set) = gate(100, 100);
        let a = g.try_admit(70).expect("first");
        assert!(
            g.try_admit(40).is_none(),
            "70 + 40 exceeds the 100-byte cap"
        );
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop(a);
        });
        let start = Instant::now();
        let _b = g.admit(40, || Ok(()), || {}).await.expect("admitted");
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert_eq!(g.in_flight(), (1, 40));
    }

    #[tokio::test(start_paused = true)]
    async fn blocked_admission_trips_the_watchdog_naming_admission() {
        let (g, _set) = gate(1, u64::MAX);
        let _a = g.try_admit(1).expect("first");
        let err = g.admit(1, || Ok(()), || {}).await.unwrap_err();
        match err {
            Error::ProgressTimeout {
                waiting_for,
                option,
                ..
            } => {
                assert!(waiting_for.contains("admission"));
                assert_eq!(option, "progress_timeout");
            }
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn count_only_cap_ignores_bytes() {
        let set = ExecutionPlanMetricsSet::new();
        let progress = Arc::new(Progress::new(None, "p"));
        let g = Gate::new(3, u64::MAX, progress, SinkMetrics::new(&set));
        let _a = g.try_admit(u64::MAX / 2).expect("a");
        let _b = g.try_admit(u64::MAX / 2).expect("b");
        let _c = g.try_admit(u64::MAX / 2).expect("c");
        assert!(g.try_admit(1).is_none());
    }
}
