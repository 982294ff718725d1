//! The messages a window run has counted and not yet let go of, so that a copy Pub/Sub
//! delivers again inside the run is not counted twice (ADR 0068, "A redelivery during a run").
//!
//! Pub/Sub delivers at least once: a message whose lease lapsed (or whose acknowledgement was
//! lost) comes back with a new ack id and the same message id. A windowed run holds a counted
//! message until its windows are recorded, then acknowledges it; a copy arriving meanwhile,
//! or shortly after, belongs to the same windows (its event time is the same), so it is
//! recognised by its message id and release:
//!
//! - while the original is held, the copy is held with it (released with the same windows)
//!   and not counted;
//! - once the original was released, the copy is acknowledged as covered, for
//!   `keep_released` after the release (the time a lapsed lease's redelivery takes to come
//!   back; after that a copy is treated as any other row of an emitted window).
//!
//! A message is kept as a 128-bit fingerprint of its id under its release, not as its id: 17
//! to 36 bytes a held message (a hash set's buckets, up to half of them empty), and no string
//! per held message (docs/benchmarks.md, "Memory per held message in open windows").

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::hash::Hasher as _;
use std::time::Duration;

use siphasher::sip128::{Hasher128 as _, SipHasher13};

use tokio::time::Instant;

/// A message id's fingerprint: SipHash-1-3 with its 128-bit output and fixed keys. Two of the
/// ids a run holds at once collide with a probability of about n² / 2¹²⁹ (1e-27 for a million
/// held messages). The function is fixed (not the standard library's `DefaultHasher`, whose
/// output may change between Rust releases): the covered sets a run stores beside its marker
/// are read by the next run, maybe of a newer build.
pub fn fingerprint(id: &str) -> u128 {
    let mut h = SipHasher13::new_with_keys(0x6763_702d_7371_6c2d, 0x7365_656e_2d69_6473);
    h.write(id.as_bytes());
    h.finish128().into()
}

/// What a message id is to the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not counted by this run (or released longer than `keep_released` ago).
    New,
    /// Counted and still held under its release: hold the copy with it.
    Held,
    /// Counted, and its windows were recorded (its acknowledgement went out) within
    /// `keep_released`: the copy is covered.
    Released,
    /// In a covered set an earlier run stored (its windows were recorded, its acknowledgement
    /// may have been interrupted by a kill), within `keep_released` of this run's start: the
    /// message is covered.
    Covered,
}

/// The fingerprints of the messages counted, by release, while held and for a while after.
#[derive(Debug)]
pub struct SeenMessages {
    held: BTreeMap<i64, HashSet<u128>>,
    /// Released sets, oldest first: when they were released, their release, the ids, sorted.
    /// A released set never changes, so it is kept as a sorted slice (16 bytes an id) rather
    /// than the hash set it was held in (about 40 with the table's empty buckets): a run keeps
    /// every message released in the last `keep_released`, which at a high rate is millions.
    released: VecDeque<(Instant, i64, Box<[u128]>)>,
    /// What earlier runs let go of (their covered sets), by release, until `inherited_until`.
    inherited: BTreeMap<i64, HashSet<u128>>,
    inherited_until: Option<Instant>,
    keep_released: Duration,
}

impl Default for SeenMessages {
    fn default() -> Self {
        SeenMessages::new(Duration::ZERO)
    }
}

impl SeenMessages {
    /// Remembers released messages for `keep_released`.
    pub fn new(keep_released: Duration) -> SeenMessages {
        SeenMessages {
            held: BTreeMap::new(),
            released: VecDeque::new(),
            inherited: BTreeMap::new(),
            inherited_until: None,
            keep_released,
        }
    }

    /// Where the message `id` (a [`fingerprint`]) whose windows end at `release` stands. A
    /// [`Seen::New`] id is not remembered; call [`Self::hold`] for it once counted.
    pub fn check(&mut self, release: i64, id: u128, now: Instant) -> Seen {
        if self.held.get(&release).is_some_and(|s| s.contains(&id)) {
            return Seen::Held;
        }
        self.forget_old(now);
        if self
            .released
            .iter()
            .any(|(_, r, ids)| *r == release && ids.binary_search(&id).is_ok())
        {
            return Seen::Released;
        }
        if self
            .inherited
            .get(&release)
            .is_some_and(|s| s.contains(&id))
        {
            return Seen::Covered;
        }
        Seen::New
    }

