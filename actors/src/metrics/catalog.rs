//! Every metric a worker measures, declared once. One row per metric, in the `catalog!`
//! table below, gives all that the rest of the crate asks about it: its name (the
//! variant's, on CloudWatch and, snake-cased, in Prometheus), its `# HELP`, its
//! CloudWatch unit, its [`Kind`] and, for a timing, its histogram's buckets. The macro
//! makes the enum and the table from the same rows, so a variant without a row, or a row
//! without its variant, does not compile, and no fact about a metric is left to a
//! `match` with a fallback arm somewhere else.
//!
//! Adding a metric is adding a row (and its line in docs/status-and-metrics.md's table
//! of Prometheus families, which `prometheus::tests::the_guide_lists_every_family`
//! checks). Renaming a variant renames the metric everywhere it is published: dashboards
//! and alarms name it.

use crate::backend::{CallFailure, Classified, Unit};

/// How a metric's running figure for the status snapshot is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Samples are amounts: the snapshot shows their sum since start.
    Counter,
    /// Samples are readings of a level: the snapshot shows the latest one, since a sum
    /// of lags or of lease counts means nothing.
    Gauge,
}

/// A processor's batch or a DynamoDB / Kinesis call: a millisecond to ten seconds.
const CALL_MS: &[f64] = &[
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1_000.0, 2_500.0, 5_000.0, 10_000.0,
];

/// A record's wait from its put: tens of milliseconds at the tip (a poll interval), up to
/// the stream's retention in a backlog (a day and more).
const WAIT_MS: &[f64] = &[
    10.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1_000.0,
    2_500.0,
    5_000.0,
    10_000.0,
    30_000.0,
    60_000.0,
    300_000.0,
    900_000.0,
    3_600_000.0,
    21_600_000.0,
    86_400_000.0,
];

/// What one row declares: every fact about a metric that is not its variant.
#[derive(Debug, Clone, Copy)]
struct Row {
    name: &'static str,
    help: &'static str,
    unit: Unit,
    kind: Kind,
    buckets: Option<&'static [f64]>,
}

/// Makes [`Metric`], [`Metric::ALL`], [`METRIC_COUNT`] and the rows' table from one list.
/// A row is `Variant { kind, unit, buckets, help }`, every field required, so nothing
/// about a metric defaults. Its help is the first line of the variant's doc; the `///`
/// lines above a row follow it and say what the help has no room for.
macro_rules! catalog {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident {
            kind: $kind:ident,
            unit: $unit:ident,
            buckets: $buckets:expr,
            help: $help:literal $(,)?
        }
    ),* $(,)?) => {
        /// Everything the actors of a worker measure. The set is closed so the
        /// aggregator can keep one fixed-size slot per metric and never hash a name on
        /// the hot path.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Metric {
            $(
                #[doc = $help]
                #[doc = ""]
                $(#[doc = $doc])*
                $variant,
            )*
        }

        /// How many metrics there are: the length of the aggregator's slot arrays.
        pub(super) const METRIC_COUNT: usize = [$(stringify!($variant)),*].len();

        impl Metric {
            /// In declaration order, which is also the order datums are published in.
            pub const ALL: [Metric; METRIC_COUNT] = [$(Metric::$variant),*];
        }

        /// The rows, in [`Metric::ALL`] order: `ROWS[metric.index()]` is `metric`'s.
        static ROWS: [Row; METRIC_COUNT] = [$(
            Row {
                name: stringify!($variant),
                help: $help,
                unit: Unit::$unit,
                kind: Kind::$kind,
                buckets: $buckets,
            }
        ),*];
    };
}

