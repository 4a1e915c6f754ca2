//! `reader.batch_window` (AWS Lambda's `MaximumBatchingWindowInSeconds`): the records
//! reads bring are gathered instead of handed over at once, and go to the processor as
//! one batch when
//! - they reach `reader.max_records`, counted as read: a KPL aggregate is one record
//!   here (the outbox de-aggregates at delivery);
//! - the window has passed since the first of them was read (the reader's timer,
//!   [`Gathered::Kept`]'s `arm`, fires then even when no read comes; a read after it
//!   hands them over too);
//! - a read says the shard ended: at once, with the end.
//!
//! Gathered records are not delivered: the outbox's positions (the last delivered, the
//! checkpoints a processor may name) move only when they are, so a reader that stops or
//! hands off drops them unacked and the next owner reads them again. A record read again
//! (a new iterator or subscription from before it) is not gathered twice. An empty read
//! while records are gathered is no empty call (`reader.call_on_empty`); with nothing
//! gathered it is passed on as it is. A window of zero passes every read through.
//!
//! No actor, no clock read: time comes in as a parameter.

use std::time::Duration;

use tokio::time::Instant;

use super::pure;
use crate::backend::Record;
use crate::model::SequenceNumber;

/// What became of a read's records.
#[derive(Debug)]
pub(super) enum Gathered {
    /// Hand these over now as one batch, read at `fetched_at` (the first gathered read's
    /// time): the gathered records and the read's, or the read as it came.
    Deliver {
        records: Vec<Record>,
        fetched_at: Instant,
    },
    /// Kept for later. `arm`: this read opened the window, which closes this long from
    /// now.
    Kept { arm: Option<Duration> },
}

pub(super) struct Gather {
    window: Duration,
    records: Vec<Record>,
    /// Their in-memory size ([`pure::record_memory`]), held in the worker's budget.
    memory: u64,
    /// When the first gathered record was read.
    since: Option<Instant>,
    /// The last record gathered or handed on (with a window): records at or before it
    /// were read already.
    last: Option<SequenceNumber>,
}

impl Gather {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            records: Vec::new(),
            memory: 0,
            since: None,
            last: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Memory the gathered records hold.
    pub fn memory(&self) -> u64 {
        self.memory
    }

    /// How many records the next read may bring: what is missing up to `max` (at least
    /// one).
    pub fn room(&self, max: u32) -> u32 {
        let gathered = u32::try_from(self.records.len()).unwrap_or(u32::MAX);
        max.saturating_sub(gathered).max(1)
    }

    /// Where a new iterator resumes while records are gathered: after the last of them.
    pub fn resume_after(&self) -> Option<&SequenceNumber> {
        self.last.as_ref().filter(|_| !self.records.is_empty())
    }

    /// Whether the window has passed since the first gathered record was read.
    pub fn due(&self, now: Instant) -> bool {
        self.since
            .is_some_and(|since| now.saturating_duration_since(since) >= self.window)
    }

    /// A read's records (`raw`, read at `fetched_at`; `at_end`: the read says the shard
    /// ended): gathered, or handed over with those gathered before.
    pub fn add(
        &mut self,
        mut raw: Vec<Record>,
        fetched_at: Instant,
        at_end: bool,
        max: u32,
        now: Instant,
    ) -> Gathered {
        if self.window.is_zero() {
            return Gathered::Deliver {
                records: raw,
                fetched_at,
            };
        }
        if let Some(last) = &self.last {
            raw.retain(|r| &r.sequence_number > last);
        }
        if let Some(newest) = raw.last() {
            self.last = Some(newest.sequence_number.clone());
        }
        let opens = self.records.is_empty() && !raw.is_empty();
        if opens {
            self.since = Some(fetched_at);
        }
        self.memory += raw.iter().map(pure::record_memory).sum::<u64>();
        self.records.extend(raw);
        let full = self.records.len() >= max as usize;
        if at_end || full || self.records.is_empty() || self.due(now) {
            let (records, since) = self.take();
            return Gathered::Deliver {
                records,
                fetched_at: since.unwrap_or(fetched_at),
            };
        }
        let arm = self.since.filter(|_| opens).map(|since| {
            self.window
                .saturating_sub(now.saturating_duration_since(since))
        });
        Gathered::Kept { arm }
    }