    /// The message `id` was counted and is held until `release` is recorded.
    pub fn hold(&mut self, release: i64, id: u128) {
        self.held.entry(release).or_default().insert(id);
    }

    /// Every release at or before `frontier` was recorded: their messages go from held to
    /// released, with `also` (release and id of messages settled another way, such as late
    /// rows whose letters are stored).
    pub fn release_through(
        &mut self,
        frontier: i64,
        now: Instant,
        also: impl IntoIterator<Item = (i64, u128)>,
    ) {
        let later = self.held.split_off(&frontier.saturating_add(1));
        let mut done = std::mem::replace(&mut self.held, later);
        for (release, id) in also {
            done.entry(release).or_default().insert(id);
        }
        self.forget_old(now);
        if self.keep_released.is_zero() {
            return;
        }
        for (release, ids) in done {
            let mut ids: Vec<u128> = ids.into_iter().collect();
            ids.sort_unstable();
            self.released
                .push_back((now, release, ids.into_boxed_slice()));
        }
    }

    /// The messages held under releases at or before `frontier`, by release: what
    /// [`Self::release_through`] will let go of when that frontier is recorded.
    pub fn held_through(&self, frontier: i64) -> Vec<(i64, Vec<u128>)> {
        self.held
            .range(..=frontier)
            .map(|(release, ids)| (*release, ids.iter().copied().collect()))
            .collect()
    }

    /// Writes the messages held under releases at or before `frontier` into `out`, by release
    /// (a covered set, ADR 0068), sized once.
    pub fn store_through(&self, frontier: i64, out: &mut super::progress::CoveredBytes) {
        for (release, ids) in self.held.range(..=frontier) {
            out.push(*release, ids.iter().copied());
        }
    }

    /// How many releases at or before `frontier` hold messages, and how many messages.
    pub fn held_through_count(&self, frontier: i64) -> (usize, usize) {
        self.held
            .range(..=frontier)
            .fold((0, 0), |(r, n), (_, ids)| (r + 1, n + ids.len()))
    }

    /// Messages earlier runs counted and let go of (their covered sets, ADR 0068): a copy of
    /// one is [`Seen::Covered`] until `until`.
    pub fn inherit(&mut self, until: Instant, sets: impl IntoIterator<Item = (i64, Vec<u128>)>) {
        for (release, ids) in sets {
            self.inherited.entry(release).or_default().extend(ids);
        }
        self.inherited_until = Some(self.inherited_until.map_or(until, |u| u.max(until)));
    }

    /// Nothing is held any more (the run stopped and handed its messages back).
    pub fn clear(&mut self) {
        self.held.clear();
        self.released.clear();
        self.inherited.clear();
    }

    /// Messages held now.
    pub fn held(&self) -> usize {
        self.held.values().map(HashSet::len).sum()
    }

