//! A stream set that changes while a worker runs (`worker.streams`, or a
//! [`crate::stream_set::StreamSet`] source): which streams are read, which left the set
//! and when, which could not be described, and which rows of a stream that left are due
//! for deletion.
//!
//! The rules, in the manner of the Java KCL's `MultiStreamTracker` with its
//! `AutoDetectionAndDeferredDeletionStrategy`:
//!
//! * A list from the source is checked first ([`check_list`]): an empty list, a name
//!   twice or a name that is not a Kinesis stream is refused, and the last good set is
//!   kept. An empty list is refused rather than obeyed: a source that answers "nothing"
//!   is far more often a failed lookup than a wish to stop reading everything, and
//!   obeying it would release every lease and, after the grace, delete every
//!   checkpoint. To stop reading every stream, stop the application.
//! * A stream that joins the list is described (its [`StreamIdentifier`]) and read from
//!   then on; one that cannot be described yet stays *unresolved*, asked again at every
//!   sync.
//! * A stream that leaves the list, or whose listing says it no longer exists, becomes
//!   *former* from that moment: its held leases are finished and released, none is
//!   taken, and once `grace` has passed its rows that nobody alive owns are deleted.
//!   Listed again within the grace (same identifier), it is active again and resumes
//!   from its checkpoints.
//! * Only streams that left this worker's own set are former. A row of a stream this
//!   worker never read stays an orphan (left alone): it may be a stream a peer with a
//!   newer set has just added.
//!
//! Time is a parameter (any ordered time that a `Duration` can be added to).

use std::collections::BTreeMap;
use std::ops::Add;
use std::sync::Arc;
use std::time::Duration;

use super::{
    ConsumedStream, ConsumedStreams, Lease, LeaseKey, Source, StreamArn, StreamIdentifier, WorkerId,
};

/// Why a stream is former.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormerWhy {
    /// It left the list.
    Removed,
    /// Its listing said it does not exist (deleted in Kinesis).
    Deleted(String),
}

/// A stream that left the set, with when.
#[derive(Debug, Clone, PartialEq)]
pub struct FormerStream<T> {
    /// The stream as it was read, with its identifier (the prefix of its rows' keys).
    pub stream: ConsumedStream,
    /// When it left the set; its grace counts from here.
    pub since: T,
    /// Why it left.
    pub why: FormerWhy,
}

impl<T: Copy + Add<Duration, Output = T>> FormerStream<T> {
    /// When its rows may be deleted.
    pub fn deletion_due(&self, grace: Duration) -> T {
        self.since + grace
    }
}

/// A stream of the list that could not be described (it does not exist yet, or the
/// call failed): asked again at every sync.
#[derive(Debug, Clone, PartialEq)]
pub struct UnresolvedStream {
    /// The stream as the list names it (a name or an ARN).
    pub stream: String,
    /// Why it is not read yet: the describe's error, or "not described yet".
    pub error: String,
}

/// What describing a stream that joined the set found: its identifier, and in fan-out
/// mode its own enhanced fan-out consumer (found or registered before any of its
/// readers starts, so they subscribe with it).
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The stream's identifier, the prefix of its lease keys.
    pub id: StreamIdentifier,
    /// The ARN of its enhanced fan-out consumer; `None` when read by polling.
    pub consumer: Option<Arc<str>>,
    /// The stream's ARN, as its description gave it.
    pub arn: Option<String>,
}

impl From<StreamIdentifier> for Resolved {
    /// A stream read by polling, its ARN not known.
    fn from(id: StreamIdentifier) -> Self {
        Self {
            id,
            consumer: None,
            arn: None,
        }
    }
}

/// The stream set as a worker holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSetView<T> {
    /// Streams read now, each with its identifier.
    pub active: ConsumedStreams,
    /// Streams that left the set (or whose listing said they no longer exist), until
    /// forgotten once past their grace with no row left.
    pub former: Vec<FormerStream<T>>,
    /// Streams of the last good list not read yet: not described, or (fan-out mode) their
    /// consumer not found or registered. Asked again at every sync.
    pub unresolved: Vec<UnresolvedStream>,
    /// The last good list (each entry without an identifier).
    pub wanted: Vec<ConsumedStream>,
    /// The source's last failure, cleared by its next good list.
    pub source_error: Option<String>,
}

