//! Reading by polling: a shard iterator from where reading resumes, then GetRecords
//! calls paced by [`pure::next_read`], each asking for as many records as the reader's
//! grant in the worker's memory budget holds at the shard's observed size per record.
//! While records are gathered (`reader.batch_window`), a read asks only for what is
//! missing up to `reader.max_records`, reads go on every poll interval, and a new
//! iterator resumes after the last record gathered.

use std::time::Duration;

use ractor::ActorProcessingErr;
use tokio::time::Instant;
use tracing::debug;

use super::outbox::ReadFacts;
use super::pure;
use super::reading::{Next, Reading};
use crate::backend::{IteratorPosition, ShardIterator, StreamError};
use crate::settings::TrimmedCheckpoint;
use crate::telemetry::{Call, CheckpointTrimmed};

pub(super) struct Polling {
    iterator: Option<ShardIterator>,
    /// The wait between empty reads, growing while the shard stays quiet.
    idle: Duration,
}

impl Polling {
    pub fn new(idle: Duration) -> Self {
        Self {
            iterator: None,
            idle,
        }
    }

    pub fn has_iterator(&self) -> bool {
        self.iterator.is_some()
    }

    /// Gets an iterator where reading resumes.
    pub async fn acquire(&mut self, r: &mut Reading<'_>) -> Result<Next, ActorProcessingErr> {
        let gathered = r.gather.resume_after();
        let position = gathered.map(|last| IteratorPosition::AfterSequence(last.clone()));
        let Some(position) = position.or_else(|| r.outbox.iterator_position()) else {
            return Ok(Next::Nothing);
        };
        let ctx = r.ctx;
        match ctx
            .ports
            .streams
            .get_shard_iterator(&ctx.stream, &ctx.shard, &position)
            .await
        {
            Ok(iterator) => {
                self.iterator = Some(iterator);
                r.health.backoff.reset();
                Ok(Next::Fetch(Duration::ZERO))
            }
            Err(error) if error.is_retryable() => {
                r.count_failure(Call::GetShardIterator, &error);
                Ok(Next::AcquireAfter(r.health.backoff.next_random()))
            }
            // The lease names a shard the stream does not have (an orphan row); the
            // lease keeper lets the row go once a listing confirms it.
            Err(error @ StreamError::NotFound { .. }) => Err(format!(
                "shard {} is not in stream {}: {error}",
                ctx.shard, ctx.stream
            )
            .into()),
            Err(error @ StreamError::Trimmed { .. }) => {
                self.trimmed(r, Call::GetShardIterator, &error).await
            }
            Err(error) => Err(format!("shard {}: GetShardIterator: {error}", ctx.shard).into()),
        }
    }

