//! `--poison`: the failure policy the fleet runs with, and what the dead-letter file it
//! writes holds by the end of the run.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use flotilla_actors::backend::TABLE_KEY;
use flotilla_actors::failure::Envelope;
use flotilla_actors::settings::{Destination, FailureSettings};

use super::producer::is_poison;

/// Retries of a refused record before it is written to the dead-letter file.
const MAX_RETRIES: u32 = 2;

/// The run's dead-letter file: one per process, in the temporary directory.
pub(super) fn dead_letter_path() -> PathBuf {
    std::env::temp_dir().join(format!(
        "flotilla-demo-dead-letters-{}.jsonl",
        std::process::id()
    ))
}

/// Removes what a former process of the same id left at `path`, so the file holds this
/// run's records only.
pub(super) fn clear(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// `[failure]` for a run with poison records: a refused record is retried
/// [`MAX_RETRIES`] times, then written to `path` and skipped.
pub(super) fn poison_failure(path: &Path) -> FailureSettings {
    FailureSettings {
        max_retries: Some(MAX_RETRIES),
        bisect: true,
        destination: Some(Destination::File(path.to_owned())),
        ..FailureSettings::default()
    }
}

/// What a dead-letter file holds, by the demo's keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct DeadLetters {
    /// The distinct keys of the poison records written there (a record written twice,
    /// after a crash, counts once).
    pub(super) poison: BTreeSet<String>,
    /// The distinct keys of the other records written there: the processor refuses
    /// none of them, so there should be none.
    pub(super) others: BTreeSet<String>,
    /// The lines that are not envelopes, each named: `line 3: <why>`.
    pub(super) malformed: Vec<String>,
}

impl DeadLetters {
    /// Reads the file at `path`: none is an empty one (nothing was discarded); one that
    /// cannot be read is one malformed entry saying why.
    pub(super) fn read(path: &Path) -> Self {
        match std::fs::read(path) {
            Ok(bytes) => Self::parse(&String::from_utf8_lossy(&bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Self::default(),
            Err(e) => Self {
                malformed: vec![format!("cannot be read: {e}")],
                ..Self::default()
            },
        }
    }

    /// One [`Envelope`] a line, as JSON; blank lines are skipped.
    pub(super) fn parse(text: &str) -> Self {
        let mut letters = Self::default();
        for (n, line) in (1..).zip(text.lines()) {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Envelope>(line) {
                Ok(envelope) => {
                    let key = demo_key(&envelope.partition_key);
                    if is_poison(&key) {
                        letters.poison.insert(key);
                    } else {
                        letters.others.insert(key);
                    }
                }
                Err(e) => letters.malformed.push(format!("line {n}: {e}")),
            }
        }
        letters
    }
}

/// The producer's key of a discarded record: its partition key, or for a change of the
/// table the item's key in it (`{"pk":{"S":"poison-3"}}` is `poison-3`).
fn demo_key(partition_key: &str) -> String {
    serde_json::from_str::<serde_json::Value>(partition_key)
        .ok()
        .and_then(|keys| keys.get(TABLE_KEY)?.get("S")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| partition_key.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn envelope(partition_key: &str) -> String {
        serde_json::to_string(&Envelope {
            stream: "flotilla-demo".into(),
            shard: "shardId-000000000001".into(),
            sequence_number: "42".into(),
            sub_sequence_number: 0,
            partition_key: partition_key.into(),
            arrival_ms: Some(1),
            discarded_ms: 2,
            reason: "retries".into(),
            attempts: 3,
            error: Some(format!("the demo refuses {partition_key}")),
            worker: "demo-1".into(),
            data: "cG9pc29uLTA6MA==".into(),
        })
        .unwrap()
    }

    type Keys = &'static [&'static str];

    #[test]
    fn the_file_is_read_by_the_demo_s_keys() {
        let table_key = |key: &str| format!(r#"{{"{TABLE_KEY}":{{"S":"{key}"}}}}"#);
        // (the file's lines, the poison keys in it, the other keys, the malformed lines)
        let cases: [(Vec<String>, Keys, Keys, Keys); 5] = [
            (vec![], &[], &[], &[]),
            (
                vec![envelope("poison-0"), envelope("poison-1"), String::new()],
                &["poison-0", "poison-1"],
                &[],
                &[],
            ),
            // Written twice (a crash before the checkpoint): one record.
            (
                vec![envelope("poison-0"), envelope("poison-0")],
                &["poison-0"],
                &[],
                &[],
            ),
            // A table's stream: the partition key is the item's key as JSON.
            (
                vec![
                    envelope(&table_key("poison-2")),
                    envelope(&table_key("key-3")),
                ],
                &["poison-2"],
                &["key-3"],
                &[],
            ),
            (
                vec![envelope("key-1"), "{\"stream\":".into(), "[]".into()],
                &[],
                &["key-1"],
                &["line 2", "line 3"],
            ),
        ];
        for (lines, poison, others, malformed) in cases {
            let letters = DeadLetters::parse(&lines.join("\n"));
            assert_eq!(
                letters.poison.iter().collect::<Vec<_>>(),
                poison,
                "{lines:?}"
            );
            assert_eq!(
                letters.others.iter().collect::<Vec<_>>(),
                others,
                "{lines:?}"
            );
            assert_eq!(letters.malformed.len(), malformed.len(), "{letters:?}");
            for (found, line) in letters.malformed.iter().zip(malformed) {
                assert!(found.starts_with(&format!("{line}: ")), "{found}");
            }
        }
    }

    #[test]
    fn a_run_with_poison_retries_bisects_and_writes_to_its_own_file() {
        let path = dead_letter_path();
        assert!(path.starts_with(std::env::temp_dir()), "{}", path.display());
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            name,
            format!("flotilla-demo-dead-letters-{}.jsonl", std::process::id())
        );
        let failure = poison_failure(&path);
        assert_eq!(failure.max_retries, Some(2));
        assert!(failure.bisect);
        assert_eq!(failure.max_record_age, None);
        assert_eq!(
            failure.destination.unwrap().to_string(),
            format!("file:{}", path.display())
        );
    }

    #[test]
    fn a_missing_file_holds_nothing_and_clearing_it_is_no_error() {
        let path = std::env::temp_dir().join(format!(
            "flotilla-demo-dead-letters-test-{}.jsonl",
            std::process::id()
        ));
        std::fs::write(&path, envelope("poison-7")).unwrap();
        assert_eq!(
            DeadLetters::read(&path)
                .poison
                .into_iter()
                .collect::<Vec<_>>(),
            ["poison-7"]
        );
        clear(&path).unwrap();
        assert!(!path.exists());
        clear(&path).unwrap();
        assert_eq!(DeadLetters::read(&path), DeadLetters::default());
    }
}
