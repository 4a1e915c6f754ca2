//! `failure.destination = "file:PATH"`: discarded records appended to a file of JSON lines,
//! one [`Envelope`] a line. For a single host, or for trying the policy out: the file is
//! on the worker's disk, and a fleet writes one file per worker.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::destination::{DeadLetters, DestinationError, Envelope};
use crate::settings::Destination;

/// Appends envelopes to a file of JSON lines.
///
/// Each write opens the file anew (created if missing, always appended to), so a file
/// moved away by a log rotation is started again rather than written behind its back;
/// writes all its lines with one `write` call, so two workers appending to one file on
/// a local disk do not interleave their lines; and syncs the data before it answers,
/// since `Ok` lets the checkpoint move past the records.
#[derive(Debug, Clone)]
pub struct FileDeadLetters {
    path: PathBuf,
    /// One write at a time from this process: shards share one destination, and a write
    /// the OS splits (a large one, or one cut short by a signal) must not let another's
    /// lines in between.
    lock: Arc<Mutex<()>>,
}

impl FileDeadLetters {
    /// A destination appending to `path`. Nothing is opened until the first write, so a
    /// path that cannot be written is reported there, naming it, and retried.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            lock: Arc::new(Mutex::new(())),
        }
    }

    /// The file written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, why: String) -> DestinationError {
        DestinationError {
            destination: self.name(),
            why,
        }
    }

    /// The envelopes as JSON lines, each ended by a newline.
    fn lines(&self, envelopes: &[Envelope]) -> Result<Vec<u8>, DestinationError> {
        let mut lines = Vec::new();
        for envelope in envelopes {
            serde_json::to_writer(&mut lines, envelope).map_err(|e| {
                self.error(format!(
                    "cannot encode the envelope of {}/{}: {e}",
                    envelope.shard, envelope.sequence_number
                ))
            })?;
            lines.push(b'\n');
        }
        Ok(lines)
    }

    /// The blocking part: open, append, sync.
    fn append(&self, lines: &[u8]) -> Result<(), DestinationError> {
        let path = self.path.display();
        let _one_at_a_time = self
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| self.error(format!("cannot open {path} to append: {e}")))?;
        file.write_all(lines)
            .map_err(|e| self.error(format!("cannot write to {path}: {e}")))?;
        file.sync_data()
            .map_err(|e| self.error(format!("cannot sync {path} to disk: {e}")))
    }
}

impl DeadLetters for FileDeadLetters {
    fn write<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), DestinationError>> {
        Box::pin(async move {
            if envelopes.is_empty() {
                return Ok(());
            }
            let lines = self.lines(envelopes)?;
            let this = self.clone();
            tokio::task::spawn_blocking(move || this.append(&lines))
                .await
                .map_err(|e| {
                    self.error(format!(
                        "the write to {} did not finish: {e}",
                        self.path.display()
                    ))
                })?
        })
    }

    fn name(&self) -> String {
        Destination::File(self.path.clone()).to_string()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A fresh path under the system's temporary folder, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(what: &str) -> Self {
            use std::sync::atomic::{AtomicU64, Ordering};
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            Scratch(std::env::temp_dir().join(format!(
                "flotilla-dead-letters-{what}-{}-{n}",
                std::process::id()
            )))
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
            let _ = std::fs::remove_dir(&self.0);
        }
    }

    /// An envelope for the destinations' tests: every field set, and an error text that
    /// needs escaping in JSON.
    pub(crate) fn envelope(sequence: u64, data: &str) -> Envelope {
        Envelope {
            stream: "orders".into(),
            shard: "shardId-000000000001".into(),
            sequence_number: format!("4958{sequence:020}"),
            sub_sequence_number: sequence % 3,
            partition_key: format!("customer-{sequence}"),
            arrival_ms: sequence
                .is_multiple_of(2)
                .then_some(1_700_000_000_000 + sequence),
            discarded_ms: 1_700_000_100_000,
            reason: "retries".into(),
            attempts: 3,
            error: Some(format!("bad record {sequence}:\n\"quoted\" and a tab\t")),
            worker: "worker-1".into(),
            data: data.into(),
        }
    }

    fn read_back(path: &Path) -> Vec<Envelope> {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.ends_with('\n'), "the last line is not ended: {text:?}");
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn lines_parse_back_to_the_envelopes_and_later_writes_append() {
        let scratch = Scratch::new("append");
        let file = FileDeadLetters::new(&scratch.0);
        let first: Vec<Envelope> = (0..3).map(|n| envelope(n, "aGVsbG8=")).collect();
        file.write(&first).await.unwrap();
        assert_eq!(read_back(&scratch.0), first);

        let second = vec![envelope(7, &"QUJD".repeat(300))];
        file.write(&second).await.unwrap();
        file.write(&[]).await.unwrap();
        // Another destination on the same file (another worker's) appends too.
        FileDeadLetters::new(&scratch.0)
            .write(&first[..1])
            .await
            .unwrap();
        let all: Vec<Envelope> = first
            .iter()
            .chain(&second)
            .chain(&first[..1])
            .cloned()
            .collect();
        assert_eq!(read_back(&scratch.0), all);
        assert_eq!(file.name(), format!("file:{}", scratch.0.display()));
    }

    #[tokio::test]
    async fn a_path_that_cannot_be_written_is_an_error_naming_it() {
        let scratch = Scratch::new("a-directory");
        std::fs::create_dir(&scratch.0).unwrap();
        let file = FileDeadLetters::new(&scratch.0);
        let error = file.write(&[envelope(1, "")]).await.unwrap_err();
        let path = scratch.0.display().to_string();
        assert_eq!(error.destination, format!("file:{path}"));
        assert!(error.why.contains(&path), "{error}");
        assert!(error.why.starts_with("cannot open"), "{error}");

        let missing = scratch.0.join("no-such-folder").join("dl.jsonl");
        let error = FileDeadLetters::new(&missing)
            .write(&[envelope(1, "")])
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains(&missing.display().to_string()),
            "{error}"
        );
    }
}
