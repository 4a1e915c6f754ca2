//! Runs one batch through the failure policy ([`super::plan`]): hands its parts to the
//! processor, waits between retries, writes what is discarded to the destination, and
//! tells the shard's reader what happened ([`FailureNews`]). Used by the processor host
//! for every processor it hosts (a [`crate::Processor`], a MultiLang child), so the
//! policy is one piece of code whatever the processor is written in.
//!
//! The host runs batches one at a time, so a batch whose records fail is finished
//! (processed or discarded) before the next one is touched: the records of a key stay in
//! order. A record is discarded only after the destination took it; while the
//! destination cannot be written the batch waits, and the shard says why.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use futures::future::BoxFuture;

use super::destination::{DeadLetters, Envelope};
use super::plan::{Outcome, Plan, Policy, Step};
use crate::backend::Record;
use crate::backoff::Backoff;
use crate::protocol::{AckToken, Batch, Discard, FailureNews, ProcessorError, Reason};
use crate::settings::Settings;

/// How a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ran {
    /// Every record is processed or discarded: the batch may be acked.
    Done,
    /// The shard stopped (a lost lease, a shutdown) before it was: not acked.
    Abandoned,
}

/// The failure policy of one shard, with what it needs to act.
#[derive(Clone)]
pub(crate) struct Failures {
    policy: Policy,
    dead_letters: Option<Arc<dyn DeadLetters>>,
    stream: String,
    worker: String,
    backoff_min: Duration,
    backoff_max: Duration,
    /// How long one processor call may take before it counts as failed.
    call_timeout: Duration,
}

impl std::fmt::Debug for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failures")
            .field("policy", &self.policy)
            .field("destination", &self.dead_letters.as_ref().map(|d| d.name()))
            .finish()
    }
}

/// The processor host, as the driver sees it (a test's fake is one too).
pub(crate) trait Host: Send {
    /// One call of the processor on `part` of the batch.
    fn process<'a>(&'a mut self, part: &'a Batch) -> BoxFuture<'a, Result<(), ProcessorError>>;
    /// Whether the shard may still deliver: waits while it is fenced; `false` once its
    /// lease is lost or it stops.
    fn may_deliver(&self) -> BoxFuture<'_, bool>;
    /// Tells the reader.
    fn tell(&self, news: FailureNews);
    /// Acks records the processor never finished (the discarded ones) in watermark mode,
    /// where the processor acks each record itself; nothing in the other modes, where
    /// the host acks the whole batch once it is done.
    fn ack_records(&self, tokens: Vec<AckToken>);
    /// Waits `delay` before a retry, cut short when the shard stops (a shutdown, a lost
    /// lease): a retry's backoff may be longer than the shutdown's time.
    fn pause(&self, delay: Duration) -> BoxFuture<'_, ()>;
}

impl Failures {
    /// The policy of `[failure]`; `None` when it is off (a failed batch then fails the
    /// shard, as before the policy). `dead_letters` is the opened destination.
    pub(crate) fn new(
        settings: &Settings,
        stream: &str,
        worker: &str,
        dead_letters: Option<Arc<dyn DeadLetters>>,
    ) -> Option<Self> {
        let failure = &settings.failure;
        if !failure.policy_on() {
            return None;
        }
        Some(Self {
            policy: Policy {
                max_retries: failure.max_retries,
                bisect: failure.bisect,
                max_record_age: failure.max_record_age,
                can_discard: dead_letters.is_some(),
            },
            dead_letters,
            stream: stream.to_owned(),
            worker: worker.to_owned(),
            backoff_min: settings.supervision.restart_backoff_min,
            backoff_max: settings.supervision.restart_backoff_max,
            call_timeout: settings.reader.processor_timeout,
        })
    }