    fn forget_old(&mut self, now: Instant) {
        while self
            .released
            .front()
            .is_some_and(|(at, _, _)| now.saturating_duration_since(*at) >= self.keep_released)
        {
            self.released.pop_front();
        }
        if self.inherited_until.is_some_and(|until| now >= until) {
            self.inherited = BTreeMap::new();
            self.inherited_until = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_tell_ids_apart_and_repeat_for_the_same_id() {
        let ids: Vec<String> = (0..100_000u64).map(|n| n.to_string()).collect();
        let prints: HashSet<u128> = ids.iter().map(|id| fingerprint(id)).collect();
        assert_eq!(prints.len(), ids.len());
        assert_eq!(fingerprint("17"), fingerprint("17"));
        assert_ne!(fingerprint(""), fingerprint("0"));
    }

    /// Released sets are sorted slices searched by halves: every id of a large release is
    /// found under its own release and under no other, and the values next to it are not.
    #[tokio::test(start_paused = true)]
    async fn every_id_of_a_large_release_is_found_and_no_other() {
        let mut seen = SeenMessages::new(Duration::from_secs(25));
        let now = Instant::now();
        let ids: Vec<u128> = (0..5_000).map(|n| fingerprint(&format!("m{n}"))).collect();
        for (n, id) in ids.iter().enumerate() {
            seen.hold(if n % 2 == 0 { 60 } else { 120 }, *id);
        }
        seen.release_through(120, now, [(90, fingerprint("late"))]);
        assert_eq!(seen.held(), 0);
        for (n, id) in ids.iter().enumerate() {
            let (own, other) = if n % 2 == 0 { (60, 120) } else { (120, 60) };
            assert_eq!(seen.check(own, *id, now), Seen::Released, "id {n}");
            assert_eq!(seen.check(other, *id, now), Seen::New, "id {n} elsewhere");
            assert_eq!(
                seen.check(own, id.wrapping_add(1), now),
                Seen::New,
                "id {n} + 1"
            );
        }
        assert_eq!(seen.check(90, fingerprint("late"), now), Seen::Released);
        assert_eq!(seen.check(90, fingerprint("other"), now), Seen::New);
    }

    #[tokio::test(start_paused = true)]
    async fn a_copy_is_held_while_its_original_is_then_covered_for_a_while() {
        let mut seen = SeenMessages::new(Duration::from_secs(25));
        let (a, b) = (fingerprint("a"), fingerprint("b"));
        let now = Instant::now();
        assert_eq!(seen.check(60, a, now), Seen::New);
        seen.hold(60, a);
        seen.hold(120, b);
        assert_eq!(seen.check(60, a, now), Seen::Held);
        // The same id under another release is another message's business (its event time
        // differs, so it is not a copy).
        assert_eq!(seen.check(120, a, now), Seen::New);
        assert_eq!(seen.held(), 2);

        seen.release_through(60, now, [(30, fingerprint("late"))]);
        assert_eq!(seen.check(30, fingerprint("late"), now), Seen::Released);
        assert_eq!(seen.held(), 1);
        assert_eq!(seen.check(60, a, now), Seen::Released);
        assert_eq!(seen.check(120, b, now), Seen::Held);
        tokio::time::advance(Duration::from_secs(24)).await;
        assert_eq!(seen.check(60, a, Instant::now()), Seen::Released);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(seen.check(60, a, Instant::now()), Seen::New);

        seen.clear();
        assert_eq!(seen.check(120, b, Instant::now()), Seen::New);
        assert_eq!(seen.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_runs_covered_set_covers_exactly_its_messages_for_a_while() {
        let mut seen = SeenMessages::new(Duration::from_secs(25));
        let (a, b, late) = (fingerprint("a"), fingerprint("b"), fingerprint("late"));
        seen.hold(60, a);
        seen.hold(120, b);
        let stored = seen.held_through(60);
        assert_eq!(stored, vec![(60, vec![a])]);

        // The next run, after a kill: only the stored messages are covered.
        let mut next = SeenMessages::new(Duration::from_secs(25));
        next.inherit(Instant::now() + Duration::from_secs(3600), stored);
        assert_eq!(next.check(60, a, Instant::now()), Seen::Covered);
        assert_eq!(next.check(60, late, Instant::now()), Seen::New);
        assert_eq!(next.check(120, b, Instant::now()), Seen::New);
        // Kept past the run's own retention, until the time it was given.
        tokio::time::advance(Duration::from_secs(3599)).await;
        assert_eq!(next.check(60, a, Instant::now()), Seen::Covered);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(next.check(60, a, Instant::now()), Seen::New);
    }

    #[test]
    fn fingerprints_are_fixed_across_builds() {
        // Covered sets outlive the process: the function must not change with the toolchain.
        assert_eq!(fingerprint("17"), fingerprint("17"));
        assert_eq!(format!("{:032x}", fingerprint("")), PINNED_EMPTY);
        assert_eq!(format!("{:032x}", fingerprint("4242")), PINNED_4242);
    }

    #[test]
    fn without_a_retention_released_messages_are_forgotten_at_once() {
        let mut seen = SeenMessages::default();
        let a = fingerprint("a");
        let now = Instant::now();
        seen.hold(5, a);
        seen.release_through(10, now, []);
        assert_eq!(seen.check(5, a, now), Seen::New);
    }

    /// SipHash-1-3-128 of "" and "4242" with the keys of [`fingerprint`].
    const PINNED_EMPTY: &str = "9dd012fe910c49eb5453aa00e755e520";
    const PINNED_4242: &str = "349f706371b572f038086106e1dcb7ff";
}
