//! Whose positions a lease row holds: the one rule that keeps a stream from inheriting
//! another stream's checkpoints.
//!
//! A single-stream application keys its leases by bare shard id, and every stream
//! numbers its shards from `shardId-000000000000`: change `worker.stream`, or delete the
//! stream and create it again under its name, and the old rows fit the new shards key
//! for key. Applied, an old checkpoint skips the new stream's records up to a sequence
//! number of another stream, and an old `SHARD_END` makes a new shard count as finished.
//! So each row carries its source (`flotillaSource`: the stream's name, or a table
//! stream's ARN) and, for a Kinesis stream, when that stream was created
//! (`flotillaSourceCreated`, from DescribeStreamSummary): a recreated stream has the
//! same name and another creation time. A row of another source is never taken and
//! never applied ([`RowOrigin::Foreign`]); the worker refuses to start, or stops, naming
//! the rows and what to do. Rows written by the Java KCL (no source) or by a flotilla
//! before the creation time was recorded are adopted: stamped once with this stream
//! ([`RowOrigin::Adopt`]). A multi-stream application's keys carry the stream's name and
//! creation epoch (`account:stream:epoch:shardId`), so its rows cannot be mistaken.

use super::Lease;

/// The stream a single-stream worker reads, as its rows must name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOrigin {
    /// `flotillaSource`: the stream's name, or a table stream's ARN.
    pub name: String,
    /// The stream's creation time, in seconds since the epoch; `None` where the server
    /// gives none (an emulator) or the name already changes with each new stream (a
    /// table stream's ARN).
    pub created: Option<u64>,
}

/// Whose positions a row holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowOrigin {
    /// This stream's: use it.
    Own,
    /// Written without (all of) its source: by the Java KCL, or by a flotilla before it
    /// recorded the creation time. Taken as this stream's, and stamped with it once.
    Adopt,
    /// Another stream's: never taken, never applied.
    Foreign(Foreign),
}

/// Why a row is another stream's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Foreign {
    /// It names another source.
    OtherStream {
        /// The source the row names.
        source: String,
    },
    /// It names this stream's name, created at another time: a stream of that name that
    /// was deleted (or one created after this one was).
    Recreated {
        /// The creation time the row names, seconds since the epoch.
        row: u64,
        /// This stream's.
        now: u64,
    },
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Foreign::OtherStream { source } => write!(f, "written for stream {source}"),
            Foreign::Recreated { row, now } => write!(
                f,
                "written for a stream of this name created at {} (this one was created at {})",
                time(*row),
                time(*now)
            ),
        }
    }
}

fn time(secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
        .to_string()
}

impl StreamOrigin {
    /// Whose positions `lease` holds.
    pub fn of(&self, lease: &Lease) -> RowOrigin {
        match (&lease.source, lease.source_created, self.created) {
            (None, _, _) => RowOrigin::Adopt,
            (Some(source), _, _) if *source != self.name => {
                RowOrigin::Foreign(Foreign::OtherStream {
                    source: source.clone(),
                })
            }
            (Some(_), Some(row), Some(now)) if row != now => {
                RowOrigin::Foreign(Foreign::Recreated { row, now })
            }
            (Some(_), None, Some(_)) => RowOrigin::Adopt,
            (Some(_), _, _) => RowOrigin::Own,
        }
    }
}

/// The rows of `leases` that are another stream's, each with why, in key order; only
/// the single-stream rows (bare shard-id keys) are judged.
pub fn foreign_rows<'a>(
    origin: &StreamOrigin,
    leases: impl IntoIterator<Item = &'a Lease>,
) -> Vec<(&'a Lease, Foreign)> {
    let mut found: Vec<(&Lease, Foreign)> = leases
        .into_iter()
        .filter(|l| l.key.stream_id().is_none())
        .filter_map(|l| match origin.of(l) {
            RowOrigin::Foreign(why) => Some((l, why)),
            _ => None,
        })
        .collect();
    found.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    found
}

/// What to do about rows of another stream, for the error that refuses them.
pub const FOREIGN_ROWS_ADVICE: &str = "this application's lease table holds another \
     stream's positions, which mean nothing in this one; to start this stream afresh, \
     delete the table (`flotilla destroy --table APPLICATION`) or give this worker a new \
     `worker.application`; to carry the positions over on purpose (the same records under \
     another name), stamp the rows with this stream (`flotilla position import --force \
     --source STREAM` with a token from `flotilla position export`)";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Checkpoint, ShardId};

    fn row(source: Option<&str>, created: Option<u64>) -> Lease {
        let mut lease = Lease::new(
            &ShardId::from_index(0),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        lease.source = source.map(str::to_owned);
        lease.source_created = created;
        lease
    }

    #[test]
    fn whose_positions_a_row_holds() {
        let orders = |created| StreamOrigin {
            name: "orders".into(),
            created,
        };
        let other = |s: &str| RowOrigin::Foreign(Foreign::OtherStream { source: s.into() });
        // (this stream's creation, the row's source, the row's creation, verdict)
        let table = [
            (Some(100), None, None, RowOrigin::Adopt),
            (Some(100), None, Some(100), RowOrigin::Adopt),
            (Some(100), Some("orders"), Some(100), RowOrigin::Own),
            (Some(100), Some("orders"), None, RowOrigin::Adopt),
            (
                Some(100),
                Some("orders"),
                Some(90),
                RowOrigin::Foreign(Foreign::Recreated { row: 90, now: 100 }),
            ),
            (Some(100), Some("payments"), Some(100), other("payments")),
            (Some(100), Some("payments"), None, other("payments")),
            // A server that says no creation time: the name alone decides.
            (None, Some("orders"), Some(90), RowOrigin::Own),
            (None, Some("orders"), None, RowOrigin::Own),
            (None, Some("payments"), None, other("payments")),
            (None, None, None, RowOrigin::Adopt),
        ];
        for (now, source, created, want) in table {
            assert_eq!(
                orders(now).of(&row(source, created)),
                want,
                "stream created {now:?}, row {source:?} created {created:?}"
            );
        }
    }

    #[test]
    fn only_single_stream_rows_are_judged_and_the_reasons_say_which_stream() {
        let origin = StreamOrigin {
            name: "orders".into(),
            created: Some(1_700_000_000),
        };
        let mut multi = row(Some("payments"), None);
        multi.key =
            crate::model::LeaseKey::new("123456789012:payments:1700000000:shardId-000000000000");
        let recreated = row(Some("orders"), Some(1_600_000_000));
        let found = foreign_rows(&origin, [&multi, &recreated]);
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].1.to_string(),
            "written for a stream of this name created at 2020-09-13T12:26:40Z (this one was \
             created at 2023-11-14T22:13:20Z)"
        );
    }
}
