//! The rows bookkeeping a scan brings: unreadable rows (logged at ERROR when first
//! seen), orphan rows (shards the stream does not have, judged against the watcher's
//! last listing), rows of former streams (finished here and deleted after the grace),
//! the roster (joined, and repaired with workers a scan found missing from it), the
//! heartbeat rows of workers dead past the retention, and flotilla's legacy rows
//! (deleted once no worker of an older version is alive). What survives this triage is
//! what the round deals with: only a shard the stream is known to have is dealt, taken
//! or counted in anyone's share.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::backend::layout::LegacyRows;
use crate::balance::Observations;
use crate::boards::ShardListing;
use crate::model::item::{MalformedRow, WORKER_KEY_PREFIX};
use crate::model::{Heartbeat, Lease, LeaseKey, StreamSetView, WorkerId};
use crate::protocol::{LeaseMove, SupervisorMsg};
use crate::status::ShardShutdown;

use super::held::Holdings;
use super::legacy::LegacyWatch;
use super::ports::Ports;
use super::pure;

#[derive(Default)]
pub(super) struct Rows {
    /// The unreadable rows of the last scan, as text.
    pub malformed: Vec<String>,
    /// When each lease row was first seen (send time of that scan), for orphans.
    first_seen: BTreeMap<LeaseKey, Instant>,
    /// The orphan rows last reported.
    orphans: BTreeSet<LeaseKey>,
    /// When a fresh shard listing was last asked for.
    listing_asked: Option<Instant>,
    /// The roster as last read.
    roster: Option<BTreeSet<WorkerId>>,
    /// flotilla's own rows left in the lease table by workers of an older version.
    pub legacy: LegacyWatch,
    /// Held leases of former streams being stopped, to be released.
    pub retiring: BTreeSet<LeaseKey>,
    /// A scan is armed for when a former stream's rows turn due.
    former_due: Option<Instant>,
}

/// What a scan's rows are, once sorted.
pub(super) struct Triage {
    /// Unreadable lease rows, by key, with the parse error.
    pub unreadable: BTreeMap<LeaseKey, String>,
    /// Rows for shards the stream does not have, with why.
    pub orphans: BTreeMap<LeaseKey, String>,
    /// The rows the round deals with (`pure::dealt`).
    pub dealt: Vec<Lease>,
}

/// What the rows are judged against: the watcher's last listing, the stream set.
pub(super) struct Judged<'a> {
    pub listing: Option<Arc<ShardListing>>,
    pub set: &'a StreamSetView<Instant>,
    pub stream: &'a str,
}

impl Rows {
    /// A round's read of the roster: joins it if this worker is not in it (first
    /// round, or the row was deleted while it was away; peers see the new mark, no
    /// change of ours to count), and notes the legacy rows read.
    pub async fn roster_read(
        &mut self,
        ports: &Ports<'_>,
        roster: Vec<WorkerId>,
        legacy: &LegacyRows,
        now: Instant,
    ) {
        if !roster.contains(ports.me)
            && let Err(error) = ports
                .table
                .join_roster(std::slice::from_ref(ports.me))
                .await
        {
            warn!(message = "Could not join the roster.", %error);
        }
        self.roster = Some(roster.into_iter().collect());
        self.legacy.observe(legacy, false, now);
    }

    /// A scan's heartbeat and legacy rows: names in the roster the workers whose
    /// heartbeat rows the scan found but the roster does not (a worker of an older
    /// version, a roster lost), so the rounds between scans see them too.
    pub async fn scanned(
        &mut self,
        ports: &Ports<'_>,
        heartbeats: &[Heartbeat],
        legacy: &LegacyRows,
    ) {
        self.repair_roster(ports, heartbeats).await;
        self.legacy.observe(legacy, true, Instant::now());
    }

