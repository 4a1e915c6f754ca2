//! The boards: what the actors share outside their mailboxes, each written by one
//! actor and read by others without a message (a heartbeat must not wait on a reader's
//! mailbox, nor a reader on the keeper's). Each is named for what it holds; none holds
//! an actor's reference. Snapshots for the status endpoint are in `status`, not here.
//!
//! - [`LagBoard`]: readers → keeper (lags, subscriptions, what was delivered).
//! - [`ListingBoard`]: watcher → keeper (the last complete shard listing).
//! - [`RowsBoard`]: keeper → watcher (the last scan's lease rows).
//! - [`StreamSetBoard`]: watcher → supervisor and keeper (the stream set).
//! - [`FleetBoard`]: keeper → status server (the fleet view, and whether it is watched;
//!   the last recommended worker count).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::model::LeaseKey;
use crate::scale::Recommendation;
use crate::status::FleetView;

/// MillisBehindLatest of the shards this worker reads, written by readers as they
/// fetch, and in fan-out mode since when each shard's subscription is open; read by the
/// lease keeper for its heartbeat: the fleet page shows every shard's lag, and which
/// fan-out shards have no subscription, from the table alone. Keyed by lease key (a
/// shard id names a shard only within its stream; for a single stream they are one).
///
/// It also counts what readers deliver per lease key (records, bytes), cumulative, for
/// the per-lease rates the keeper publishes in its heartbeat.
#[derive(Debug, Clone, Default)]
pub(crate) struct LagBoard {
    /// MillisBehindLatest by lease key.
    lags: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Since when each fan-out shard's subscription is open, by lease key.
    subscriptions: Arc<Mutex<BTreeMap<String, Instant>>>,
    /// Cumulative (records, bytes) delivered, by lease key.
    per_lease: Arc<Mutex<BTreeMap<LeaseKey, (u64, u64)>>>,
    /// Records delivered by every reader of the worker: the one count of them (the
    /// keeper's rate in its heartbeat).
    total: Arc<AtomicU64>,
}

impl LagBoard {
    /// A reader delivered `records` totalling `bytes` for the lease `key`.
    pub fn delivered(&self, key: &LeaseKey, records: u64, bytes: u64) {
        self.total.fetch_add(records, Ordering::Relaxed);
        if let Ok(mut map) = self.per_lease.lock() {
            let total = map.entry(key.clone()).or_default();
            total.0 = total.0.saturating_add(records);
            total.1 = total.1.saturating_add(bytes);
        }
    }

    /// Records delivered by every reader of the worker so far.
    pub fn delivered_total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Cumulative (records, bytes) delivered per lease, keeping only the leases `keep`
    /// says (the held ones), so the board does not grow with every lease ever read.
    pub fn delivered_totals(
        &self,
        keep: impl Fn(&LeaseKey) -> bool,
    ) -> BTreeMap<LeaseKey, (u64, u64)> {
        self.per_lease
            .lock()
            .map(|mut map| {
                map.retain(|key, _| keep(key));
                map.clone()
            })
            .unwrap_or_default()
    }

    /// The shard's subscription is open since `since`, or (`None`) it has none.
    pub fn subscribed(&self, key: &LeaseKey, since: Option<Instant>) {
        if let Ok(mut map) = self.subscriptions.lock() {
            match since {
                Some(at) => map.insert(key.as_str().to_owned(), at),
                None => map.remove(key.as_str()),
            };
        }
    }

