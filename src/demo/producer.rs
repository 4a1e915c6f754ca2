//! The demo's producer and where its records go: put to the in-memory stream, or
//! written as items of the in-memory table whose stream the fleet reads.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use flotilla_actors::backend::memory::{MemoryStreams, MemoryTableStreams};
use flotilla_actors::backend::{
    ItemWrite, PutRecord, StreamAdmin as _, StreamError, TABLE_KEY, TableStreamAdmin as _,
};
use flotilla_actors::model::change::{AttributeValue, Item};
use flotilla_actors::oracle::{KeyedProducer, record_data};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

pub(super) const STREAM: &str = "flotilla-demo";

/// The table whose changes `--source dynamodb-streams` reads.
pub(super) const TABLE: &str = "flotilla-demo-orders";

/// The item attribute holding what a Kinesis record's data would (`key-17:42`).
pub(super) const DATA_ATTRIBUTE: &str = "data";

/// Distinct partition keys: enough that every shard, and both halves of a split, get some.
pub(super) const KEYS: u32 = 100;

/// The producer's pace: it tops up to the target rate this often.
const PRODUCER_TICK: Duration = Duration::from_millis(20);

/// What starts the key of a poison record (`--poison`), one the demo's processor refuses.
pub(super) const POISON_PREFIX: &str = "poison-";

/// When the poison records are put, from the start of the producer.
const POISON_AT: Duration = Duration::from_secs(1);

/// The key of the `i`-th poison record: `poison-3`. Its data is `poison-3:0`.
pub(super) fn poison_key(i: u64) -> String {
    format!("{POISON_PREFIX}{i}")
}

/// Whether a record of this key is one the demo's processor refuses.
pub(super) fn is_poison(key: &str) -> bool {
    key.starts_with(POISON_PREFIX)
}

/// How many records of each key were put, and how many poison records besides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Produced {
    /// The records the fleet must process, by key: the poison ones are not among them.
    pub(super) per_key: HashMap<String, u64>,
    /// Poison records put (`--poison`): `poison-0:0`, `poison-1:0`, … one per key.
    pub(super) poisoned: u64,
}

impl Produced {
    /// The records the fleet must process (the poison ones not counted).
    pub fn total(&self) -> u64 {
        self.per_key.values().sum()
    }

    /// The keys of the poison records put, one record each.
    pub(super) fn poison_keys(&self) -> impl Iterator<Item = String> + Clone + '_ {
        (0..self.poisoned).map(poison_key)
    }
}

/// Puts records at a steady rate until told to stop: the library's per-key producer
/// (`oracle::KeyedProducer`), paced; and, [`POISON_AT`] into the run, the poison records
/// (or at the stop, if it comes first).
pub(super) struct Producer {
    rate: u32,
    keys: KeyedProducer,
    total: Arc<AtomicU64>,
    poison: u32,
}

impl Producer {
    pub(super) fn new(rate: u32, poison: u32) -> Self {
        Self {
            rate,
            keys: KeyedProducer::new("key-", KEYS),
            total: Arc::new(AtomicU64::new(0)),
            poison,
        }
    }

    /// Records put so far, for the progress line.
    pub(super) fn counter(&self) -> Arc<AtomicU64> {
        self.total.clone()
    }

    pub(super) async fn run(
        mut self,
        feed: Feed,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<Produced> {
        let started = Instant::now();
        let mut ticks = tokio::time::interval(PRODUCER_TICK);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut put: u64 = 0;
        let mut poisoned: u64 = 0;
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                _ = ticks.tick() => {}
            }
            if *stop.borrow() {
                break;
            }
            if poisoned == 0 && self.poison > 0 && started.elapsed() >= POISON_AT {
                poisoned = put_poison(&feed, self.poison).await?;
            }
            let due = (started.elapsed().as_secs_f64() * f64::from(self.rate)) as u64;
            let count = due.saturating_sub(put);
            if count == 0 {
                continue;
            }
            let records = self.keys.next_records(count);
            feed.put(&records)
                .await
                .with_context(|| format!("cannot put {} records", records.len()))?;
            // Counted only once the put succeeded: a refused record was never produced.
            self.keys.confirm(&records);
            put += count;
            self.total.store(put, Ordering::Relaxed);
        }
        if poisoned == 0 && self.poison > 0 {
            poisoned = put_poison(&feed, self.poison).await?;
        }
        Ok(Produced {
            per_key: self.keys.produced().into_iter().collect(),
            poisoned,
        })
    }
}