    async fn repair_roster(&mut self, ports: &Ports<'_>, heartbeats: &[Heartbeat]) {
        let Some(roster) = &self.roster else {
            return;
        };
        let missing: Vec<WorkerId> = heartbeats
            .iter()
            .map(|h| h.worker.clone())
            .filter(|w| !roster.contains(w))
            .collect();
        if missing.is_empty() {
            return;
        }
        match ports.table.join_roster(&missing).await {
            Ok(()) => {
                info!(message = "Workers missing from the roster added to it.", workers = ?missing.iter().map(|w| w.as_str()).collect::<Vec<_>>());
                if let Some(roster) = &mut self.roster {
                    roster.extend(missing);
                }
            }
            Err(error) => warn!(message = "Roster not repaired.", %error),
        }
    }

    /// Sorts a scan's rows (`scan`: the lease rows, the unreadable rows, when it was
    /// sent): unreadable rows noted, orphans found (held
    /// ones stopped and released), former streams' leases finished; returns what the
    /// round deals with. `arm_former` is called with when to send a `FormerDue` (the
    /// next former rows turn due then), the moment that is known.
    pub async fn triage(
        &mut self,
        ports: &Ports<'_>,
        held: &mut Holdings,
        observations: &Observations,
        scan: (&[Lease], &[MalformedRow], Instant),
        judged: &Judged<'_>,
        arm_former: impl FnOnce(Duration),
    ) -> Triage {
        let (leases, malformed, sent) = scan;
        let unreadable = self.note_malformed(malformed);
        // Rows of streams that left the set are not orphans: they are finished here.
        let former: BTreeMap<LeaseKey, String> = leases
            .iter()
            .filter_map(|l| {
                let f = judged.set.former_of(&l.key)?;
                Some((
                    l.key.clone(),
                    format!("former stream {}: left the stream set", f.stream.stream),
                ))
            })
            .collect();
        let (orphans, unlisted) = if former.is_empty() {
            self.find_orphans(ports, leases, sent, judged)
        } else {
            let current: Vec<Lease> = leases
                .iter()
                .filter(|l| !former.contains_key(&l.key))
                .cloned()
                .collect();
            self.find_orphans(ports, &current, sent, judged)
        };
        if let Some(after) = self
            .finish_former(ports, held, observations, leases, &former, judged.set)
            .await
        {
            arm_former(after);
        }
        // Held orphans: stop them here and let the row go; nobody takes them again.
        for lease in leases.iter().filter(|l| orphans.contains_key(&l.key)) {
            if !held.holds(&lease.key, &lease.fence()) {
                continue;
            }
            let why = "its shard is not in the stream";
            if let Some(fence) = held.revoke(&lease.key, why, ports.fencing) {
                error!(message = "Held lease is for a shard the stream does not have; stopping it and releasing the row.", lease_key = %lease.key, stream = %judged.stream);
                ports
                    .out
                    .tell(SupervisorMsg::LeaseLost(lease.key.clone(), fence.clone()));
                let released = ports.table.release(&lease.key, &fence).await;
                held.wrote(&released);
                if released.is_ok() {
                    held.moved_away(ports, &lease.key, LeaseMove::Released, None);
                }
            }
        }
        // The rest of the round sees neither orphans nor unreadable rows, nor rows the
        // last listing does not show yet (unless held): only a shard the stream is
        // known to have is dealt, taken or counted in anyone's share.
        // A former stream's lease is dealt only while held (until it is released): never
        // taken, never counted in anyone's share.
        let mut skipped = orphans.clone();
        skipped.extend(
            former
                .into_iter()
                .filter(|(key, _)| !held.held.contains_key(key)),
        );
        let dealt: Vec<Lease> = pure::dealt(leases, &skipped, &unlisted, &held.held)
            .into_iter()
            .cloned()
            .collect();
        Triage {
            unreadable,
            orphans,
            dealt,
        }
    }

    /// Keeps this scan's unreadable rows (logged at ERROR when first seen: each may be a
    /// shard nobody processes) and returns the lease rows among them by key.
    fn note_malformed(&mut self, malformed: &[MalformedRow]) -> BTreeMap<LeaseKey, String> {
        let texts: Vec<String> = malformed.iter().map(|m| m.to_string()).collect();
        for (bad, text) in malformed.iter().zip(&texts) {
            if !self.malformed.contains(text) {
                error!(
                    message = "Lease table row unreadable; skipped until it is repaired.",
                    row = %text,
                    lease_key = bad.key.as_deref().unwrap_or("(none)"),
                    attribute = %bad.attribute,
                );
            }
        }
        self.malformed = texts;
        malformed
            .iter()
            .filter_map(|m| {
                let key = m.key.as_deref()?;
                (!key.starts_with(WORKER_KEY_PREFIX)).then(|| (LeaseKey::new(key), m.to_string()))
            })
            .collect()
    }

