//! The per-key order and loss oracle: one definition of "was every record delivered,
//! and in order for its key", used by `flotilla demo`, the process-fleet tests, the
//! worker tests' probe and the fault simulator, so that they cannot drift apart; and
//! the one producer of the records it reads ([`KeyedProducer`]).
//!
//! Records are `key:number` text, numbered 0, 1, 2, … per key by the producer. A first
//! delivery is in order exactly when it is its key's next number and no later number
//! has been seen; any other first delivery is an order violation (a gap, or a late
//! arrival). A number seen before is a duplicate, whatever came in between:
//! at-least-once delivery replays records after a restart or a lease change, and a
//! replay is not a reordering. Pure: no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};

use crate::backend::PutRecord;

/// What one delivery was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The first delivery of the key's next record.
    InOrder,
    /// A record delivered before.
    Duplicate,
    /// A first delivery, but not of the key's next record: an earlier one is missing
    /// (a gap), or a later one was already seen (a late arrival).
    OutOfOrder,
    /// Data that is not `key:number` for the record's partition key.
    Malformed,
}

/// How many violations are described in [`OrderCheck::examples`].
const EXAMPLES: usize = 5;

/// Per-key order of deliveries, and what was lost against what was produced.
#[derive(Debug, Default)]
pub struct OrderCheck {
    keys: BTreeMap<String, KeyProgress>,
    deliveries: u64,
    distinct: u64,
    duplicates: u64,
    violations: u64,
    malformed: u64,
    examples: Vec<String>,
}

#[derive(Debug, Default)]
struct KeyProgress {
    /// Every number below this has been seen.
    next: u64,
    /// Numbers above `next` seen already; empty unless the order was broken.
    ahead: BTreeSet<u64>,
    /// The last delivery of the key and where it came from, for the examples (kept only
    /// when the caller names where deliveries come from).
    last: Option<(String, u64)>,
}

impl KeyProgress {
    fn seen_below(&self, limit: u64) -> u64 {
        self.next.min(limit) + self.ahead.range(..limit).count() as u64
    }
}

/// `key-17:42` → ("key-17", 42).
pub fn parse_record(data: &[u8]) -> Option<(&str, u64)> {
    let text = std::str::from_utf8(data).ok()?;
    let (key, number) = text.rsplit_once(':')?;
    Some((key, number.parse().ok()?))
}

/// `("key-17", 42)` → `key-17:42`: what [`parse_record`] reads back.
pub fn record_data(key: &str, number: u64) -> bytes::Bytes {
    bytes::Bytes::from(format!("{key}:{number}"))
}

/// Writes per-key sequences for the oracle: record `n` of key `k` is `k:n`, numbered
/// from 0 per key. The one producer of the demo, the process-fleet tests, the worker
/// tests and the simulator. Pure: it makes the records and counts what the caller
/// confirms was put; the caller does the put (and its retries).
///
/// Until [`KeyedProducer::confirm`], the records made carry the same numbers again: a
/// put that failed is made again identically, so a retry is a duplicate in the
/// stream, never a gap.
#[derive(Debug, Clone)]
pub struct KeyedProducer {
    /// For keys named by number: their prefix (more are added as asked for).
    prefix: Option<String>,
    keys: Vec<(String, Option<u128>)>,
    /// Each key's index in `keys`.
    index: std::collections::HashMap<String, usize>,
    /// Per key, the number of its next record (records confirmed put).
    next: Vec<u64>,
    /// Where the next round-robin record starts.
    cursor: usize,
}

impl KeyedProducer {
    /// Keys `{prefix}0`, `{prefix}1`, … routed by the hash of their name.
    pub fn new(prefix: &str, keys: u32) -> Self {
        let mut producer = Self::from_keys([]);
        producer.prefix = Some(prefix.to_owned());
        producer.grow(keys);
        producer
    }