catalog! {
    RecordsProcessed {
        kind: Counter, unit: Count, buckets: None,
        help: "Records the processor has finished (acked).",
    },
    BytesProcessed {
        kind: Counter, unit: Bytes, buckets: None,
        help: "Bytes of the records the processor has finished.",
    },
    /// A level: the snapshot's worker figure is the worst lag across shards.
    MillisBehindLatest {
        kind: Gauge, unit: Milliseconds, buckets: None,
        help: "How far behind the stream's tip a shard's last read was, in milliseconds.",
    },
    ProcessingTime {
        kind: Counter, unit: Milliseconds, buckets: Some(CALL_MS),
        help: "Time batches took from their delivery to the processor to their ack, in \
               milliseconds (a sample per batch).",
    },
    LeasesHeld {
        kind: Gauge, unit: Count, buckets: None,
        help: "Leases this worker holds.",
    },
    LeasesTaken {
        kind: Counter, unit: Count, buckets: None,
        help: "Leases this worker has taken, for any reason.",
    },
    /// Taken by another worker, a write under them refused, or their row no longer
    /// readable.
    LeasesLost {
        kind: Counter, unit: Count, buckets: None,
        help: "Leases this worker held and lost to another owner.",
    },
    CheckpointWrites {
        kind: Counter, unit: Count, buckets: None,
        help: "Checkpoints written to the lease table.",
    },
    /// Refused when another owner or epoch holds the lease.
    CheckpointFailures {
        kind: Counter, unit: Count, buckets: None,
        help: "Checkpoint writes that failed or were refused.",
    },
    Throttles {
        kind: Counter, unit: Count, buckets: None,
        help: "AWS calls refused as throttled.",
    },
    ApiErrors {
        kind: Counter, unit: Count, buckets: None,
        help: "AWS calls that failed other than by throttling.",
    },
    /// A shard's reader and processor, or the worker's core.
    ActorRestarts {
        kind: Counter, unit: Count, buckets: None,
        help: "Actors restarted by their supervisor after a failure.",
    },
    /// This and the four below count lease movements by reason: taken from a dead
    /// owner, handed over to this worker at its request, handed over by it, released by
    /// it, finished by it at SHARD_END.
    LeasesExpired {
        kind: Counter, unit: Count, buckets: None,
        help: "Leases taken from an owner whose heartbeat had expired (failovers).",
    },
    LeasesStolen {
        kind: Counter, unit: Count, buckets: None,
        help: "Leases handed over to this worker at its request.",
    },
    /// Handed over to a worker that asked for them.
    LeasesHandedOff {
        kind: Counter, unit: Count, buckets: None,
        help: "Leases this worker handed over to another.",
    },
    /// For any worker to take: at shutdown, giving up on a failing shard, a former
    /// stream's, …
    LeasesReleased {
        kind: Counter, unit: Count, buckets: None,
        help: "Leases this worker released.",
    },
    LeasesEnded {
        kind: Counter, unit: Count, buckets: None,
        help: "Leases this worker finished at the shard's end.",
    },
    HeartbeatFailures {
        kind: Gauge, unit: Count, buckets: None,
        help: "Heartbeat writes failed in a row (0 while written).",
    },
    /// Heartbeat unconfirmed, awaiting a fresh read after a gap, revoked.
    ShardsFenced {
        kind: Gauge, unit: Count, buckets: None,
        help: "Held shards not delivering now (self-fencing).",
    },
    /// Its processor waits past its stall time (a MultiLang child that does not
    /// answer), or it cannot be read (a subscription refused, reads failing in a row).
    /// Per shard, 1 while it is and 0 once it is not; the worker's figure is the
    /// highest, 1 while any is.
    ShardsStalled {
        kind: Gauge, unit: Count, buckets: None,
        help: "Held shards stalled: a processor that does not answer, or a shard that \
               cannot be read (1 per shard while it is).",
    },
    /// `[failure]`: each is a delivery the policy retries (or, once spent, discards).
    DeliveryFailures {
        kind: Counter, unit: Count, buckets: None,
        help: "Batches (or parts of one) the processor failed, under failure.* settings.",
    },
    /// Written to `failure.destination` first; one ERROR names each.
    RecordsDiscardedRetries {
        kind: Counter, unit: Count, buckets: None,
        help: "Records discarded to the failure destination after failure.max_retries.",
    },
    /// A reader further behind than the limit discards what it reads.
    RecordsDiscardedAge {
        kind: Counter, unit: Count, buckets: None,
        help: "Records discarded to the failure destination as older than \
               failure.max_record_age.",
    },
    /// Nothing is discarded while it fails: the shard waits, stalled.
    DestinationFailures {
        kind: Counter, unit: Count, buckets: None,
        help: "Writes to the failure destination that failed.",
    },
    /// Each is a shard nobody processes.
    LeasesUnreadable {
        kind: Gauge, unit: Count, buckets: None,
        help: "Lease rows of the table that cannot be read.",
    },
    /// Left alone, not taken.
    LeasesOrphaned {
        kind: Gauge, unit: Count, buckets: None,
        help: "Lease rows for shards the stream does not have.",
    },
    /// Per shard: about one per 5 minutes when all is well; more means subscriptions
    /// drop or are refused (see `ApiErrors` and `Throttles`, which count the
    /// SubscribeToShard failures).
    Subscriptions {
        kind: Counter, unit: Count, buckets: None,
        help: "Enhanced fan-out subscriptions made.",
    },
    /// A DynamoDB table's stream keeps 24 hours: each one is changes lost, whatever
    /// `reader.trimmed_checkpoint` does.
    TrimmedCheckpoints {
        kind: Counter, unit: Count, buckets: None,
        help: "Checkpoints found past the stream's retention.",
    },
    /// The budget is `reader.worker_budget_bytes`; the interval's datum is its peak.
    BudgetBytesInUse {
        kind: Gauge, unit: Bytes, buckets: None,
        help: "Bytes of the worker's memory budget held by un-acked records and reads.",
    },
    /// Failed or refused; the last good set is kept.
    StreamSetErrors {
        kind: Counter, unit: Count, buckets: None,
        help: "Answers of the stream-set source that failed.",
    },
    /// Streams deleted count too.
    StreamsFormer {
        kind: Gauge, unit: Count, buckets: None,
        help: "Streams that left the set whose rows are not deleted yet.",
    },
    /// They are asked again at every sync.
    StreamsUnresolved {
        kind: Gauge, unit: Count, buckets: None,
        help: "Streams of the set that could not be described.",
    },
    /// Not sampled under enhanced fan-out, which pushes records.
    GetRecordsTime {
        kind: Counter, unit: Milliseconds, buckets: Some(CALL_MS),
        help: "Time GetRecords calls took, in milliseconds (a sample per call; polling \
               only).",
    },
    /// A conditional update of the lease row.
    CheckpointWriteTime {
        kind: Counter, unit: Milliseconds, buckets: Some(CALL_MS),
        help: "Time checkpoint writes took, in milliseconds (a sample per write).",
    },
    /// The arrival is the record's approximate arrival timestamp, set at its put.
    PutToDeliveryTime {
        kind: Counter, unit: Milliseconds, buckets: Some(WAIT_MS),
        help: "Time from a batch's first record's arrival in the stream to the batch's \
               delivery to the processor, in milliseconds (a sample per batch).",
    },
    /// The write cost of running beside a Java KCL fleet.
    LeaseRenewals {
        kind: Counter, unit: Count, buckets: None,
        help: "Lease renewals written under lease.java_compat (one per held lease every \
               failover_time / 3).",
    },
    /// Per shard. `processor.filter` (Lambda's filter criteria): such records are
    /// neither handed to the processor nor discarded; the checkpoint moves past them
    /// as past processed ones (so RecordsProcessed counts them too).
    RecordsFiltered {
        kind: Counter, unit: Count, buckets: None,
        help: "Records checkpointed past without a call because they matched no \
               processor.filter pattern.",
    },
    /// This and the five below: the fleet's recommended worker count (`crate::scale`)
    /// and its inputs, the same on every worker each lease-keeper round (an autoscaler
    /// takes the maximum over the workers). Worker-wide: no shard.
    RecommendedWorkers {
        kind: Gauge, unit: Count, buckets: None,
        help: "Workers the stream needs, by the scaling.* targets: at least 1, at most \
               the processable leases.",
    },
    FleetWorkers {
        kind: Gauge, unit: Count, buckets: None,
        help: "Live workers sharing the leases (not draining), as the heartbeats say.",
    },
    FleetLeases {
        kind: Gauge, unit: Count, buckets: None,
        help: "Leases that can be processed now (not finished, parents finished).",
    },
    FleetRecordsPerSecond {
        kind: Gauge, unit: CountPerSecond, buckets: None,
        help: "Records per second over every live worker, the highest of the last lease.failover_time.",
    },
    /// Sampled only while every live worker publishes bytes (`lease.balance =
    /// "throughput"`).
    FleetBytesPerSecond {
        kind: Gauge, unit: BytesPerSecond, buckets: None,
        help: "Bytes per second over every live worker, the highest of the last lease.failover_time.",
    },
    FleetLargestLag {
        kind: Gauge, unit: Milliseconds, buckets: None,
        help: "The largest MillisBehindLatest over every live worker's shards, in \
               milliseconds.",
    },
}

