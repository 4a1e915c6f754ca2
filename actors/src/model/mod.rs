//! Pure domain types: no I/O, no clock reads. Time, where it matters, is a parameter.
//!
//! * `sequence`: [`SequenceNumber`], decimal and compared numerically.
//! * `shard`: [`ShardId`], [`Shard`], [`HashKeyRange`] and partition-key hashing.
//! * `graph`: [`ShardGraph`], the lineage of splits and merges and read readiness.
//! * `lease`: [`Lease`], [`Checkpoint`], [`Fence`], [`Heartbeat`].
//! * `item`: the lease-table row codec shared by every [`crate::backend::LeaseTable`].
//! * `change`: [`DynamoChange`], a DynamoDB Streams record as a processor reads it.
//! * `filter`: [`RecordFilter`], `processor.filter`: Lambda's filter-criteria patterns
//!   over a record's data (as JSON) and partition key.
//! * `source`: [`Source`], a Kinesis stream or a DynamoDB table's stream.
//! * `stream_id`: [`StreamIdentifier`] (the KCL's multi-stream lease-key prefix),
//!   [`StreamArn`] (a Kinesis stream named by its ARN) and [`ConsumedStreams`], the
//!   streams a worker reads and which one a lease belongs to.
//! * `stream_set`: [`StreamSetView`], a stream set that changes while running: streams
//!   added, removed (former, with when), unresolved, and former rows due for deletion.
//! * `budget`: [`WorkerBudget`], one memory budget for the un-acked records of all a
//!   worker's shards: a fair share each, idle shares lent ([`Pool`] is the rule).
//! * `rates`: [`RateMeter`], each held lease's smoothed records/s and bytes/s, for the
//!   heartbeat.
//! * `watermark`: [`AckWindow`], a shard reader's un-acked records and the checkpoint
//!   [`Watermark`]: the end of the contiguous acked prefix, never past an un-acked record.

mod budget;
pub mod change;
pub mod filter;
mod graph;
pub mod item;
pub mod lanes;
mod lease;
mod lease_plan;
pub mod origin;
mod rates;
mod sequence;
mod shard;
pub mod source;
mod stream_id;
mod stream_set;
mod watermark;

pub use budget::{BudgetSlot, BudgetUse, Pool, SlotId, WorkerBudget};
pub use change::DynamoChange;
pub use filter::{FilterError, PatternFault, RecordFilter};
pub use graph::{CoverageError, ShardGraph};
pub use lease::{
    AT_TIMESTAMP, Checkpoint, ExtendedSequenceNumber, Fence, Heartbeat, LATEST, Lease, LeaseKey,
    LeaseRate, SHARD_END, TRIM_HORIZON, WorkerId, WorkerLoad,
};
pub use lease_plan::{Orphans, orphans, plan_cleanup, plan_new_leases};
pub use rates::RateMeter;
pub use sequence::{MAX_DIGITS, SequenceNumber, SequenceNumberError};
pub use shard::{
    HashKeyError, HashKeyRange, SequenceRange, Shard, ShardId, parse_hash_key, partition_key_hash,
};
pub use source::{Source, SourceKind};
pub use stream_id::{ConsumedStream, ConsumedStreams, StreamArn, StreamIdError, StreamIdentifier};
pub use stream_set::{
    FormerStream, FormerWhy, Resolved, StreamSetView, UnresolvedStream, check_list,
    former_rows_due, stream_entry,
};
pub use watermark::{AckError, AckWindow, BatchId, Watermark};