    /// Adds numbered keys up to `keys` (for a producer made by [`KeyedProducer::new`]).
    fn grow(&mut self, keys: u32) {
        let Some(prefix) = &self.prefix else {
            return;
        };
        for k in self.keys.len() as u32..keys {
            let key = format!("{prefix}{k}");
            self.index.insert(key.clone(), self.keys.len());
            self.keys.push((key, None));
            self.next.push(0);
        }
    }

    /// Keys with an explicit hash key each (to place them on chosen shards), or none.
    pub fn from_keys(keys: impl IntoIterator<Item = (String, Option<u128>)>) -> Self {
        let keys: Vec<(String, Option<u128>)> = keys.into_iter().collect();
        Self {
            prefix: None,
            next: vec![0; keys.len()],
            index: keys
                .iter()
                .enumerate()
                .map(|(i, (k, _))| (k.clone(), i))
                .collect(),
            keys,
            cursor: 0,
        }
    }

    fn record(&self, index: usize, number: u64) -> PutRecord {
        let (key, hash) = &self.keys[index];
        PutRecord {
            partition_key: key.clone(),
            explicit_hash_key: *hash,
            data: record_data(key, number),
        }
    }

    /// The next `count` records, one key after another from where the last call
    /// stopped.
    pub fn next_records(&mut self, count: u64) -> Vec<PutRecord> {
        if self.keys.is_empty() {
            return Vec::new();
        }
        let mut pending = self.next.clone();
        (0..count)
            .map(|_| {
                let index = self.cursor % self.keys.len();
                self.cursor += 1;
                let number = pending[index];
                pending[index] += 1;
                self.record(index, number)
            })
            .collect()
    }

    /// `per_key` records of each of the first `keys` keys, in rounds (one record of
    /// each key per round). Numbered keys are added as needed.
    pub fn rounds(&mut self, keys: u32, per_key: u64) -> Vec<PutRecord> {
        self.grow(keys);
        let keys = (keys as usize).min(self.keys.len());
        let mut records = Vec::with_capacity(keys * per_key as usize);
        for round in 0..per_key {
            for index in 0..keys {
                records.push(self.record(index, self.next[index] + round));
            }
        }
        records
    }

    /// Counts records as produced, once their put succeeded.
    pub fn confirm(&mut self, records: &[PutRecord]) {
        for record in records {
            if let Some(&index) = self.index.get(&record.partition_key) {
                self.next[index] += 1;
            }
        }
    }

    /// Records confirmed per key (keys with none left out).
    pub fn produced(&self) -> BTreeMap<String, u64> {
        self.keys
            .iter()
            .zip(&self.next)
            .filter(|(_, n)| **n > 0)
            .map(|((k, _), n)| (k.clone(), *n))
            .collect()
    }

    /// Records confirmed put, all keys together.
    pub fn total(&self) -> u64 {
        self.next.iter().sum()
    }
}

impl OrderCheck {
    /// A delivered record: its partition key and its data (`key:number`).
    pub fn observe(&mut self, partition_key: &str, data: &[u8]) -> Seen {
        self.observe_from(partition_key, data, "")
    }

    /// As [`observe`](Self::observe), naming where the delivery came from (a worker and
    /// shard, say) for the violation examples.
    pub fn observe_from(&mut self, partition_key: &str, data: &[u8], origin: &str) -> Seen {
        match parse_record(data) {
            Some((key, number)) if key == partition_key => {
                self.observe_number_from(key, number, origin)
            }
            _ => {
                self.deliveries += 1;
                self.malformed += 1;
                Seen::Malformed
            }
        }
    }

    /// The `number`-th record of `key` was delivered.
    pub fn observe_number(&mut self, key: &str, number: u64) -> Seen {
        self.observe_number_from(key, number, "")
    }