    /// One GetRecords (the gate before it has passed), and what follows from its answer.
    pub async fn read(&mut self, r: &mut Reading<'_>) -> Result<Next, ActorProcessingErr> {
        let Some(iterator) = self.iterator.clone() else {
            return Ok(Next::Nothing);
        };
        let ctx = r.ctx;
        let reader = &ctx.settings().reader;
        let poll = reader.poll_interval;
        let capabilities = ctx.ports.streams.capabilities();
        let most = r
            .gather
            .room(reader.max_records)
            .min(capabilities.max_records_per_call);
        let granted = r.outbox.budget().grant();
        let Some(limit) = pure::fetch_limit(
            most,
            granted,
            r.outbox.record_memory(),
            r.holds_nothing(true),
        ) else {
            // At its share of the memory budget: its acks (or the next poll, once
            // others' acks free room) wake it.
            r.health.budget_wait = true;
            r.settle(0);
            return Ok(Next::Fetch(poll));
        };
        r.health.budget_wait = false;
        let call_started = Instant::now();
        let answer = ctx.ports.streams.get_records(&iterator, limit).await;
        let took = call_started.elapsed();
        let fetched_at = Instant::now();
        let incoming: u64 = answer
            .as_ref()
            .map_or(0, |b| b.records.iter().map(pure::record_memory).sum());
        let got_records = matches!(&answer, Ok(batch) if !batch.records.is_empty());
        r.outbox
            .read_answered(got_records, incoming, r.gather.memory());
        if answer.is_ok() {
            r.answered();
        }
        match answer {
            // Fenced while the call was out (the worker froze, the keeper found the
            // lease lost): these records are not handed over. The iterator is dropped,
            // so reading resumes after the last record delivered.
            Ok(_) if !r.may_deliver() => {
                self.iterator = None;
                r.settle(0);
                Ok(Next::Fetch(poll))
            }
            Ok(batch) => {
                r.read_ok(
                    batch.records.is_empty(),
                    batch.millis_behind_latest,
                    Some(took),
                );
                let mut read = pure::Read {
                    got_records: !batch.records.is_empty(),
                    caught_up: batch.millis_behind_latest.unwrap_or(0) == 0,
                    full_unmetered: !capabilities.calls_metered
                        && batch.records.len() >= limit as usize,
                };
                let at_end = batch.next_iterator.is_none();
                self.iterator = batch.next_iterator;
                r.deliver(
                    batch.records,
                    ReadFacts {
                        fetched_at,
                        end: at_end.then_some(batch.child_shards.as_deref().unwrap_or(&[])),
                    },
                    0,
                )?;
                if at_end {
                    return Ok(Next::Ended(batch.child_shards));
                }
                // Gathering: on every poll interval, as a shard with a backlog.
                read.got_records |= !r.gather.is_empty();
                let (delay, idle) = pure::next_read(
                    read,
                    poll,
                    self.idle,
                    reader.idle_max,
                    call_started.elapsed(),
                );
                self.idle = idle;
                Ok(Next::Fetch(delay))
            }
            Err(StreamError::IteratorExpired { .. }) => {
                debug!(message = "Shard iterator expired; acquiring a new one.", shard_id = %ctx.shard);
                self.iterator = None;
                Ok(Next::Acquire)
            }
            Err(error) if error.is_retryable() => {
                r.count_failure(Call::GetRecords, &error);
                let delay = r.health.backoff.next_random();
                debug!(message = "GetRecords failed; backing off.", shard_id = %ctx.shard, %error, delay_ms = delay.as_millis() as u64);
                // A fresh iterator from the last record delivered, now and then.
                if pure::renew_iterator(
                    matches!(error, StreamError::Transient { .. }),
                    r.health.failures_in_row(),
                ) {
                    self.iterator = None;
                }
                Ok(Next::Fetch(delay))
            }
            Err(error @ StreamError::Trimmed { .. }) => {
                self.trimmed(r, Call::GetRecords, &error).await
            }
            Err(error) => Err(format!("shard {}: GetRecords: {error}", ctx.shard).into()),
        }
    }

    /// Where reading was to resume is past the stream's retention. The loss is said and
    /// counted either way; then the reader stops (the shard restarts and fails again
    /// until an operator decides) or, where the settings allow it, goes on from the
    /// oldest change kept.
    async fn trimmed(
        &mut self,
        r: &mut Reading<'_>,
        call: Call,
        error: &StreamError,
    ) -> Result<Next, ActorProcessingErr> {
        let ctx = r.ctx;
        let from = match r.outbox.last_delivered() {
            Some(position) => position.to_string(),
            None => ctx.lease.checkpoint.to_string(),
        };
        let oldest_kept = self.oldest_kept(r).await;
        let going_on = ctx.settings().reader.trimmed_checkpoint == TrimmedCheckpoint::TrimHorizon;
        r.out.emit(&CheckpointTrimmed {
            shard: &ctx.key,
            from: &from,
            oldest_kept: &oldest_kept,
            going_on,
        });
        if !going_on {
            return Err(format!(
                "shard {}: {}: {error}; the changes after {from} up to {oldest_kept} are lost. \
                 To go on from the oldest change kept, set reader.trimmed_checkpoint = \
                 \"trim_horizon\" or run `flotilla rewind --to trim-horizon`",
                ctx.shard,
                call.as_str()
            )
            .into());
        }
        // What was gathered is in the lost window too: read again if still kept.
        r.gather.restart();
        r.settle(0);
        r.outbox.restart_at_trim_horizon();
        self.iterator = None;
        Ok(Next::Acquire)
    }

