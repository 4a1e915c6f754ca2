//! What the run did and whether it passed: the summary line (the last line on stdout)
//! and the failures that make the demo exit non-zero.

use std::fmt;

use flotilla_actors::ShutdownReport;
use flotilla_actors::oracle::OrderCheck;
use flotilla_actors::settings::Destination;

use super::dead_letters::DeadLetters;
use super::producer::Produced;

/// How many of the keys wrongly discarded a failure names.
const NAMED_KEYS: usize = 5;

/// What the summary reports about the fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FleetFigures {
    pub workers: u32,
    pub crashes: u32,
    /// Leases that changed owner: taken after their owner died, handed off, or taken
    /// after a release, summed over every worker (the crashed ones as last seen).
    pub lease_moves: u64,
}

/// How one worker's graceful shutdown ended.
#[derive(Debug)]
pub(super) enum Shutdown {
    Report(ShutdownReport),
    Failed(String),
    /// Ctrl-C came first; the worker was stopped abruptly.
    Interrupted,
}

/// The verdict, given how many records of each key were produced, what the fleet went
/// through and, with `--poison`, the dead-letter file and what it holds.
pub(super) fn summarize(
    check: &OrderCheck,
    produced: &Produced,
    fleet: FleetFigures,
    dead_letters: Option<(&Destination, &DeadLetters)>,
) -> Summary {
    let per_key = || produced.per_key.iter().map(|(k, &n)| (k.as_str(), n));
    let poison_keys: Vec<String> = produced.poison_keys().collect();
    // A poison record processed is counted as such below, not as malformed.
    let written: Vec<(&str, u64)> = per_key()
        .chain(poison_keys.iter().map(|k| (k.as_str(), 1)))
        .collect();
    let poison = dead_letters.map(|(destination, letters)| Poison {
        put: produced.poisoned,
        discarded: letters.poison.len() as u64,
        processed: poison_keys
            .iter()
            .filter(|&key| check.lost([(key, 1)]) == 0)
            .count() as u64,
        destination: destination.to_string(),
        others: letters.others.iter().cloned().collect(),
        malformed: letters.malformed.clone(),
    });
    Summary {
        produced: produced.total(),
        processed: check.processed(),
        lost: check.lost(per_key()),
        duplicates: check.duplicates(),
        order_violations: check.violations(),
        fleet,
        // Distinct records beyond what was produced cannot come from the producer.
        malformed: check.malformed() + check.unproduced(written),
        poison,
    }
}

/// Why a run fails the check (nothing when it passes): a record lost, a key out of
/// order, a delivery the producer never wrote, a worker whose shutdown was not clean, or
/// a duplicate without a crash. A crash loses what was processed since the last
/// checkpoint, so its successor replays it: at-least-once. Without one, leases only
/// move with a flushed checkpoint, so a replay means a checkpoint went missing.
///
/// With `--poison`, also: a poison record missing from the dead-letter file, one
/// processed (the processor refuses them), another record written there, or a line of
/// the file that is not an envelope.
pub(super) fn failures(summary: &Summary, shutdowns: &[(String, Shutdown)]) -> Vec<String> {
    let mut failures = Vec::new();
    if summary.lost > 0 {
        failures.push(format!("{} records lost", summary.lost));
    }
    if summary.order_violations > 0 {
        failures.push(format!("{} order violations", summary.order_violations));
    }
    if summary.malformed > 0 {
        failures.push(format!(
            "{} deliveries were not records the producer wrote",
            summary.malformed
        ));
    }
    if summary.duplicates > 0 && summary.fleet.crashes == 0 {
        failures.push(format!("{} duplicates without a crash", summary.duplicates));
    }
    if let Some(poison) = &summary.poison {
        poison_failures(poison, &mut failures);
    }
    for (worker, shutdown) in shutdowns {
        match shutdown {
            Shutdown::Report(report) if report.clean() => {}
            Shutdown::Report(report) => {
                let json = serde_json::to_string(report).unwrap_or_else(|e| e.to_string());
                failures.push(format!("{worker}: the shutdown was not clean: {json}"));
            }
            Shutdown::Failed(e) => failures.push(format!("{worker} did not shut down: {e}")),
            Shutdown::Interrupted => {
                failures.push(format!("{worker}: the shutdown was interrupted"));
            }
        }
    }
    failures
}