    /// Works `batch` through, handing its parts to `host`'s processor.
    pub(crate) async fn run(&self, batch: &Batch, host: &mut dyn Host) -> Ran {
        let records = batch.records();
        let mut plan = Plan::new(records.len(), self.policy);
        // How many failed deliveries each record was in: every delivery of a record that
        // ends discarded failed, so this is how many times it was handed over. Made at
        // the first failure: a batch that goes through allocates nothing for it.
        let mut failed_in: Vec<u32> = Vec::new();
        let mut last_error: Option<String> = None;
        let mut waiting = false;
        let mut backoff = Backoff::new(self.backoff_min, self.backoff_max);
        loop {
            let now = SystemTime::now();
            let too_old = |i: usize| too_old(&records[i], self.policy.max_record_age, now);
            match plan.next(too_old) {
                Step::Done => {
                    if waiting {
                        host.tell(FailureNews::Resumed);
                    }
                    return Ran::Done;
                }
                Step::Deliver {
                    range,
                    retry,
                    refused,
                } => {
                    if refused {
                        waiting = true;
                        host.tell(FailureNews::Waiting {
                            why: format!(
                                "record {} failed {retry} times and failure.destination is \
                                 not set, so it is not discarded (last error: {})",
                                id(&records[range.start]),
                                last_error.as_deref().unwrap_or("none"),
                            ),
                            destination_failed: false,
                        });
                    }
                    // The `retry`th wait of the doubling backoff: one draw per retry
                    // of the same range, from the start again for a range that has
                    // not failed as often.
                    if backoff.attempts() >= retry {
                        backoff.reset();
                    }
                    let mut wait = Duration::ZERO;
                    while backoff.attempts() < retry {
                        wait = backoff.next_random();
                    }
                    if retry > 0 {
                        host.pause(wait).await;
                    }
                    if !host.may_deliver().await {
                        return Ran::Abandoned;
                    }
                    let Err(error) = self.call(host, &batch.part(range.clone())).await else {
                        plan.delivered(Outcome::Processed);
                        continue;
                    };
                    let at = named(records, range.clone(), &error);
                    if failed_in.is_empty() {
                        failed_in = vec![0; records.len()];
                    }
                    for count in &mut failed_in[range.clone()] {
                        *count += 1;
                    }
                    let error = error.to_string();
                    host.tell(FailureNews::Failed {
                        first: id(&records[at.unwrap_or(range.start)]),
                        records: range.len(),
                        retry,
                        error: error.clone(),
                    });
                    last_error = Some(error);
                    plan.delivered(Outcome::Failed { at });
                }
                Step::Discard {
                    range,
                    reason,
                    attempts,
                } => {
                    let Some(dead_letters) = &self.dead_letters else {
                        // The plan discards only with a destination.
                        return Ran::Abandoned;
                    };
                    let error = match reason {
                        Reason::Retries => last_error.clone(),
                        Reason::Age => None,
                    };
                    let envelopes: Vec<Envelope> = range
                        .clone()
                        .map(|i| {
                            let handed = failed_in.get(i).copied().unwrap_or(0);
                            self.envelope(batch, &records[i], reason, handed, &error)
                        })
                        .collect();
                    if !self
                        .write(dead_letters.as_ref(), &envelopes, host, &mut waiting)
                        .await
                    {
                        return Ran::Abandoned;
                    }
                    host.ack_records(range.clone().map(|i| batch.ack_token(i)).collect());
                    host.tell(FailureNews::Discarded(Discard {
                        records: records[range.clone()].iter().map(described).collect(),
                        reason,
                        destination: dead_letters.name(),
                        attempts,
                        error,
                    }));
                    plan.discarded(range);
                }
            }
        }
    }

    /// One processor call on `part`; a call past `reader.processor_timeout` is abandoned
    /// and counts as failed.
    async fn call(&self, host: &mut dyn Host, part: &Batch) -> Result<(), ProcessorError> {
        match tokio::time::timeout(self.call_timeout, host.process(part)).await {
            Ok(result) => result,
            Err(_) => Err(ProcessorError::msg(format!(
                "the processor did not finish within reader.processor_timeout ({})",
                humantime::format_duration(self.call_timeout)
            ))),
        }
    }

    /// Writes `envelopes` to the destination, as many times as it takes, saying why the
    /// batch waits meanwhile (`waiting`; `Resumed` once written). `false` when the shard
    /// stopped first: nothing may be discarded then.
    async fn write(
        &self,
        dead_letters: &dyn DeadLetters,
        envelopes: &[Envelope],
        host: &mut dyn Host,
        waiting: &mut bool,
    ) -> bool {
        let mut backoff = Backoff::new(self.backoff_min, self.backoff_max);
        loop {
            if !host.may_deliver().await {
                return false;
            }
            match dead_letters.write(envelopes).await {
                Ok(()) => break,
                Err(failed) => {
                    *waiting = true;
                    let first = envelopes.first().map_or(String::new(), |e| {
                        format!("{}/{}", e.sequence_number, e.sub_sequence_number)
                    });
                    host.tell(FailureNews::Waiting {
                        why: format!(
                            "the failure destination cannot be written, so {} record(s) \
                             from {first} are not discarded: {failed}",
                            envelopes.len(),
                        ),
                        destination_failed: true,
                    });
                    host.pause(backoff.next_random()).await;
                }
            }
        }
        if std::mem::take(waiting) {
            host.tell(FailureNews::Resumed);
        }
        true
    }

    fn envelope(
        &self,
        batch: &Batch,
        record: &Record,
        reason: Reason,
        attempts: u32,
        error: &Option<String>,
    ) -> Envelope {
        Envelope {
            stream: self.stream.clone(),
            shard: batch.shard_id().to_string(),
            sequence_number: record.sequence_number.to_string(),
            sub_sequence_number: record.sub_sequence_number,
            partition_key: record.partition_key.clone(),
            arrival_ms: record.approximate_arrival.map(millis),
            discarded_ms: millis(SystemTime::now()),
            reason: reason.as_str().to_owned(),
            attempts,
            error: error.clone(),
            worker: self.worker.clone(),
            data: base64::engine::general_purpose::STANDARD.encode(&record.data),
        }
    }
}

/// Whether `record` is older than `max_age` at `now` (a record with no arrival time, or
/// one from a clock ahead of ours, is not).
fn too_old(record: &Record, max_age: Option<Duration>, now: SystemTime) -> bool {
    match (max_age, record.approximate_arrival) {
        (Some(max), Some(arrival)) => now.duration_since(arrival).is_ok_and(|age| age > max),
        _ => false,
    }
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The index, within `range`, of the record `error` names, if it names one there.
fn named(
    records: &[Record],
    range: std::ops::Range<usize>,
    error: &ProcessorError,
) -> Option<usize> {
    let at = error.record()?;
    range.into_iter().find(|&i| {
        let r = &records[i];
        r.sequence_number == at.sequence && r.sub_sequence_number == at.sub_sequence
    })
}

/// A record as `sequence/sub`.
fn id(record: &Record) -> String {
    format!("{}/{}", record.sequence_number, record.sub_sequence_number)
}

fn described(record: &Record) -> String {
    format!("{} (key {})", id(record), record.partition_key)
}
