//! [`WorkerError`]: why a worker could not start, or stopped. Each variant names what
//! failed and, where the user can, what to change.

use std::net::SocketAddr;

use crate::backend::{LeaseError, StreamError};
use crate::settings::SettingsError;

/// Why a worker could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The settings are not valid; the error names the key. Fix them and start again.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The builder was not given a required part: `backend` or `processor`.
    #[error("worker: {0} is required (call WorkerBuilder::{0})")]
    Missing(&'static str),
    /// The stream could not be described at start (not found, no access, or still
    /// failing after a few retries).
    #[error("stream {stream}")]
    Stream {
        /// The stream, as the settings name it.
        stream: String,
        /// The stream service's error.
        #[source]
        source: StreamError,
    },
    /// The stream-set source's first answer failed or was refused.
    #[error("stream set: {0}")]
    StreamSet(String),
    /// A stream of `worker.streams` could not be named as multi-stream lease keys need
    /// (the server gave no creation time, or an ARN without an account), or its entry's
    /// ARN is not the stream's.
    #[error("stream {stream}: cannot name it in multi-stream lease keys: {why}")]
    StreamIdentity {
        /// The stream, as `worker.streams` names it.
        stream: String,
        /// What is missing or does not match.
        why: String,
    },
    /// Fan-out mode: the application's enhanced fan-out consumer could not be had.
    #[error(transparent)]
    Consumer(#[from] crate::fanout::ConsumerError),
    /// `worker.stream` names a DynamoDB table's stream and the backend reads none.
    #[error(
        "worker.stream names a DynamoDB table's stream, and this backend has no DynamoDB \
         Streams client: build it with Backend::aws, or add one with \
         Backend::with_table_streams"
    )]
    NoTableStreams,
    /// `failure.destination` names a kind of destination this backend has no client for.
    #[error(
        "failure.destination = {destination} needs {needs}, or give one with \
         Backend::with_dead_letters"
    )]
    NoDeadLetters {
        /// The destination, as `failure.destination` names it.
        destination: String,
        /// What the backend lacks, and which backends have it.
        needs: &'static str,
    },
    /// The lease table could not be found or created (`ensure_table`), still failing
    /// after a few retries.
    #[error("lease table {table}")]
    LeaseTable {
        /// The table's name (`Settings::lease_table`).
        table: String,
        /// The lease table's error.
        #[source]
        source: LeaseError,
    },
    /// The backend was built from other AWS settings than the worker's (say, with
    /// `Backend::aws(&AwsSettings::default())` beside settings that name local endpoints).
    #[error(
        "backend: built for other AWS settings than the worker's: {differences}; build it \
         from the worker's own settings: Backend::aws(&settings.aws)"
    )]
    BackendMismatch {
        /// Each setting that differs, with both values.
        differences: String,
    },
    /// The status endpoint cannot listen where `status.bind` says.
    #[error(
        "status endpoint: cannot listen on {addr} ({}); set status.bind to a free address \
         or port 0, or status.enabled = false",
        bind_failure(.error)
    )]
    StatusBind {
        /// The address `status.bind` names.
        addr: SocketAddr,
        /// Why it could not be bound.
        error: std::io::Error,
    },
    /// The lease table holds another stream's positions under this stream's keys
    /// (`model::origin`): rows written for another `worker.stream`, or for a stream of
    /// this name that was deleted and created again. Taken, they would skip this
    /// stream's records; the worker does not start.
    #[error(
        "lease table {table}: {} of its rows are not stream {stream}'s: {}; {}",
        rows.len(),
        rows.iter().take(5).map(|(key, why)| format!("{key} ({why})")).collect::<Vec<_>>().join(", "),
        crate::model::origin::FOREIGN_ROWS_ADVICE
    )]
    ForeignRows {
        /// The lease table (the application).
        table: String,
        /// The stream this worker reads.
        stream: String,
        /// Each row of another stream, with why.
        rows: Vec<(String, crate::model::origin::Foreign)>,
    },
    /// The supervisor or its core actors could not be started (the error, as text).
    #[error("worker could not start its actors: {0}")]
    Spawn(String),
    /// The worker has stopped: a core actor failed past its restart intensity (the
    /// reason), or a requested shutdown stopped it.
    #[error("worker stopped: {0}")]
    Stopped(String),
    /// The worker did not answer in time, or stopped before answering (the call's
    /// error, as text).
    #[error("worker did not answer: {0}")]
    Unresponsive(String),
}

/// A few words on why a port could not be bound, for [`WorkerError::StatusBind`].
fn bind_failure(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => "address in use".to_owned(),
        std::io::ErrorKind::AddrNotAvailable => "no such address on this machine".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_that_cannot_be_bound_is_named_in_a_few_words() {
        use std::io::{Error, ErrorKind};
        let table = [
            (Error::from(ErrorKind::AddrInUse), "address in use"),
            (
                Error::from(ErrorKind::AddrNotAvailable),
                "no such address on this machine",
            ),
            (
                Error::from(ErrorKind::PermissionDenied),
                "permission denied",
            ),
            (Error::other("odd"), "odd"),
        ];
        for (error, words) in table {
            assert_eq!(bind_failure(&error), words);
        }
        let error = WorkerError::StatusBind {
            addr: "127.0.0.1:8080".parse().expect("addr"),
            error: Error::from(ErrorKind::AddrInUse),
        };
        assert!(
            error
                .to_string()
                .starts_with("status endpoint: cannot listen on 127.0.0.1:8080 (address in use)")
        );
    }
}