    /// Rows for shards the stream does not have, each with why, judged against the
    /// watcher's last listing (`model::orphans`); and the rows that listing does not
    /// show but that were first seen after it (a child just created, a row a peer made
    /// from a newer listing): those ask for a fresh listing, and wait for it. Before the
    /// first listing, every unfinished row waits.
    fn find_orphans(
        &mut self,
        ports: &Ports<'_>,
        leases: &[Lease],
        sent: Instant,
        judged: &Judged<'_>,
    ) -> (BTreeMap<LeaseKey, String>, BTreeSet<LeaseKey>) {
        for lease in leases {
            self.first_seen.entry(lease.key.clone()).or_insert(sent);
        }
        let present: BTreeSet<&LeaseKey> = leases.iter().map(|l| &l.key).collect();
        self.first_seen.retain(|k, _| present.contains(k));
        let Some(listing) = judged.listing.clone() else {
            let waiting = leases
                .iter()
                .filter(|l| !l.checkpoint.is_shard_end())
                .map(|l| l.key.clone())
                .collect();
            return (BTreeMap::new(), waiting);
        };
        let found = crate::model::orphans(leases, &listing.shards, listing.sent, |l| {
            self.first_seen.get(&l.key).copied()
        });
        if !found.unconfirmed.is_empty()
            && self.listing_asked.is_none_or(|asked| asked < listing.sent)
        {
            self.listing_asked = Some(Instant::now());
            ports.out.tell(SupervisorMsg::ListShardsNow);
        }
        let unlisted = found.unconfirmed.iter().map(|l| l.key.clone()).collect();
        let orphans: BTreeMap<LeaseKey, String> = found
            .confirmed
            .iter()
            .map(|l| {
                (
                    l.key.clone(),
                    format!(
                        "orphan: shard {} is not in stream {}",
                        l.key.shard_id(),
                        judged.stream
                    ),
                )
            })
            .collect();
        let keys: BTreeSet<LeaseKey> = orphans.keys().cloned().collect();
        if keys != self.orphans {
            if !keys.is_empty() {
                // ERROR, not WARN: the listing may be what is wrong (a server paging it
                // badly), and then these are shards nobody processes.
                error!(
                    message = "Lease rows for shards the stream does not have: left alone, not taken, not deleted.",
                    stream = %judged.stream,
                    leases = ?keys.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
                );
            }
            self.orphans = keys;
        }
        (orphans, unlisted)
    }