    /// As [`observe_number`](Self::observe_number), naming where it came from.
    pub fn observe_number_from(&mut self, key: &str, number: u64, origin: &str) -> Seen {
        self.deliveries += 1;
        let progress = match self.keys.get_mut(key) {
            Some(progress) => progress,
            None => self.keys.entry(key.to_owned()).or_default(),
        };
        let seen = if number < progress.next || progress.ahead.contains(&number) {
            Seen::Duplicate
        } else if number == progress.next && progress.ahead.is_empty() {
            progress.next += 1;
            Seen::InOrder
        } else {
            if self.examples.len() < EXAMPLES {
                let last = match &progress.last {
                    Some((from, n)) => format!(", last {key}:{n} from {from}"),
                    None => String::new(),
                };
                let from = if origin.is_empty() {
                    String::new()
                } else {
                    format!(" from {origin}")
                };
                self.examples.push(format!(
                    "{key}:{number}{from} while {} was next{last}",
                    progress.next
                ));
            }
            progress.ahead.insert(number);
            while progress.ahead.remove(&progress.next) {
                progress.next += 1;
            }
            Seen::OutOfOrder
        };
        if !origin.is_empty() {
            progress.last = Some((origin.to_owned(), number));
        }
        match seen {
            Seen::InOrder => self.distinct += 1,
            Seen::Duplicate => self.duplicates += 1,
            Seen::OutOfOrder => {
                self.distinct += 1;
                self.violations += 1;
            }
            Seen::Malformed => {}
        }
        seen
    }

    /// Every delivery, duplicates and malformed ones included.
    pub fn deliveries(&self) -> u64 {
        self.deliveries
    }

    /// Distinct records delivered.
    pub fn processed(&self) -> u64 {
        self.distinct
    }

    /// Deliveries of a record delivered before (at-least-once replays after a restart or a
    /// lease move; not a violation).
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// First deliveries out of their key's order.
    pub fn violations(&self) -> u64 {
        self.violations
    }

    /// Deliveries whose data is not `key:number` for their partition key.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    /// The first few violations, described.
    pub fn examples(&self) -> &[String] {
        &self.examples
    }

    /// Records produced (so many per key, numbered from 0) and never delivered.
    pub fn lost<K: AsRef<str>>(&self, produced: impl IntoIterator<Item = (K, u64)>) -> u64 {
        produced
            .into_iter()
            .map(|(key, count)| {
                let seen = self
                    .keys
                    .get(key.as_ref())
                    .map_or(0, |p| p.seen_below(count));
                count - seen
            })
            .sum()
    }

    /// Distinct records delivered that were never produced (numbers past a key's count,
    /// or keys never produced).
    pub fn unproduced<K: AsRef<str>>(
        &self,
        produced: impl IntoIterator<Item = (K, u64)> + Clone,
    ) -> u64 {
        let total: u64 = produced.clone().into_iter().map(|(_, n)| n).sum();
        (self.distinct + self.lost(produced)).saturating_sub(total)
    }
}

#[cfg(test)]
mod tests {
    use super::Seen::{Duplicate, InOrder, Malformed, OutOfOrder};
    use super::*;

    #[test]
    fn the_producer_writes_what_the_oracle_reads_in_order() {
        let mut producer = KeyedProducer::new("key-", 3);
        let first = producer.next_records(4);
        // Not confirmed: made again with the same numbers (a retry, not a gap).
        assert_eq!(producer.next_records(0).len(), 0);
        let again = KeyedProducer::new("key-", 3).next_records(4);
        assert_eq!(
            first.iter().map(|r| r.data.clone()).collect::<Vec<_>>(),
            again.iter().map(|r| r.data.clone()).collect::<Vec<_>>()
        );
        producer.confirm(&first);
        let second = producer.rounds(3, 2);
        producer.confirm(&second);
        let mut check = OrderCheck::default();
        for record in first.iter().chain(&second) {
            assert_eq!(
                check.observe(&record.partition_key, &record.data),
                Seen::InOrder
            );
        }
        // key-0 twice in the first four (0, 1, 2, 0), then two rounds of each.
        let produced = producer.produced();
        assert_eq!(produced.get("key-0"), Some(&4));
        assert_eq!(produced.get("key-1"), Some(&3));
        assert_eq!(producer.total(), 10);
        assert_eq!(check.lost(produced.iter().map(|(k, n)| (k, *n))), 0);
        // A record confirmed but never delivered is lost.
        let third = producer.rounds(3, 1);
        producer.confirm(&third);
        assert_eq!(
            check.lost(producer.produced().iter().map(|(k, n)| (k, *n))),
            3
        );
    }

