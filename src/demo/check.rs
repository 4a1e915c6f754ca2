//! The processor every worker of the demo runs: each record (or, from a table's stream,
//! each change's item) through one order check shared by all shards of all workers.

use std::sync::{Arc, Mutex, MutexGuard};

use flotilla_actors::backend::TABLE_KEY;
use flotilla_actors::oracle::OrderCheck;
use flotilla_actors::{Batch, Checkpointer, Processor, ProcessorError};

use super::producer::DATA_ATTRIBUTE;

/// The processor of the demo: every record through the shared [`OrderCheck`].
pub(super) struct CheckingProcessor {
    pub(super) check: SharedCheck,
    /// Records are changes of a table's items: the producer's key and data are the
    /// item's `pk` and `data`, read with the typed accessor a Rust user would use.
    pub(super) changes: bool,
}

impl Processor for CheckingProcessor {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let mut check = self.check.lock();
        for record in batch.records() {
            match self.changes.then(|| produced_by_change(record)).flatten() {
                Some((key, data)) => check.observe(&key, data.as_bytes()),
                // Not a change the producer wrote: the check counts it as malformed.
                None => check.observe(&record.partition_key, &record.data),
            };
        }
        Ok(())
    }
}

/// The producer's key and data in a change: the item after it (before it, for a
/// REMOVE).
fn produced_by_change(record: &flotilla_actors::Record) -> Option<(String, String)> {
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