fn poison_failures(poison: &Poison, failures: &mut Vec<String>) {
    if poison.discarded != poison.put {
        failures.push(format!(
            "{} poison records put, {} written to the dead-letter file",
            poison.put, poison.discarded
        ));
    }
    if poison.processed > 0 {
        failures.push(format!(
            "{} poison records were processed, though the demo's processor refuses every one",
            poison.processed
        ));
    }
    if !poison.others.is_empty() {
        let mut named = poison.others[..poison.others.len().min(NAMED_KEYS)].join(" ");
        if poison.others.len() > NAMED_KEYS {
            named.push_str(" ...");
        }
        failures.push(format!(
            "records of {} keys the processor does not refuse were written to the \
             dead-letter file: {named}",
            poison.others.len()
        ));
    }
    for line in &poison.malformed {
        failures.push(format!(
            "the dead-letter file {} is malformed at {line}",
            poison.destination
        ));
    }
}

/// What became of the poison records (`--poison`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poison {
    /// Poison records put, one per key.
    pub put: u64,
    /// Distinct poison records in the dead-letter file.
    pub discarded: u64,
    /// Poison records the order check saw processed: never, the processor refuses them.
    pub processed: u64,
    /// The dead-letter file, as `failure.destination` names it (`file:PATH`).
    pub destination: String,
    /// The keys of the other records in the dead-letter file.
    pub others: Vec<String>,
    /// The lines of the dead-letter file that are not envelopes, each named.
    pub malformed: Vec<String>,
}