    fn observe_all(check: &mut OrderCheck, numbers: &[u64]) -> Vec<Seen> {
        numbers
            .iter()
            .map(|&n| check.observe_number("key-1", n))
            .collect()
    }

    #[test]
    fn in_order_deliveries_pass() {
        let mut check = OrderCheck::default();
        assert_eq!(observe_all(&mut check, &[0, 1, 2]), [InOrder; 3]);
        assert_eq!(check.observe_number("key-2", 0), InOrder);
        assert_eq!(check.lost([("key-1", 3), ("key-2", 1)]), 0);
        assert_eq!((check.processed(), check.violations()), (4, 0));
    }

    #[test]
    fn a_replay_is_a_duplicate_not_a_violation() {
        // A restart from a checkpoint at 1 replays 2 and 3, then goes on.
        let mut check = OrderCheck::default();
        let seen = observe_all(&mut check, &[0, 1, 2, 3, 2, 3, 4]);
        assert_eq!(
            seen,
            [
                InOrder, InOrder, InOrder, InOrder, Duplicate, Duplicate, InOrder
            ]
        );
        assert_eq!((check.processed(), check.duplicates()), (5, 2));
        assert_eq!((check.lost([("key-1", 5)]), check.violations()), (0, 0));
        assert_eq!(check.deliveries(), 7);
    }

    #[test]
    fn a_gap_and_the_late_record_are_violations() {
        // 1 arrives after 2: a child shard read before its parent was finished.
        let mut check = OrderCheck::default();
        let seen = observe_all(&mut check, &[0, 2, 1, 3]);
        assert_eq!(seen, [InOrder, OutOfOrder, OutOfOrder, InOrder]);
        assert_eq!(check.violations(), 2);
        assert_eq!(
            (
                check.processed(),
                check.lost([("key-1", 4)]),
                check.duplicates()
            ),
            (4, 0, 0)
        );
    }

    #[test]
    fn a_replay_of_out_of_order_records_is_still_a_duplicate() {
        let mut check = OrderCheck::default();
        let seen = observe_all(&mut check, &[0, 3, 3, 1, 1]);
        assert_eq!(
            seen,
            [InOrder, OutOfOrder, Duplicate, OutOfOrder, Duplicate]
        );
        assert_eq!(check.lost([("key-1", 4)]), 1, "2 never came");
        assert_eq!((check.processed(), check.duplicates()), (3, 2));
    }

    #[test]
    fn records_never_delivered_are_lost_and_records_never_produced_are_counted() {
        let mut check = OrderCheck::default();
        observe_all(&mut check, &[0, 1]);
        assert_eq!(check.lost([("key-1", 4), ("key-9", 2)]), 4);
        assert_eq!(check.unproduced([("key-1", 4), ("key-9", 2)]), 0);
        assert_eq!(check.observe_number("key-7", 0), InOrder);
        assert_eq!(check.unproduced([("key-1", 4), ("key-9", 2)]), 1);
    }

    #[test]
    fn data_that_is_not_its_keys_record_is_malformed() {
        let mut check = OrderCheck::default();
        assert_eq!(check.observe("key-1", b"key-1:0"), InOrder);
        assert_eq!(check.observe("key-1", b"key-2:1"), Malformed);
        assert_eq!(check.observe("key-1", b"key-1"), Malformed);
        assert_eq!(check.observe("key-1", &[0xff, 0xfe]), Malformed);
        assert_eq!((check.malformed(), check.deliveries()), (3, 4));
    }

    #[test]
    fn a_violation_is_described_with_where_it_and_the_last_one_came_from() {
        let mut check = OrderCheck::default();
        check.observe_from("k", b"k:0", "w1 shard-1");
        check.observe_from("k", b"k:2", "w2 shard-2");
        assert_eq!(
            check.examples(),
            ["k:2 from w2 shard-2 while 1 was next, last k:0 from w1 shard-1"]
        );
    }
}