/// The poison records: `poison-{i}` with data `poison-{i}:0`, for `i` below `count`.
fn poison_records(count: u32) -> Vec<PutRecord> {
    (0..u64::from(count))
        .map(|i| {
            let key = poison_key(i);
            PutRecord {
                data: record_data(&key, 0),
                partition_key: key,
                explicit_hash_key: None,
            }
        })
        .collect()
}

/// Puts the poison records; returns how many were put.
async fn put_poison(feed: &Feed, count: u32) -> anyhow::Result<u64> {
    let records = poison_records(count);
    feed.put(&records)
        .await
        .with_context(|| format!("cannot put {} poison records", records.len()))?;
    Ok(records.len() as u64)
}

/// Where the producer's records go, and what the fleet reads.
#[derive(Clone)]
pub(super) enum Feed {
    Stream(MemoryStreams),
    Table {
        tables: MemoryTableStreams,
        arn: String,
    },
}

impl Feed {
    /// `worker.stream` for the fleet: the stream, or the table's current stream.
    pub(super) fn worker_stream(&self) -> String {
        match self {
            Feed::Stream(_) => STREAM.to_owned(),
            Feed::Table { .. } => format!("dynamodb:{TABLE}"),
        }
    }

    /// Puts the records, or writes each as an item: `pk` its key, `data` its data.
    pub(super) async fn put(&self, records: &[PutRecord]) -> Result<(), StreamError> {
        match self {
            Feed::Stream(streams) => streams.put_records(STREAM, records).await.map(drop),
            Feed::Table { tables, .. } => {
                let writes: Vec<ItemWrite> = records
                    .iter()
                    .map(|record| ItemWrite::Put {
                        attributes: Item::from([
                            (
                                TABLE_KEY.to_owned(),
                                AttributeValue::S(record.partition_key.clone()),
                            ),
                            (
                                DATA_ATTRIBUTE.to_owned(),
                                AttributeValue::S(
                                    String::from_utf8_lossy(&record.data).into_owned(),
                                ),
                            ),
                        ]),
                    })
                    .collect();
                tables.write_items(TABLE, &writes).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_producer_numbers_each_key_from_zero() {
        let records = |count| {
            let mut producer = KeyedProducer::new("key-", 2);
            // key-1 has five records put already.
            let key_1 = producer
                .rounds(2, 5)
                .into_iter()
                .filter(|r| r.partition_key == "key-1");
            producer.confirm(&key_1.collect::<Vec<_>>());
            producer
                .next_records(count)
                .into_iter()
                .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            records(5),
            ["key-0:0", "key-1:5", "key-0:1", "key-1:6", "key-0:2"]
        );
    }

    #[test]
    fn poison_records_are_one_per_poison_key_and_apart_from_the_rest() {
        let texts: Vec<(String, String)> = poison_records(3)
            .into_iter()
            .map(|r| (r.partition_key, String::from_utf8(r.data.to_vec()).unwrap()))
            .collect();
        assert_eq!(
            texts,
            [
                ("poison-0".to_owned(), "poison-0:0".to_owned()),
                ("poison-1".to_owned(), "poison-1:0".to_owned()),
                ("poison-2".to_owned(), "poison-2:0".to_owned()),
            ]
        );
        for (key, poison) in [
            ("poison-0", true),
            ("poison-999", true),
            ("key-0", false),
            ("key-poison-1", false),
            ("", false),
        ] {
            assert_eq!(is_poison(key), poison, "{key}");
        }
        let produced = Produced {
            per_key: HashMap::from([("key-0".to_owned(), 4)]),
            poisoned: 2,
        };
        assert_eq!(produced.total(), 4);
        assert_eq!(
            produced.poison_keys().collect::<Vec<_>>(),
            ["poison-0", "poison-1"]
        );
    }
}