/// The demo's verdict. Its `Display` is the summary line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub produced: u64,
    pub processed: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub order_violations: u64,
    pub fleet: FleetFigures,
    /// Deliveries that are not records the producer wrote; shown (with the malformed
    /// lines of the dead-letter file) only when there are some.
    pub malformed: u64,
    /// With `--poison`: the poison records and the dead-letter file, shown last.
    pub poison: Option<Poison>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "demo: produced={} processed={} lost={} duplicates={} order_violations={} \
             workers={} crashes={} lease_moves={}",
            self.produced,
            self.processed,
            self.lost,
            self.duplicates,
            self.order_violations,
            self.fleet.workers,
            self.fleet.crashes,
            self.fleet.lease_moves,
        )?;
        let malformed =
            self.malformed + self.poison.as_ref().map_or(0, |p| p.malformed.len() as u64);
        if malformed > 0 {
            write!(f, " malformed={malformed}")?;
        }
        // Last: the path is the rest of the line, whatever it holds.
        if let Some(poison) = &self.poison {
            write!(
                f,
                " discarded={} to {}",
                poison.discarded, poison.destination
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    use flotilla_actors::oracle::Seen::{self, InOrder};

    fn observe_all(check: &mut OrderCheck, numbers: &[u64]) -> Vec<Seen> {
        numbers
            .iter()
            .map(|&n| check.observe_number("key-1", n))
            .collect()
    }

    fn produced(pairs: &[(&str, u64)]) -> Produced {
        Produced {
            per_key: pairs.iter().map(|&(k, n)| (k.to_owned(), n)).collect(),
            poisoned: 0,
        }
    }

    /// A lone worker that never crashed.
    const ONE: FleetFigures = FleetFigures {
        workers: 1,
        crashes: 0,
        lease_moves: 0,
    };

    fn clean_report() -> ShutdownReport {
        ShutdownReport {
            shards: vec![],
            checkpoint_failures: vec![],
            leases: Default::default(),
            errors: vec![],
        }
    }

    fn clean(workers: &[&str]) -> Vec<(String, Shutdown)> {
        workers
            .iter()
            .map(|w| ((*w).to_owned(), Shutdown::Report(clean_report())))
            .collect()
    }

    fn passing() -> Summary {
        Summary {
            produced: 10,
            processed: 10,
            lost: 0,
            duplicates: 0,
            order_violations: 0,
            fleet: FleetFigures {
                workers: 3,
                crashes: 1,
                lease_moves: 4,
            },
            malformed: 0,
            poison: None,
        }
    }

    #[test]
    fn the_run_fails_on_a_loss_a_violation_or_a_stray_delivery() {
        let survivors = clean(&["demo-1", "demo-2"]);
        assert!(failures(&passing(), &survivors).is_empty());
        let lost = Summary {
            lost: 1,
            processed: 9,
            ..passing()
        };
        assert_eq!(failures(&lost, &survivors), ["1 records lost"]);
        let unordered = Summary {
            order_violations: 2,
            ..passing()
        };
        assert_eq!(failures(&unordered, &survivors), ["2 order violations"]);
        let stray = Summary {
            malformed: 1,
            ..passing()
        };
        assert_eq!(failures(&stray, &survivors).len(), 1);
    }

    #[test]
    fn duplicates_pass_only_after_a_crash() {
        let replayed = Summary {
            duplicates: 3,
            ..passing()
        };
        assert!(failures(&replayed, &clean(&["demo-1", "demo-2"])).is_empty());
        let uncrashed = Summary {
            fleet: FleetFigures {
                crashes: 0,
                ..replayed.fleet
            },
            ..replayed
        };
        assert_eq!(
            failures(&uncrashed, &clean(&["demo-1", "demo-2", "demo-3"])),
            ["3 duplicates without a crash"]
        );
    }

    #[test]
    fn every_survivor_must_shut_down_cleanly() {
        let unclean = ShutdownReport {
            errors: vec!["lease keeper did not stop in time".to_owned()],
            ..clean_report()
        };
        let mut shutdowns = clean(&["demo-1", "demo-3"]);
        shutdowns[1].1 = Shutdown::Report(unclean);
        let found = failures(&passing(), &shutdowns);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("demo-3: the shutdown was not clean"),
            "{found:?}"
        );

        shutdowns[1].1 = Shutdown::Failed("worker did not answer: timeout".to_owned());
        assert_eq!(
            failures(&passing(), &shutdowns),
            ["demo-3 did not shut down: worker did not answer: timeout"]
        );
        shutdowns[0].1 = Shutdown::Interrupted;
        assert_eq!(failures(&passing(), &shutdowns).len(), 2);
    }

    #[test]
    fn the_summary_line_ends_with_the_fleet() {
        let summary = Summary {
            duplicates: 7,
            ..passing()
        };
        assert_eq!(
            summary.to_string(),
            "demo: produced=10 processed=10 lost=0 duplicates=7 order_violations=0 \
             workers=3 crashes=1 lease_moves=4"
        );
    }

    #[test]
    fn in_order_deliveries_pass() {
        let mut check = OrderCheck::default();
        assert_eq!(observe_all(&mut check, &[0, 1, 2]), [InOrder; 3]);
        assert_eq!(check.observe_number("key-2", 0), InOrder);
        let summary = summarize(&check, &produced(&[("key-1", 3), ("key-2", 1)]), ONE, None);
        assert_eq!(
            summary.to_string(),
            "demo: produced=4 processed=4 lost=0 duplicates=0 order_violations=0 \
             workers=1 crashes=0 lease_moves=0"
        );
    }

    #[test]
    fn records_never_delivered_are_lost() {
        let mut check = OrderCheck::default();
        observe_all(&mut check, &[0, 1]);
        let summary = summarize(&check, &produced(&[("key-1", 4), ("key-9", 2)]), ONE, None);
        assert_eq!(summary.lost, 4);
        assert_eq!(
            summary.to_string(),
            "demo: produced=6 processed=2 lost=4 duplicates=0 order_violations=0 \
             workers=1 crashes=0 lease_moves=0"
        );
    }

    #[test]
    fn data_must_name_the_partition_key_and_a_number() {
        let mut check = OrderCheck::default();
        assert_eq!(check.observe("key-1", b"key-1:0"), InOrder);
        assert_eq!(check.observe("key-1", b"key-2:1"), Seen::Malformed);
        assert_eq!(check.observe("key-1", b"key-1:x"), Seen::Malformed);
        assert_eq!(check.observe("key-1", &[0xff]), Seen::Malformed);
        assert_eq!(check.observe("key-1", b"key-1:1"), InOrder);
        let summary = summarize(&check, &produced(&[("key-1", 2)]), ONE, None);
        assert_eq!(summary.malformed, 3);
        assert!(summary.to_string().ends_with(" malformed=3"), "{summary}");
    }

    #[test]
    fn records_the_producer_did_not_write_are_malformed() {
        let mut check = OrderCheck::default();
        observe_all(&mut check, &[0, 1, 2]);
        let summary = summarize(&check, &produced(&[("key-1", 2)]), ONE, None);
        assert_eq!((summary.lost, summary.malformed), (0, 1));
    }

    /// Five poison records put, all five in the dead-letter file and none processed.
    fn all_discarded() -> Poison {
        Poison {
            put: 5,
            discarded: 5,
            processed: 0,
            destination: "file:/tmp/flotilla-demo-dead-letters-7.jsonl".to_owned(),
            others: vec![],
            malformed: vec![],
        }
    }

    #[test]
    fn the_summary_line_ends_with_the_dead_letter_file_with_poison_only() {
        for (poison, malformed, ends) in [
            (None, 0, "lease_moves=4"),
            (None, 2, "lease_moves=4 malformed=2"),
            (
                Some(all_discarded()),
                0,
                "lease_moves=4 discarded=5 to file:/tmp/flotilla-demo-dead-letters-7.jsonl",
            ),
            (
                Some(Poison {
                    discarded: 3,
                    malformed: vec!["line 2: EOF while parsing".to_owned()],
                    ..all_discarded()
                }),
                1,
                "lease_moves=4 malformed=2 discarded=3 to file:/tmp/flotilla-demo-dead-letters-7.jsonl",
            ),
        ] {
            let summary = Summary {
                poison,
                malformed,
                ..passing()
            };
            let line = summary.to_string();
            assert!(
                line.starts_with(
                    "demo: produced=10 processed=10 lost=0 duplicates=0 order_violations=0 \
                     workers=3 crashes=1 lease_moves=4"
                ),
                "{line}"
            );
            assert!(line.ends_with(ends), "{line}");
        }
    }

    #[test]
    fn the_run_fails_unless_every_poison_record_and_nothing_else_is_discarded() {
        let survivors = clean(&["demo-1", "demo-2"]);
        let others: Vec<String> = (0..7).map(|k| format!("key-{k}")).collect();
        for (poison, found) in [
            (all_discarded(), vec![]),
            (
                Poison {
                    discarded: 3,
                    ..all_discarded()
                },
                vec!["5 poison records put, 3 written to the dead-letter file"],
            ),
            (
                Poison {
                    discarded: 4,
                    processed: 1,
                    ..all_discarded()
                },
                vec![
                    "5 poison records put, 4 written to the dead-letter file",
                    "1 poison records were processed, though the demo's processor refuses every one",
                ],
            ),
            (
                Poison {
                    others: others.clone(),
                    ..all_discarded()
                },
                vec![
                    "records of 7 keys the processor does not refuse were written to the \
                     dead-letter file: key-0 key-1 key-2 key-3 key-4 ...",
                ],
            ),
            (
                Poison {
                    malformed: vec!["line 2: EOF while parsing a value".to_owned()],
                    ..all_discarded()
                },
                vec![
                    "the dead-letter file file:/tmp/flotilla-demo-dead-letters-7.jsonl is \
                     malformed at line 2: EOF while parsing a value",
                ],
            ),
        ] {
            let summary = Summary {
                poison: Some(poison),
                ..passing()
            };
            assert_eq!(failures(&summary, &survivors), found, "{summary:?}");
        }
    }

    #[test]
    fn poison_records_are_counted_apart_from_the_rest() {
        let destination = Destination::File("/tmp/dl.jsonl".into());
        let produced = Produced {
            poisoned: 2,
            ..produced(&[("key-1", 2)])
        };
        let in_file = |keys: &[&str]| DeadLetters {
            poison: keys.iter().map(|&k| k.to_owned()).collect(),
            ..DeadLetters::default()
        };
        // (what the processor let through, the poison keys in the file, (processed,
        // lost, malformed, discarded, poison processed))
        for (observed, written, figures) in [
            (
                &["key-1:0", "key-1:1"][..],
                &["poison-0", "poison-1"][..],
                (2, 0, 0, 2, 0),
            ),
            (&["key-1:0", "key-1:1"], &["poison-1"], (2, 0, 0, 1, 0)),
            // A poison record processed is that, not a stray delivery.
            (&["key-1:0", "poison-0:0"], &["poison-1"], (2, 1, 0, 1, 1)),
            (&["key-1:0", "poison-9:0"], &[], (2, 1, 1, 0, 0)),
        ] {
            let mut check = OrderCheck::default();
            for data in observed {
                let (key, _) = data.split_once(':').unwrap();
                check.observe(key, data.as_bytes());
            }
            let letters = in_file(written);
            let summary = summarize(&check, &produced, ONE, Some((&destination, &letters)));
            let poison = summary.poison.clone().unwrap();
            assert_eq!(
                (
                    summary.processed,
                    summary.lost,
                    summary.malformed,
                    poison.discarded,
                    poison.processed
                ),
                figures,
                "{observed:?}"
            );
            assert_eq!(poison.put, 2);
            assert!(
                summary.to_string().ends_with(" to file:/tmp/dl.jsonl"),
                "{summary}"
            );
        }
        // Without --poison there is no dead-letter file to speak of.
        let summary = summarize(&OrderCheck::default(), &produced, ONE, None);
        assert_eq!(summary.poison, None);
    }
}