    /// The gathered records and when the first was read, once the window has passed.
    pub fn take_due(&mut self, now: Instant) -> Option<(Vec<Record>, Instant)> {
        if !self.due(now) {
            return None;
        }
        let (records, since) = self.take();
        since.map(|since| (records, since))
    }

    /// Reading starts over elsewhere (a trimmed checkpoint): forgets what is gathered,
    /// and what was read.
    pub fn restart(&mut self) {
        self.take();
        self.last = None;
    }

    fn take(&mut self) -> (Vec<Record>, Option<Instant>) {
        self.memory = 0;
        (std::mem::take(&mut self.records), self.since.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u32 = 5;

    fn record(seq: u64) -> Record {
        Record {
            sequence_number: SequenceNumber::parse(&seq.to_string()).unwrap(),
            sub_sequence_number: 0,
            partition_key: "k".into(),
            explicit_hash_key: None,
            data: bytes::Bytes::from_static(b"abcd"),
            approximate_arrival: None,
        }
    }

    fn read(seqs: &[u64]) -> Vec<Record> {
        seqs.iter().map(|s| record(*s)).collect()
    }

    fn seqs(records: &[Record]) -> Vec<String> {
        records
            .iter()
            .map(|r| r.sequence_number.to_string())
            .collect()
    }

    /// What one read did: `None` kept (with `Some(arm)` when it opened the window), or
    /// the records handed over and their `fetched_at` offset from `t0`.
    #[derive(Debug, PartialEq)]
    enum Did {
        Kept(Option<Duration>),
        Delivered(Vec<String>, Duration),
    }

    fn did(gathered: Gathered, t0: Instant) -> Did {
        match gathered {
            Gathered::Kept { arm } => Did::Kept(arm),
            Gathered::Deliver {
                records,
                fetched_at,
            } => Did::Delivered(seqs(&records), fetched_at - t0),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn delivered(list: &[u64], at: u64) -> Did {
        Did::Delivered(list.iter().map(u64::to_string).collect(), ms(at))
    }

    /// A scenario: reads at times (ms after t0), each with its records and whether it
    /// ends the shard, and what each read did.
    struct Case {
        name: &'static str,
        window: u64,
        reads: Vec<(u64, Vec<u64>, bool)>,
        want: Vec<Did>,
    }

    #[test]
    fn records_are_gathered_until_max_records_the_window_or_the_shards_end() {
        let cases = [
            Case {
                name: "window 0: every read passes through, the empty one too",
                window: 0,
                reads: vec![
                    (0, vec![1], false),
                    (10, vec![], false),
                    (20, vec![2], false),
                ],
                want: vec![delivered(&[1], 0), delivered(&[], 10), delivered(&[2], 20)],
            },
            Case {
                name: "(a) max_records reached: at once, fetched when the first was read",
                window: 2_000,
                reads: vec![
                    (0, vec![1, 2], false),
                    (200, vec![3], false),
                    (400, vec![4, 5], false),
                    (600, vec![6], false),
                ],
                want: vec![
                    Did::Kept(Some(ms(2_000))),
                    Did::Kept(None),
                    delivered(&[1, 2, 3, 4, 5], 0),
                    Did::Kept(Some(ms(2_000))),
                ],
            },
            Case {
                name: "(b) a read after the window: handed over with what it brought",
                window: 1_000,
                reads: vec![(0, vec![1], false), (1_000, vec![2], false)],
                want: vec![Did::Kept(Some(ms(1_000))), delivered(&[1, 2], 0)],
            },
            Case {
                name: "(c) the shard's end: at once, with what the ending read brought",
                window: 2_000,
                reads: vec![(0, vec![1], false), (100, vec![2], true)],
                want: vec![Did::Kept(Some(ms(2_000))), delivered(&[1, 2], 0)],
            },
            Case {
                name: "(c) an empty ending read hands the gathered over",
                window: 2_000,
                reads: vec![(0, vec![1], false), (100, vec![], true)],
                want: vec![Did::Kept(Some(ms(2_000))), delivered(&[1], 0)],
            },
            Case {
                name: "an empty read while gathering is no empty call; with nothing \
                       gathered it passes on",
                window: 2_000,
                reads: vec![
                    (0, vec![], false),
                    (10, vec![1], false),
                    (20, vec![], false),
                ],
                want: vec![
                    delivered(&[], 0),
                    Did::Kept(Some(ms(2_000))),
                    Did::Kept(None),
                ],
            },
            Case {
                name: "a record read again is not gathered again, nor after delivery",
                window: 2_000,
                reads: vec![
                    (0, vec![1, 2], false),
                    (10, vec![2, 3], false),
                    (2_000, vec![], false),
                    (2_010, vec![3, 4], false),
                ],
                want: vec![
                    Did::Kept(Some(ms(2_000))),
                    Did::Kept(None),
                    delivered(&[1, 2, 3], 0),
                    Did::Kept(Some(ms(2_000))),
                ],
            },
        ];
        for case in cases {
            let t0 = Instant::now();
            let mut gather = Gather::new(ms(case.window));
            let got: Vec<Did> = case
                .reads
                .into_iter()
                .map(|(at, records, end)| {
                    let fetched_at = t0 + ms(at);
                    did(
                        gather.add(read(&records), fetched_at, end, MAX, fetched_at),
                        t0,
                    )
                })
                .collect();
            assert_eq!(got, case.want, "{}", case.name);
        }
    }

    #[test]
    fn the_timer_hands_over_only_once_the_window_has_passed() {
        let t0 = Instant::now();
        let mut gather = Gather::new(ms(2_000));
        assert!(
            gather.take_due(t0 + ms(5_000)).is_none(),
            "nothing gathered"
        );
        let kept = gather.add(read(&[1, 2]), t0, false, MAX, t0);
        assert_eq!(did(kept, t0), Did::Kept(Some(ms(2_000))));
        assert!(gather.memory() > 0, "held in the budget");
        assert_eq!(gather.room(MAX), 3, "a read asks for what is missing");
        assert_eq!(
            gather.resume_after().map(|s| s.to_string()),
            Some("2".into())
        );
        assert!(
            gather.take_due(t0 + ms(1_999)).is_none(),
            "an earlier window's timer"
        );
        let (records, fetched_at) = gather.take_due(t0 + ms(2_000)).expect("due");
        assert_eq!(
            (seqs(&records), fetched_at),
            (vec!["1".into(), "2".into()], t0)
        );
        assert!(gather.is_empty());
        assert_eq!((gather.memory(), gather.room(MAX)), (0, MAX));
        assert_eq!(gather.resume_after(), None, "nothing gathered");
        assert!(gather.take_due(t0 + ms(9_000)).is_none(), "taken once");
    }

    #[test]
    fn a_read_held_before_it_is_gathered_shortens_the_window() {
        // A fan-out event whose records waited for room in the window: the window runs
        // from when the event arrived.
        let t0 = Instant::now();
        let mut gather = Gather::new(ms(2_000));
        let kept = gather.add(read(&[1]), t0, false, MAX, t0 + ms(500));
        assert_eq!(did(kept, t0), Did::Kept(Some(ms(1_500))));
        let late = gather.add(read(&[2]), t0 + ms(2_500), false, MAX, t0 + ms(2_500));
        assert_eq!(did(late, t0), delivered(&[1, 2], 0));
    }

    #[test]
    fn a_restart_forgets_what_was_gathered_and_read() {
        let t0 = Instant::now();
        let mut gather = Gather::new(ms(2_000));
        gather.add(read(&[5]), t0, false, MAX, t0);
        gather.restart();
        assert!(gather.is_empty() && gather.memory() == 0);
        let again = gather.add(read(&[3]), t0, false, MAX, t0);
        assert_eq!(did(again, t0), Did::Kept(Some(ms(2_000))), "3 is read anew");
    }
}