    /// The oldest change the shard keeps, for the message about a trimmed checkpoint:
    /// its sequence number and time, or why it is not known.
    async fn oldest_kept(&self, r: &Reading<'_>) -> String {
        let ctx = r.ctx;
        let streams = &ctx.ports.streams;
        let first = async {
            let iterator = streams
                .get_shard_iterator(&ctx.stream, &ctx.shard, &IteratorPosition::TrimHorizon)
                .await?;
            streams.get_records(&iterator, 1).await
        };
        match first.await {
            Ok(batch) => match batch.records.first() {
                Some(record) => match record.approximate_arrival {
                    Some(at) => format!(
                        "{} (made {})",
                        record.sequence_number,
                        humantime::format_rfc3339_seconds(at)
                    ),
                    None => record.sequence_number.to_string(),
                },
                None => "TRIM_HORIZON (the shard keeps no change now)".to_owned(),
            },
            Err(error) => format!("TRIM_HORIZON (not read: {error})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::testing::{Rig, STREAM};
    use super::*;
    use crate::backend::StreamAdmin;
    use crate::model::ShardId;
    use crate::settings::Settings;

    fn settings() -> Settings {
        let mut settings = Settings::default();
        settings.reader.max_records = 3;
        settings
    }

    /// Reads one step: acquires an iterator first when there is none.
    async fn step(polling: &mut Polling, rig: &mut Rig) -> Next {
        let mut r = rig.reading();
        if !polling.has_iterator() {
            let next = polling.acquire(&mut r).await.unwrap();
            assert!(matches!(next, Next::Fetch(d) if d.is_zero()), "{next:?}");
        }
        polling.read(&mut r).await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn reads_from_the_checkpoint_in_order_and_hands_each_read_over() {
        let mut rig = Rig::new(settings()).await;
        rig.put(5).await;
        let mut polling = Polling::new(Duration::ZERO);
        let next = step(&mut polling, &mut rig).await;
        assert!(matches!(next, Next::Fetch(_)), "{next:?}");
        assert_eq!(rig.out.delivered().len(), 1);
        let held = rig.budget.usage().in_use;
        assert!(held > 0, "the delivered records are held in the budget");
        rig.ack_all();
        step(&mut polling, &mut rig).await;
        assert_eq!(
            rig.out.delivered().len(),
            1,
            "the rest, in a batch of its own"
        );
        assert_eq!(
            rig.ctx.ports.lags.delivered_total(),
            5,
            "both reads counted as delivered"
        );
        rig.ack_all();
        assert!(
            rig.budget.usage().in_use < held,
            "acked records leave the budget"
        );
        // A quiet shard: nothing handed over, the wait grows from the poll interval.
        let Next::Fetch(first) = step(&mut polling, &mut rig).await else {
            panic!("a quiet shard is read again")
        };
        let Next::Fetch(second) = step(&mut polling, &mut rig).await else {
            panic!("a quiet shard is read again")
        };
        assert!(second >= first, "{first:?} then {second:?}");
        assert!(rig.out.delivered().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn batches_are_at_most_max_records_and_keep_the_shards_order() {
        let mut rig = Rig::new(settings()).await;
        rig.put(7).await;
        let mut polling = Polling::new(Duration::ZERO);
        for _ in 0..3 {
            step(&mut polling, &mut rig).await;
        }
        let sizes: Vec<usize> = rig.out.delivered().iter().map(Vec::len).collect();
        assert_eq!(sizes, [3, 3, 1]);
        let all = rig.all_delivered();
        let mut sorted = all.clone();
        sorted.sort_by(|a, b| (a.len(), a).cmp(&(b.len(), b)));
        assert_eq!(all, sorted, "in the shard's order");
    }

    #[tokio::test(start_paused = true)]
    async fn records_read_while_fenced_are_not_handed_over_and_are_read_again() {
        let mut rig = Rig::new(settings()).await;
        rig.put(3).await;
        let mut polling = Polling::new(Duration::ZERO);
        let (key, fence) = (rig.ctx.key.clone(), rig.ctx.fence.clone());
        rig.ctx.ports.fencing.lock().revoke(&key, &fence, "test");
        {
            let mut r = rig.reading();
            polling.acquire(&mut r).await.unwrap();
        }
        let next = step(&mut polling, &mut rig).await;
        assert!(matches!(next, Next::Fetch(_)), "{next:?}");
        assert!(
            rig.out.delivered().is_empty(),
            "nothing handed over while fenced"
        );
        assert!(!polling.has_iterator(), "the iterator is dropped");
        assert_eq!(*rig.out.events.lock().unwrap(), 1, "the pause said once");

        // Held again: the next read starts after the last record delivered (none).
        let now = Instant::now();
        rig.ctx.ports.fencing.lock().forget(&key, &fence);
        rig.ctx.ports.fencing.lock().hold(&key, &fence, now);
        step(&mut polling, &mut rig).await;
        assert_eq!(rig.all_delivered().len(), 3, "nothing skipped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_shard_is_read_to_its_end_and_names_its_children() {
        let mut rig = Rig::new(settings()).await;
        rig.put(2).await;
        let parent = ShardId::from_index(0);
        rig.streams
            .split_shard(STREAM, &parent, 1u128 << 127)
            .await
            .unwrap();
        let mut polling = Polling::new(Duration::ZERO);
        let next = step(&mut polling, &mut rig).await;
        let Next::Ended(Some(children)) = next else {
            panic!("the read reached the end: {next:?}")
        };
        assert_eq!(children.len(), 2, "{children:?}");
        let batches = rig.out.batches.lock().unwrap();
        let last = batches.last().expect("the records and the end handed over");
        assert!(last.at_shard_end);
        assert_eq!(last.child_shards.len(), 2);
        assert_eq!(batches.iter().map(|b| b.records.len()).sum::<usize>(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_iterator_is_acquired_again_from_the_last_record_delivered() {
        let mut rig = Rig::new(settings()).await;
        rig.put(2).await;
        let mut polling = Polling::new(Duration::ZERO);
        step(&mut polling, &mut rig).await;
        tokio::time::advance(Duration::from_secs(301)).await;
        let next = {
            let mut r = rig.reading();
            polling.read(&mut r).await.unwrap()
        };
        assert!(matches!(next, Next::Acquire), "{next:?}");
        assert!(!polling.has_iterator());
        rig.beat();
        rig.put(1).await;
        let next = step(&mut polling, &mut rig).await;
        assert_eq!(
            rig.all_delivered().len(),
            3,
            "nothing again, nothing skipped: {next:?} {:?}",
            rig.all_delivered()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_batching_window_gathers_reads_and_a_new_iterator_reads_none_twice() {
        let mut settings = settings();
        settings.reader.batch_window = Duration::from_secs(2);
        let mut rig = Rig::new(settings).await;
        rig.put(1).await;
        let mut polling = Polling::new(Duration::ZERO);
        let next = step(&mut polling, &mut rig).await;
        assert!(rig.out.delivered().is_empty(), "gathered, not handed over");
        assert_eq!(
            *rig.out.window_timers.lock().unwrap(),
            [Duration::from_secs(2)]
        );
        assert!(
            matches!(next, Next::Fetch(d) if d <= rig.ctx.settings().reader.poll_interval),
            "gathering reads on every poll interval: {next:?}"
        );
        assert!(
            rig.budget.usage().in_use > 0,
            "the gathered records are held"
        );
        // Fenced: the read is not kept and the iterator dropped; the next one starts
        // after the record gathered, not after the last delivered (none).
        let (key, fence) = (rig.ctx.key.clone(), rig.ctx.fence.clone());
        rig.ctx.ports.fencing.lock().revoke(&key, &fence, "test");
        rig.put(1).await;
        step(&mut polling, &mut rig).await;
        assert!(!polling.has_iterator());
        rig.ctx.ports.fencing.lock().forget(&key, &fence);
        rig.ctx
            .ports
            .fencing
            .lock()
            .hold(&key, &fence, Instant::now());
        step(&mut polling, &mut rig).await;
        assert!(
            rig.out.delivered().is_empty(),
            "two gathered, max_records is 3"
        );
        // The window's timer: one batch, each record once.
        tokio::time::advance(Duration::from_secs(2)).await;
        rig.reading().window_due(0).unwrap();
        assert_eq!(
            rig.out.delivered().iter().map(Vec::len).collect::<Vec<_>>(),
            [2]
        );
        assert_eq!(rig.budget.usage().in_use, rig.outbox.ledger().memory());
        // max_records reached: at once, each read asking only for what is missing.
        rig.ack_all();
        rig.put(5).await;
        step(&mut polling, &mut rig).await;
        assert_eq!(
            rig.out.delivered().iter().map(Vec::len).collect::<Vec<_>>(),
            [3]
        );
        rig.ack_all();
        step(&mut polling, &mut rig).await;
        assert!(rig.out.delivered().is_empty(), "the last two are gathered");
        rig.put(2).await;
        step(&mut polling, &mut rig).await;
        assert_eq!(
            rig.out.delivered().iter().map(Vec::len).collect::<Vec<_>>(),
            [3],
            "a read of one, the Limit left"
        );
        assert_eq!(rig.ctx.ports.lags.delivered_total(), 8, "nothing twice");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_stream_fails_the_reader_naming_the_shard() {
        let mut rig = Rig::new(settings()).await;
        rig.streams.delete_stream(STREAM).await.unwrap();
        let mut polling = Polling::new(Duration::ZERO);
        let mut r = rig.reading();
        let error = polling.acquire(&mut r).await.unwrap_err().to_string();
        assert!(
            error.contains("shardId-000000000000") && error.contains(STREAM),
            "{error}"
        );
    }
}
