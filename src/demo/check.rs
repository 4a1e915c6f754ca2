//! The processor every worker of the demo runs: each record (or, from a table's stream,
//! each change's item) through one order check shared by all shards of all workers; a
//! poison record (`--poison`) refused, naming it, so that the failure policy retries it
//! and writes it to the dead-letter file.

use std::sync::{Arc, Mutex, MutexGuard};

use flotilla_actors::backend::TABLE_KEY;
use flotilla_actors::oracle::OrderCheck;
use flotilla_actors::{Batch, Checkpointer, Processor, ProcessorError, Record};

use super::producer::{DATA_ATTRIBUTE, is_poison};

/// The processor of the demo: every record through the shared [`OrderCheck`], up to the
/// first poison record, which it refuses.
pub(super) struct CheckingProcessor {
    pub(super) check: SharedCheck,
    /// Records are changes of a table's items: the producer's key and data are the
    /// item's `pk` and `data`, read with the typed accessor a Rust user would use.
    pub(super) changes: bool,
}

impl Processor for CheckingProcessor {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        check_records(&mut self.check.lock(), batch.records(), self.changes)
    }
}

/// Observes each record in order until a poison one (its key starts with `poison-`),
/// which fails the call naming it: the records before it are processed, the ones after
/// it are not looked at (they come again in the retry, or once it is discarded).
fn check_records(
    check: &mut OrderCheck,
    records: &[Record],
    changes: bool,
) -> Result<(), ProcessorError> {
    for record in records {
        match changes.then(|| produced_by_change(record)).flatten() {
            Some((key, _)) if is_poison(&key) => return Err(refuse(&key, record)),
            Some((key, data)) => check.observe(&key, data.as_bytes()),
            None if is_poison(&record.partition_key) => {
                return Err(refuse(&record.partition_key, record));
            }
            // Not a change the producer wrote: the check counts it as malformed.
            None => check.observe(&record.partition_key, &record.data),
        };
    }
    Ok(())
}

fn refuse(key: &str, record: &Record) -> ProcessorError {
    ProcessorError::msg(format!("the demo refuses {key}")).at_record(record)
}

/// The producer's key and data in a change: the item after it (before it, for a
/// REMOVE).
fn produced_by_change(record: &Record) -> Option<(String, String)> {
    let change = record.dynamodb_change().ok()?;
    let image = change
        .dynamodb
        .new_image
        .as_ref()
        .or(change.dynamodb.old_image.as_ref())?;
    let key = image.get(TABLE_KEY)?.as_s()?;
    let data = image.get(DATA_ATTRIBUTE)?.as_s()?;
    Some((key.to_owned(), data.to_owned()))
}

/// One check shared by the processors of every shard: a key moves between shards when
/// they are split or merged, so its order can only be judged across all of them.
#[derive(Debug, Clone, Default)]
pub(super) struct SharedCheck(Arc<Mutex<OrderCheck>>);

impl SharedCheck {
    pub(super) fn lock(&self) -> MutexGuard<'_, OrderCheck> {
        // A processor that panicked mid-batch leaves counts that are still counts.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use flotilla_actors::model::ExtendedSequenceNumber;
    use flotilla_actors::model::change::{AttributeValue, ChangeBody, ChangeKind, DynamoChange};

    use super::*;

    /// A record of the stream: `key` its partition key, `data` its data.
    fn put(sequence: u64, key: &str, data: &str) -> Record {
        Record {
            sequence_number: sequence.to_string().parse().unwrap(),
            sub_sequence_number: 0,
            partition_key: key.to_owned(),
            explicit_hash_key: None,
            data: bytes::Bytes::from(data.to_owned()),
            approximate_arrival: None,
        }
    }

    /// A record of the table's stream: the insert of the item `pk=key, data=data`, as
    /// the in-memory table stream makes it (the partition key is the item's key as text).
    fn insert(sequence: u64, key: &str, data: &str) -> Record {
        let s = |text: &str| AttributeValue::S(text.to_owned());
        let keys = [(TABLE_KEY.to_owned(), s(key))].into_iter().collect();
        let image = [
            (TABLE_KEY.to_owned(), s(key)),
            (DATA_ATTRIBUTE.to_owned(), s(data)),
        ]
        .into_iter()
        .collect();
        let change = DynamoChange {
            event_id: format!("event-{sequence}"),
            event_name: ChangeKind::Insert,
            event_version: None,
            event_source: None,
            aws_region: None,
            dynamodb: ChangeBody {
                approximate_creation_secs: None,
                keys,
                new_image: Some(image),
                old_image: None,
                sequence_number: sequence.to_string(),
                size_bytes: None,
                stream_view_type: None,
            },
            user_identity: None,
        };
        Record {
            partition_key: change.key_text(),
            data: bytes::Bytes::from(change.to_json()),
            ..put(sequence, "", "")
        }
    }

    /// A batch, as each record's key and data.
    type Given = &'static [(&'static str, &'static str)];

    #[test]
    fn a_poison_record_is_refused_by_name_after_the_records_before_it() {
        // (the records as key and data, how many the check saw, the one refused by its
        // place in the batch)
        let cases: [(Given, u64, Option<usize>); 5] = [
            (&[("key-1", "key-1:0"), ("key-2", "key-2:0")], 2, None),
            (
                &[
                    ("key-1", "key-1:0"),
                    ("key-2", "key-2:0"),
                    ("poison-0", "poison-0:0"),
                    ("key-1", "key-1:1"),
                ],
                2,
                Some(2),
            ),
            (
                &[("poison-3", "poison-3:0"), ("key-1", "key-1:0")],
                0,
                Some(0),
            ),
            (
                &[
                    ("key-1", "key-1:0"),
                    ("poison-1", "poison-1:0"),
                    ("poison-2", "poison-2:0"),
                ],
                1,
                Some(1),
            ),
            // The key decides, not the data.
            (
                &[("key-1", "poison-1:0"), ("poison-1", "key-1:0")],
                1,
                Some(1),
            ),
        ];
        for changes in [false, true] {
            let make = if changes { insert } else { put };
            for (given, observed, refused) in cases {
                let records: Vec<Record> = (10..)
                    .zip(given)
                    .map(|(sequence, (key, data))| make(sequence, key, data))
                    .collect();
                let mut check = OrderCheck::default();
                let result = check_records(&mut check, &records, changes);
                let case = format!("{given:?}, changes: {changes}");
                assert_eq!(check.deliveries(), observed, "{case}");
                match (result, refused) {
                    (Ok(()), None) => {}
                    (Err(error), Some(place)) => {
                        let named = &records[place];
                        let at = ExtendedSequenceNumber::new(named.sequence_number.clone(), 0);
                        assert_eq!(error.record(), Some(&at), "{case}");
                        let key = given[place].0;
                        assert_eq!(
                            error.to_string(),
                            format!("the demo refuses {key}"),
                            "{case}"
                        );
                    }
                    (result, refused) => panic!("{case}: {result:?}, expected {refused:?}"),
                }
            }
        }
    }
}