    /// Finishes the leases of former streams (`model::StreamSetView`): a held one is
    /// stopped gracefully and released (`SupervisorMsg::Retire`, then `Retired`); one
    /// this worker owns by name but does not run (a keeper restarted meanwhile) is
    /// released; past the grace, rows nobody alive owns are deleted, each conditional
    /// on the owner and counter read. Returns when to scan for the next rows turning
    /// due, if a scan is not armed for then already.
    async fn finish_former(
        &mut self,
        ports: &Ports<'_>,
        held: &mut Holdings,
        observations: &Observations,
        rows: &[Lease],
        former: &BTreeMap<LeaseKey, String>,
        set: &StreamSetView<Instant>,
    ) -> Option<Duration> {
        // A lease that left otherwise meanwhile (handed over, lost) is not retiring.
        self.retiring.retain(|key| held.held.contains_key(key));
        if set.former.is_empty() {
            return None;
        }
        for lease in rows.iter().filter(|l| former.contains_key(&l.key)) {
            let fence = lease.fence();
            if held.holds(&lease.key, &fence) {
                if self.retiring.insert(lease.key.clone()) {
                    info!(message = "Lease of a stream that left the set: stopping its reader, then releasing it.", lease_key = %lease.key);
                    ports.out.tell(SupervisorMsg::Retire {
                        key: lease.key.clone(),
                        fence,
                    });
                }
            } else if lease.owner.as_ref() == Some(ports.me) && !held.held.contains_key(&lease.key)
            {
                held.release_unheld(ports, &lease.key, &fence).await;
            }
        }
        let now = Instant::now();
        let grace = ports.settings.worker.former_stream_grace;
        let alive: BTreeSet<WorkerId> = observations
            .alive(now, ports.lease().failover_time)
            .into_iter()
            .collect();
        let due: Vec<Lease> = crate::model::former_rows_due(set, rows, now, grace, |w| {
            w == ports.me || alive.contains(w)
        })
        .into_iter()
        .filter(|l| !held.held.contains_key(&l.key))
        .cloned()
        .collect();
        for lease in due {
            match ports.table.delete(&lease.key, &lease.fence()).await {
                Ok(()) => {
                    info!(message = "Lease row of a former stream deleted after the grace.", event = "lease_deleted", lease_key = %lease.key);
                }
                // Taken or changed since it was read (a worker whose set still has the
                // stream): the next scan decides again.
                Err(error) => {
                    debug!(message = "Former stream's lease row not deleted.", lease_key = %lease.key, %error)
                }
            }
        }
        // The next deletion: a scan then, rather than at the next full scan.
        let next = set
            .former
            .iter()
            .map(|f| f.deletion_due(grace))
            .filter(|due| *due > now)
            .min()?;
        if self
            .former_due
            .is_none_or(|armed| armed > next || armed <= now)
        {
            self.former_due = Some(next);
            return Some(next - now + Duration::from_millis(1));
        }
        None
    }

    /// The `FormerDue` scan arrived.
    pub fn former_due_fired(&mut self) {
        self.former_due = None;
    }

    /// A former stream's lease has stopped and flushed: release it.
    pub async fn retired(
        &mut self,
        ports: &Ports<'_>,
        held: &mut Holdings,
        key: LeaseKey,
        fence: crate::model::Fence,
        outcome: ShardShutdown,
    ) {
        self.retiring.remove(&key);
        if !held.holds(&key, &fence) {
            return;
        }
        held.let_go(&key, ports.fencing);
        let released = ports.table.release(&key, &fence).await;
        held.wrote(&released);
        match released {
            Ok(_) => {
                info!(message = "Lease of a stream that left the set released.", lease_key = %key, checkpoint_flushed = outcome.checkpoint_flushed);
                held.moved_away(ports, &key, LeaseMove::Released, None);
            }
            Err(error) => {
                warn!(message = "Lease of a former stream could not be released.", lease_key = %key, %error)
            }
        }
    }

    /// Deletes the heartbeat rows of workers dead past the retention
    /// (`pure::dead_rows`), each only while its counter has not moved.
    pub async fn remove_dead_rows(
        &self,
        ports: &Ports<'_>,
        observations: &Observations,
        draining: bool,
        now: Instant,
    ) {
        let settings = ports.lease();
        let (failover, retention) = (settings.failover_time, settings.dead_worker_retention);
        let members = observations.members(ports.me, draining, now, failover);
        let peers = observations.peers(now, failover);
        let dead = pure::dead_rows(
            peers.iter().map(|p| {
                (
                    &p.worker,
                    observations.heartbeat_of(&p.worker),
                    Duration::from_millis(p.silent_ms),
                )
            }),
            ports.me,
            &members,
            retention,
        );
        for (worker, counter) in dead {
            match ports.table.remove_dead_heartbeat(&worker, counter).await {
                Ok(true) => info!(
                    message = "Heartbeat row of a worker dead past the retention deleted.",
                    dead_worker = %worker,
                    counter,
                ),
                Ok(false) => {
                    debug!(message = "Dead worker's heartbeat moved again; row kept.", dead_worker = %worker)
                }
                Err(error) => {
                    warn!(message = "Dead worker's heartbeat row not deleted.", dead_worker = %worker, %error)
                }
            }
        }
    }