impl<T: Copy + Ord + Add<Duration, Output = T>> StreamSetView<T> {
    /// A fixed set: what it reads never changes (a single stream, or a list read once).
    pub fn fixed(active: ConsumedStreams) -> Self {
        let wanted = active
            .iter()
            .map(|s| ConsumedStream {
                id: None,
                consumer: None,
                arn: None,
                ..s.clone()
            })
            .collect();
        Self {
            active,
            former: Vec::new(),
            unresolved: Vec::new(),
            wanted,
            source_error: None,
        }
    }

    /// The former stream a lease key is of.
    pub fn former_of(&self, key: &LeaseKey) -> Option<&FormerStream<T>> {
        self.former.iter().find(|f| f.stream.owns(key))
    }

    /// The streams of `wanted` to describe: those not read now.
    pub fn to_resolve<'a>(&self, wanted: &'a [ConsumedStream]) -> Vec<&'a ConsumedStream> {
        wanted
            .iter()
            .filter(|w| !self.active.iter().any(|a| a.stream == w.stream))
            .collect()
    }

    /// The set after a good list: `resolved` has the answer for each stream
    /// [`Self::to_resolve`] named. A stream read now keeps its identifier and consumer
    /// (its start follows the list); a new one is read once described (and, in fan-out
    /// mode, its consumer had), and a former one with the same identifier is active
    /// again; one read now and not listed is former from `now`.
    pub fn next(
        &self,
        wanted: Vec<ConsumedStream>,
        resolved: &BTreeMap<String, Result<Resolved, String>>,
        now: T,
    ) -> Self {
        let mut active = Vec::new();
        let mut unresolved = Vec::new();
        let mut former: Vec<FormerStream<T>> = self.former.clone();
        for w in &wanted {
            if let Some(current) = self.active.iter().find(|a| a.stream == w.stream) {
                active.push(ConsumedStream {
                    id: current.id.clone(),
                    consumer: current.consumer.clone(),
                    arn: current.arn.clone(),
                    ..w.clone()
                });
                continue;
            }
            match resolved.get(&w.stream) {
                Some(Ok(found)) => {
                    former.retain(|f| f.stream.id.as_ref() != Some(&found.id));
                    active.push(ConsumedStream {
                        id: Some(found.id.clone()),
                        consumer: found.consumer.clone(),
                        arn: found.arn.clone(),
                        ..w.clone()
                    });
                }
                Some(Err(error)) => unresolved.push(UnresolvedStream {
                    stream: w.stream.clone(),
                    error: error.clone(),
                }),
                None => unresolved.push(UnresolvedStream {
                    stream: w.stream.clone(),
                    error: "not described yet".to_owned(),
                }),
            }
        }
        for gone in self
            .active
            .iter()
            .filter(|a| !wanted.iter().any(|w| w.stream == a.stream))
        {
            former.push(FormerStream {
                stream: gone.clone(),
                since: now,
                why: FormerWhy::Removed,
            });
        }
        Self {
            active: ConsumedStreams::multi(active),
            former,
            unresolved,
            wanted,
            source_error: None,
        }
    }

    /// The source failed or gave a list [`check_list`] refused: the set stays as it is.
    pub fn source_failed(&self, error: String) -> Self {
        Self {
            source_error: Some(error),
            ..self.clone()
        }
    }

    /// The listing of `stream` said it does not exist: it is former from `now`, and
    /// unresolved while the list still names it (described again at every sync: a
    /// stream created again under the name gets a new identifier, so new keys).
    pub fn gone(&self, stream: &str, error: String, now: T) -> Self {
        let Some(current) = self.active.iter().find(|a| a.stream == stream).cloned() else {
            return self.clone();
        };
        let mut next = self.clone();
        next.active = ConsumedStreams::multi(
            self.active
                .iter()
                .filter(|a| a.stream != stream)
                .cloned()
                .collect(),
        );
        next.former.push(FormerStream {
            stream: current,
            since: now,
            why: FormerWhy::Deleted(error.clone()),
        });
        next.unresolved.push(UnresolvedStream {
            stream: stream.to_owned(),
            error,
        });
        next
    }

    /// Former streams past their grace with no row left are forgotten.
    pub fn forget_deleted(&self, rows: &[Lease], now: T, grace: Duration) -> Self {
        let mut next = self.clone();
        next.former
            .retain(|f| f.deletion_due(grace) > now || rows.iter().any(|l| f.stream.owns(&l.key)));
        next
    }
}