    /// How long each open subscription has lasted, in ms.
    pub fn subscription_ages(&self) -> BTreeMap<String, u64> {
        self.subscriptions
            .lock()
            .map(|m| {
                m.iter()
                    .map(|(k, at)| (k.clone(), at.elapsed().as_millis() as u64))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn set(&self, key: &LeaseKey, millis: u64) {
        if let Ok(mut map) = self.lags.lock() {
            map.insert(key.as_str().to_owned(), millis);
        }
    }

    pub fn remove(&self, key: &LeaseKey) {
        if let Ok(mut map) = self.lags.lock() {
            map.remove(key.as_str());
        }
        self.subscribed(key, None);
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.lags.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// The shards of the streams' last complete listing, and when it was requested: the
/// lease keeper tells orphan rows (shards no stream read has) from new ones.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ShardListing {
    /// Every listed shard of every stream read, as the key of its lease.
    pub shards: std::collections::BTreeSet<LeaseKey>,
    pub sent: Instant,
}

/// The stream watcher's last listing, read by the lease keeper.
pub(crate) type ListingBoard = Arc<tokio::sync::watch::Sender<Option<Arc<ShardListing>>>>;

/// The lease rows of the keeper's last scan, read by the stream watcher instead of a
/// scan of its own: rows that changed since were made by a worker whose heartbeat says
/// so, which makes the keeper scan again, so the rows are as fresh as the keeper's.
/// The stream set as the watcher last decided it: which streams are read (the
/// supervisor starts readers of them only), and which are former (the keeper finishes
/// their leases, takes none, and deletes their rows after the grace).
pub(crate) type StreamSetBoard =
    Arc<tokio::sync::watch::Sender<Arc<crate::model::StreamSetView<Instant>>>>;

pub(crate) type RowsBoard = Arc<tokio::sync::watch::Sender<Option<Arc<Vec<crate::model::Lease>>>>>;

/// The keeper's latest fleet view and when its scan was taken.
pub(crate) type FleetBoard = Arc<FleetBoardInner>;

/// The fleet view the keeper publishes, and whether anyone asked for it since the
/// keeper's last round. Peers' lags and subscriptions live only in their whole
/// heartbeat rows, which a quiet round does not read (it reads the heartbeat index):
/// a round after `/fleet` was asked reads them whole, so the view someone is watching
/// is never older than a round, and nobody watching costs nothing.
#[derive(Debug)]
pub(crate) struct FleetBoardInner {
    view: tokio::sync::watch::Sender<Option<Arc<(FleetView, Instant)>>>,
    wanted: std::sync::atomic::AtomicBool,
    /// When `/fleet` was last asked.
    #[cfg_attr(not(feature = "status-server"), allow(dead_code))]
    asked: std::sync::Mutex<Option<Instant>>,
    /// The keeper's last recommended worker count, and when its round judged it: laid
    /// over the view when `/fleet` is served (`status::overlay_scaling`).
    scaling: std::sync::Mutex<Option<(Recommendation, Instant)>>,
}

impl Default for FleetBoardInner {
    fn default() -> Self {
        Self {
            view: tokio::sync::watch::channel(None).0,
            wanted: std::sync::atomic::AtomicBool::new(false),
            asked: std::sync::Mutex::new(None),
            scaling: std::sync::Mutex::new(None),
        }
    }
}

impl FleetBoardInner {
    pub(crate) fn send_replace(&self, view: Option<Arc<(FleetView, Instant)>>) {
        self.view.send_replace(view);
    }

    #[cfg_attr(not(feature = "status-server"), allow(dead_code))]
    pub(crate) fn subscribe(
        &self,
    ) -> tokio::sync::watch::Receiver<Option<Arc<(FleetView, Instant)>>> {
        self.view.subscribe()
    }

    /// Somebody asked for the fleet view (`GET /fleet`). Returns whether it was asked
    /// within `within` before, i.e. whether the keeper's rounds have kept it whole.
    #[cfg_attr(not(feature = "status-server"), allow(dead_code))]
    pub(crate) fn want(&self, within: std::time::Duration) -> bool {
        self.wanted
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let now = Instant::now();
        let mut asked = self
            .asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let watched = asked.is_some_and(|at| now.saturating_duration_since(at) <= within);
        *asked = Some(now);
        watched
    }

    /// Whether somebody asked since the last call (the keeper's round).
    pub(crate) fn take_wanted(&self) -> bool {
        self.wanted
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// The recommendation the keeper's round judged `at` (`None`: it judged none, and
    /// the last one stands).
    pub(crate) fn judged(&self, recommendation: Option<Recommendation>, at: Instant) {
        if let Some(recommendation) = recommendation {
            *self
                .scaling
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((recommendation, at));
        }
    }

    /// The keeper's last recommendation and when it was judged; `None` before its first.
    #[cfg_attr(not(feature = "status-server"), allow(dead_code))]
    pub(crate) fn scaling(&self) -> Option<(Recommendation, Instant)> {
        *self
            .scaling
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::{FleetBoardInner, LagBoard};
    use crate::model::LeaseKey;

    /// What readers deliver is counted once: the worker's total (the heartbeat's rate)
    /// and each held lease's (its rates) come from the same call, and letting a lease
    /// go from the per-lease totals never takes it out of the worker's.
    #[test]
    fn one_count_of_what_was_delivered() {
        let board = LagBoard::default();
        let (a, b) = (LeaseKey::new("shardId-0"), LeaseKey::new("shardId-1"));
        board.delivered(&a, 10, 1_000);
        board.clone().delivered(&b, 5, 500);
        assert_eq!(board.delivered_total(), 15);
        let held = board.delivered_totals(|key| *key == a);
        assert_eq!(
            held.into_iter().collect::<Vec<_>>(),
            [(a.clone(), (10, 1_000))]
        );
        assert_eq!(
            board.delivered_total(),
            15,
            "the worker's count keeps what was let go"
        );
        board.set(&a, 42);
        board.subscribed(&a, Some(tokio::time::Instant::now()));
        board.remove(&a);
        assert!(board.snapshot().is_empty());
        assert!(board.subscription_ages().is_empty());
    }
    use std::time::Duration;

    /// The keeper is told once per ask, and an ask counts as watched only within the
    /// window after the previous one (the status server waits for a fresh round
    /// otherwise).
    #[tokio::test(start_paused = true)]
    async fn a_fleet_ask_is_watched_only_soon_after_the_last() {
        let board = FleetBoardInner::default();
        let window = Duration::from_secs(4);
        assert!(!board.take_wanted(), "nobody asked yet");
        assert!(!board.want(window), "a first ask is not watched");
        assert!(board.take_wanted());
        assert!(!board.take_wanted(), "told once per ask");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(board.want(window), "asked 3 s after the last");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!board.want(window), "asked 5 s after the last");
        assert!(board.take_wanted());
    }
}