    /// Deletes the lease table's legacy rows once no worker of an older version is
    /// alive (`legacy::LegacyWatch::retirement`), so that the Java KCL can read the
    /// table. Returns whether it did: a scan then confirms nothing was left behind.
    pub async fn retire_legacy_rows(
        &mut self,
        ports: &Ports<'_>,
        observations: &Observations,
        draining: bool,
        now: Instant,
    ) -> bool {
        let failover = ports.lease().failover_time;
        let members = observations.members(ports.me, draining, now, failover);
        let Some(plan) = self.legacy.retirement(ports.me, &members, now, failover) else {
            return false;
        };
        match ports.table.retire_legacy(&plan).await {
            Ok(true) => {
                info!(
                    message = "No worker of an older flotilla is left: its rows in the lease table (roster and heartbeats) deleted; the table holds lease rows only.",
                    table = %ports.table.table_name(),
                    rows = plan.rows.len(),
                );
                self.legacy.retired();
                true
            }
            Ok(false) => {
                debug!(message = "The legacy roster changed; its rows are kept for now.");
                false
            }
            Err(error) => {
                warn!(message = "Legacy rows not deleted.", %error);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LeaseTable;
    use crate::lease_keeper::ports::testing::{Rig, SECOND};
    use crate::model::{ConsumedStream, ConsumedStreams};

    fn set() -> StreamSetView<Instant> {
        StreamSetView::fixed(ConsumedStreams::single(ConsumedStream {
            stream: "s".into(),
            id: None,
            initial: crate::model::Checkpoint::TrimHorizon,
            initial_timestamp: None,
            consumer: None,
            arn: None,
        }))
    }

    /// Before any listing every unfinished row waits; after one, a row it does not
    /// show that was there before it is an orphan, and a held orphan is stopped
    /// (revoked, the supervisor told) and its row released.
    #[tokio::test(start_paused = true)]
    async fn orphans_are_judged_against_the_listing() {
        let rig = Rig::new("me").await;
        let (r0, r1) = (rig.row(0).await, rig.row(1).await);
        let taken = rig.table.take(&r1.key, &r1.fence(), &rig.me).await.unwrap();
        let mut held = Holdings::default();
        held.held.insert(r1.key.clone(), taken.fence());
        let observations = Observations::with_java_compat(false);
        let mut rows = Rows::default();
        let set = set();
        let leases = [r0.clone(), taken.clone()];
        let unlisted = Judged {
            listing: None,
            set: &set,
            stream: "s",
        };
        let sent = Instant::now();
        let ports = rig.ports();
        let triage = rows
            .triage(
                &ports,
                &mut held,
                &observations,
                (&leases[..], &[][..], sent),
                &unlisted,
                |_| {},
            )
            .await;
        assert_eq!(
            triage.dealt,
            vec![taken.clone()],
            "only the held row is dealt"
        );
        assert!(triage.orphans.is_empty());
        tokio::time::advance(SECOND).await;
        let listed = Judged {
            listing: Some(Arc::new(ShardListing {
                shards: [r0.key.clone()].into(),
                sent: Instant::now(),
            })),
            set: &set,
            stream: "s",
        };
        let triage = rows
            .triage(
                &ports,
                &mut held,
                &observations,
                (&leases[..], &[][..], sent),
                &listed,
                |_| {},
            )
            .await;
        assert_eq!(triage.dealt, vec![r0.clone()]);
        assert_eq!(triage.orphans.keys().collect::<Vec<_>>(), vec![&r1.key]);
        assert!(held.held.is_empty(), "the held orphan is stopped");
        assert_eq!(rig.out.told(), vec!["LeaseLost"]);
        let after = rig.table.get(&r1.key).await.unwrap().unwrap();
        assert_eq!(after.owner, None, "and its row released");
    }

    /// An unreadable row is kept by text for the status, and a lease row among them
    /// is returned by key.
    #[test]
    fn unreadable_rows_are_noted() {
        let mut rows = Rows::default();
        let bad = MalformedRow {
            key: Some("shardId-000000000007".into()),
            attribute: "leaseCounter".into(),
            why: "not a number".into(),
        };
        let unreadable = rows.note_malformed(std::slice::from_ref(&bad));
        assert_eq!(rows.malformed, vec![bad.to_string()]);
        assert_eq!(
            unreadable.keys().collect::<Vec<_>>(),
            vec![&LeaseKey::new("shardId-000000000007")]
        );
    }
}