/// Rows of former streams whose grace has passed and that nobody alive owns: each is
/// deleted conditionally on the owner and counter read, so a row taken since (by a
/// worker whose set still has the stream) stays.
pub fn former_rows_due<'a, T: Copy + Ord + Add<Duration, Output = T>>(
    view: &StreamSetView<T>,
    rows: &'a [Lease],
    now: T,
    grace: Duration,
    alive: impl Fn(&WorkerId) -> bool,
) -> Vec<&'a Lease> {
    rows.iter()
        .filter(|l| {
            view.former_of(&l.key)
                .is_some_and(|f| f.deletion_due(grace) <= now)
        })
        .filter(|l| l.owner.as_ref().is_none_or(|o| !alive(o)))
        .collect()
}

/// One entry of a stream set, as `worker.streams` and a source's list both name it: a
/// Kinesis stream's name, or its ARN (the only way to name a stream of another
/// account). Gives the stream's name and the ARN when the entry is one; the error says
/// why the entry names no Kinesis stream. The one rule for the file and the source.
pub fn stream_entry(text: &str) -> Result<(String, Option<StreamArn>), String> {
    let arn = if StreamArn::is_kinesis_arn(text) {
        Some(StreamArn::parse(text).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let name = arn.as_ref().map_or(text, |arn| arn.name.as_str());
    match Source::parse(name)? {
        Source::Kinesis { .. } => Ok((name.to_owned(), arn)),
        Source::Table { .. } | Source::TableStream { .. } => Err(
            "is a DynamoDB table's stream, and a stream set (worker.streams) reads Kinesis \
             streams only: consume a table's stream with worker.stream"
                .to_owned(),
        ),
    }
}

/// Checks a list from a stream-set source: not empty, each a Kinesis stream's name or
/// ARN ([`stream_entry`], as `worker.streams` takes them), no stream named twice (by
/// name: status and `--stream` tell streams apart by name). The error says what is
/// wrong, naming the entry.
pub fn check_list(list: &[ConsumedStream]) -> Result<(), String> {
    if list.is_empty() {
        return Err(
            "the stream list is empty; an empty list is refused (the last good \
                    set is kept): stop the application to stop reading every stream"
                .to_owned(),
        );
    }
    let mut names: Vec<String> = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let (name, _) =
            stream_entry(&s.stream).map_err(|why| format!("stream [{i}] {:?}: {why}", s.stream))?;
        if names.contains(&name) {
            return Err(format!(
                "stream [{i}] {:?} is listed twice (stream {name:?})",
                s.stream
            ));
        }
        names.push(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Checkpoint, ShardId};

    const GRACE: Duration = Duration::from_secs(3600);

    fn t(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn want(name: &str) -> ConsumedStream {
        ConsumedStream {
            stream: name.to_owned(),
            id: None,
            initial: Checkpoint::TrimHorizon,
            initial_timestamp: None,
            consumer: None,
            arn: None,
        }
    }

    fn id(name: &str, epoch: u64) -> StreamIdentifier {
        StreamIdentifier {
            account: "1".into(),
            name: name.into(),
            creation_epoch: epoch,
        }
    }

    fn read(name: &str, epoch: u64) -> ConsumedStream {
        ConsumedStream {
            id: Some(id(name, epoch)),
            ..want(name)
        }
    }

    fn set(active: &[(&str, u64)]) -> StreamSetView<Duration> {
        StreamSetView::fixed(ConsumedStreams::multi(
            active.iter().map(|(n, e)| read(n, *e)).collect(),
        ))
    }

    fn names(view: &StreamSetView<Duration>) -> (Vec<String>, Vec<String>, Vec<String>) {
        (
            view.active.iter().map(|s| s.stream.clone()).collect(),
            view.former
                .iter()
                .map(|f| f.stream.stream.clone())
                .collect(),
            view.unresolved.iter().map(|u| u.stream.clone()).collect(),
        )
    }

    fn row(stream: &StreamIdentifier, shard: u64, owner: Option<&str>) -> Lease {
        let mut lease = Lease::new(
            &ShardId::from_index(shard),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        lease.key = stream.lease_key(&ShardId::from_index(shard));
        lease.owner = owner.map(WorkerId::new);
        lease
    }

    /// Each scenario: the set before, the list, what describing the new names said,
    /// and the set after (active, former, unresolved).
    #[test]
    fn scenarios() {
        type Case<'a> = (
            &'a str,
            &'a [(&'a str, u64)],
            &'a [&'a str],
            &'a [(&'a str, Result<u64, &'a str>)],
            (&'a [&'a str], &'a [&'a str], &'a [&'a str]),
        );
        let cases: &[Case] = &[
            ("unchanged", &[("a", 1)], &["a"], &[], (&["a"], &[], &[])),
            (
                "added",
                &[("a", 1)],
                &["a", "b"],
                &[("b", Ok(2))],
                (&["a", "b"], &[], &[]),
            ),
            (
                "added, not there yet",
                &[("a", 1)],
                &["a", "b"],
                &[("b", Err("not found"))],
                (&["a"], &[], &["b"]),
            ),
            (
                "removed",
                &[("a", 1), ("b", 2)],
                &["a"],
                &[],
                (&["a"], &["b"], &[]),
            ),
            (
                "replaced",
                &[("a", 1)],
                &["b"],
                &[("b", Ok(2))],
                (&["b"], &["a"], &[]),
            ),
        ];
        for (name, before, list, resolved, (active, former, unresolved)) in cases {
            let before = set(before);
            let wanted: Vec<ConsumedStream> = list.iter().map(|n| want(n)).collect();
            let asked: Vec<String> = before
                .to_resolve(&wanted)
                .iter()
                .map(|w| w.stream.clone())
                .collect();
            let resolved: BTreeMap<String, Result<Resolved, String>> = resolved
                .iter()
                .map(|(n, r)| {
                    (
                        (*n).to_owned(),
                        r.map(|e| id(n, e).into()).map_err(|e| e.to_owned()),
                    )
                })
                .collect();
            assert_eq!(
                asked,
                resolved.keys().cloned().collect::<Vec<_>>(),
                "{name}: describes exactly the new names"
            );
            let after = before.next(wanted, &resolved, t(10));
            let strs = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
            assert_eq!(
                names(&after),
                (strs(active), strs(former), strs(unresolved)),
                "{name}"
            );
            assert!(after.former.iter().all(|f| f.since == t(10)), "{name}");
        }
    }

    /// Removed, then listed again within the grace: the same identifier is active
    /// again (its rows resume from their checkpoints) and no longer former. A stream
    /// created again under the name (a new epoch) is another stream: the old one stays
    /// former.
    #[test]
    fn a_stream_listed_again_is_active_again() {
        let removed = set(&[("a", 1), ("b", 2)]).next(vec![want("a")], &BTreeMap::new(), t(10));
        assert_eq!(removed.former.len(), 1);
        let back = removed.next(
            vec![want("a"), want("b")],
            &BTreeMap::from([("b".to_owned(), Ok(id("b", 2).into()))]),
            t(20),
        );
        assert_eq!(names(&back), (vec!["a".into(), "b".into()], vec![], vec![]));
        let recreated = removed.next(
            vec![want("a"), want("b")],
            &BTreeMap::from([("b".to_owned(), Ok(id("b", 3).into()))]),
            t(20),
        );
        assert_eq!(recreated.former[0].stream.id, Some(id("b", 2)));
        assert_eq!(recreated.active.iter().nth(1).unwrap().id, Some(id("b", 3)));
    }

    /// In fan-out mode a stream that joins is read with the consumer found for it, and
    /// a stream read now keeps its own whatever the new list's entry says.
    #[test]
    fn consumers_come_with_the_description_and_stay_with_the_stream() {
        let mut a = read("a", 1);
        a.consumer = Some(Arc::from("consumer-of-a"));
        let before: StreamSetView<Duration> = StreamSetView::fixed(ConsumedStreams::multi(vec![a]));
        assert_eq!(before.wanted[0].consumer, None);
        let found = Resolved {
            id: id("b", 2),
            consumer: Some(Arc::from("consumer-of-b")),
            arn: None,
        };
        let after = before.next(
            vec![want("a"), want("b")],
            &BTreeMap::from([("b".to_owned(), Ok(found))]),
            t(10),
        );
        let consumers: Vec<Option<&str>> =
            after.active.iter().map(|s| s.consumer.as_deref()).collect();
        assert_eq!(
            consumers,
            vec![Some("consumer-of-a"), Some("consumer-of-b")]
        );
    }

    /// A stream whose listing says it is gone is former, and unresolved while listed.
    #[test]
    fn a_deleted_stream_is_former_and_asked_again() {
        let after = set(&[("a", 1), ("b", 2)]).gone("b", "not found".into(), t(5));
        assert_eq!(
            names(&after),
            (vec!["a".into()], vec!["b".into()], vec!["b".into()])
        );
        assert_eq!(after.former[0].why, FormerWhy::Deleted("not found".into()));
        let wanted = vec![want("a"), want("b")];
        assert_eq!(after.to_resolve(&wanted), vec![&wanted[1]]);
    }

    /// Rows are due once the grace has passed, and only those nobody alive owns; the
    /// former stream is forgotten once its rows are gone.
    #[test]
    fn rows_are_due_after_the_grace_when_nobody_alive_owns_them() {
        let view = set(&[("a", 1), ("b", 2)]).next(vec![want("a")], &BTreeMap::new(), t(100));
        let b = id("b", 2);
        let rows = vec![
            row(&b, 0, None),
            row(&b, 1, Some("alive")),
            row(&b, 2, Some("dead")),
            row(&id("a", 1), 0, None),
            row(&id("c", 1), 0, None),
        ];
        let alive = |w: &WorkerId| w.as_str() == "alive";
        let due = |now| -> Vec<LeaseKey> {
            former_rows_due(&view, &rows, now, GRACE, alive)
                .iter()
                .map(|l| l.key.clone())
                .collect()
        };
        assert_eq!(due(t(100) + GRACE - t(1)), Vec::<LeaseKey>::new());
        assert_eq!(
            due(t(100) + GRACE),
            vec![rows[0].key.clone(), rows[2].key.clone()]
        );
        let later = t(100) + GRACE + t(1);
        assert_eq!(view.forget_deleted(&rows, later, GRACE).former.len(), 1);
        let rest = &rows[3..];
        assert!(view.forget_deleted(rest, later, GRACE).former.is_empty());
        assert_eq!(view.forget_deleted(rest, t(150), GRACE).former.len(), 1);
    }

    #[test]
    fn a_bad_list_is_refused_naming_the_entry() {
        assert!(check_list(&[]).unwrap_err().contains("empty"));
        assert!(
            check_list(&[want("a"), want("a")])
                .unwrap_err()
                .contains("[1] \"a\" is listed twice")
        );
        assert!(
            check_list(&[want("my stream")])
                .unwrap_err()
                .contains("[0]")
        );
        assert!(
            check_list(&[want("dynamodb:orders")])
                .unwrap_err()
                .contains("DynamoDB")
        );
        assert_eq!(check_list(&[want("a"), want("b")]), Ok(()));
        // ARNs as `worker.streams` takes them; one name is one stream, whatever account.
        let arn = "arn:aws:kinesis:us-east-1:111111111111:stream/b";
        assert_eq!(check_list(&[want("a"), want(arn)]), Ok(()));
        assert!(
            check_list(&[want("b"), want(arn)])
                .unwrap_err()
                .contains("is listed twice (stream \"b\")")
        );
        assert!(
            check_list(&[want("arn:aws:kinesis:us-east-1:1:stream/")])
                .unwrap_err()
                .contains("the resource is not stream/NAME")
        );
        assert_eq!(
            stream_entry(arn).map(|(name, arn)| (name, arn.map(|a| a.account))),
            Ok(("b".to_owned(), Some("111111111111".to_owned())))
        );
        let failed = set(&[("a", 1)]).source_failed("boom".into());
        assert_eq!(names(&failed).0, vec!["a".to_owned()]);
        assert_eq!(failed.source_error.as_deref(), Some("boom"));
    }
}