impl Metric {
    /// `Throttles` or `ApiErrors` for a failed call, by [`CallFailure`]'s one rule.
    pub fn failed_call(error: &impl Classified) -> Metric {
        match error.call_failure() {
            CallFailure::Throttled => Metric::Throttles,
            CallFailure::Failed => Metric::ApiErrors,
        }
    }

    fn row(self) -> &'static Row {
        &ROWS[self.index()]
    }

    /// The CloudWatch metric name.
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// What the metric means, in a sentence: the `# HELP` of its Prometheus families.
    pub fn help(self) -> &'static str {
        self.row().help
    }

    /// The upper bounds of the buckets of the metric's distribution (in its unit), for
    /// the timings; `None` for a metric that is an amount or a level.
    pub fn buckets(self) -> Option<&'static [f64]> {
        self.row().buckets
    }

    /// The CloudWatch unit of its datums: bytes, milliseconds, or a count.
    pub fn unit(self) -> Unit {
        self.row().unit
    }

    /// Whether the status snapshot sums its samples or shows the latest one.
    pub fn kind(self) -> Kind {
        self.row().kind
    }

    /// Its slot in the aggregator's arrays, and its row: its place in [`Metric::ALL`].
    pub(super) fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_a_distinct_name_a_unit_and_a_slot() {
        let names: std::collections::BTreeSet<_> = Metric::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(names.len(), METRIC_COUNT);
        for (i, metric) in Metric::ALL.iter().enumerate() {
            assert_eq!(metric.index(), i, "{metric:?}");
        }
        assert_eq!(Metric::BytesProcessed.unit(), Unit::Bytes);
        assert_eq!(Metric::ProcessingTime.unit(), Unit::Milliseconds);
        assert_eq!(Metric::LeasesHeld.kind(), Kind::Gauge);
        assert_eq!(Metric::MillisBehindLatest.kind(), Kind::Gauge);
        assert_eq!(Metric::LeasesTaken.kind(), Kind::Counter);
    }

    /// The rule the published names rest on: a metric is named as its variant is, so
    /// renaming one is renaming a published metric (the guide's table test then fails).
    #[test]
    fn every_metric_is_named_as_its_variant() {
        for metric in Metric::ALL {
            assert_eq!(metric.name(), format!("{metric:?}"));
        }
    }

    /// A help is one sentence for `# HELP`: not empty, ending in a full stop, and no
    /// run of spaces left by a line continuation in the table.
    #[test]
    fn every_help_is_a_sentence() {
        for metric in Metric::ALL {
            let help = metric.help();
            assert!(help.ends_with('.'), "{metric:?}: {help}");
            assert!(!help.contains("  "), "{metric:?}: {help}");
            assert!(!help.contains('\n'), "{metric:?}: {help}");
        }
    }

    /// `/metrics` names a timing's histogram `…_milliseconds` and the OTLP push gives it
    /// the unit `ms`, whatever the row says: a timing in another unit would be served
    /// under a false name. Its bounds must rise, as Prometheus's `le` buckets do.
    #[test]
    fn timings_are_in_milliseconds_with_rising_bounds() {
        for metric in Metric::ALL {
            let Some(bounds) = metric.buckets() else {
                continue;
            };
            assert_eq!(metric.unit(), Unit::Milliseconds, "{metric:?}");
            assert!(!bounds.is_empty(), "{metric:?}");
            assert!(
                bounds.iter().all(|b| b.is_finite() && *b > 0.0),
                "{metric:?}"
            );
            assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{metric:?}");
        }
    }
}
