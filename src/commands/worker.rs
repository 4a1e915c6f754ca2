//! `flotilla run` and `flotilla multilang`: a worker started from the settings (or a
//! MultiLangDaemon properties file), served until Ctrl-C, SIGTERM or its own stop, then
//! shut down gracefully; `run`'s `worker.streams` read again on SIGHUP.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use flotilla_actors::multilang::properties::Properties;
use flotilla_actors::multilang::{DaemonConfig, MultiLangProcessor};
use flotilla_actors::{Backend, CheckpointMode, Settings, ShutdownReport, StreamSet, Worker};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::cli::{MultiLangArgs, RunArgs};
use crate::stdout_processor::StdoutProcessor;

/// `flotilla run`: the stdout processor on the stream the settings name.
pub(super) async fn run_worker(args: RunArgs) -> anyhow::Result<()> {
    let settings = Settings::load(args.config.as_deref())?;
    let stream = if settings.worker.streams.is_empty() {
        settings.worker.stream.clone()
    } else {
        "set of worker.streams".to_owned()
    };
    let changes = flotilla_actors::model::SourceKind::of_stream(&settings.worker.stream)
        == flotilla_actors::model::SourceKind::DynamoDbStreams;
    let backend = Backend::aws(&settings.aws).await;
    // Listen before starting: a SIGTERM during start-up must not kill the process
    // with its leases held, nor a SIGHUP (whose default is to end the process).
    let terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let hangup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    let mut builder = Worker::builder().backend(backend);
    if !settings.worker.streams.is_empty() {
        // The list the worker asks at every shard sync; SIGHUP replaces it.
        let current = Arc::new(std::sync::Mutex::new(settings.worker.stream_specs()?));
        builder = builder.stream_set(StreamSet::polled({
            let current = current.clone();
            move || {
                let list = current
                    .lock()
                    .map(|l| l.clone())
                    .map_err(|_| "the stream list's lock is poisoned".to_owned());
                async move { list }
            }
        }));
        tokio::spawn(reload_on_hangup(
            hangup,
            args.config.clone(),
            settings.clone(),
            Some(current),
        ));
    } else {
        tokio::spawn(reload_on_hangup(
            hangup,
            args.config.clone(),
            settings.clone(),
            None,
        ));
    }
    let worker = builder
        .settings(settings)
        .processor(move |shard| StdoutProcessor::new(shard, changes))
        .start()
        .await
        .with_context(|| format!("cannot start a worker on {stream}"))?;
    serve(worker, terminate).await
}

/// The stream list to read after the settings file was read again, or why the old one
/// stays (the message names the key at fault). `Ok((list, others))`: `others` are the
/// other settings the file changed (dotted keys), which take a restart.
fn reloaded_streams(
    started: &Settings,
    reloaded: Result<Settings, flotilla_actors::LoadError>,
) -> Result<(Vec<flotilla_actors::settings::StreamSpec>, Vec<String>), String> {
    let reloaded = reloaded.map_err(|e| e.to_string())?;
    reloaded.validate().map_err(|e| e.to_string())?;
    if reloaded.worker.streams.is_empty() {
        return Err(
            "worker.streams: the file now has no list (worker.stream instead?); a worker \
             changes from a list to one stream only by a restart"
                .to_owned(),
        );
    }
    let list = reloaded.worker.stream_specs().map_err(|e| e.to_string())?;
    let mut others = reloaded.clone();
    others.worker.streams = started.worker.streams.clone();
    Ok((list, started.changed_keys(&others)))
}

/// On each SIGHUP, reads the settings file again and gives the worker its new
/// `worker.streams` (read at the next shard sync). A file that cannot be read or is not
/// valid keeps the old list, said at ERROR with the key at fault; other changed
/// settings are named as needing a restart.
async fn reload_on_hangup(
    mut hangup: tokio::signal::unix::Signal,
    config: Option<PathBuf>,
    started: Settings,
    current: Option<Arc<std::sync::Mutex<Vec<flotilla_actors::settings::StreamSpec>>>>,
) {
    while hangup.recv().await.is_some() {
        let Some(current) = &current else {
            warn!(
                message = "SIGHUP: nothing is re-read for a worker of one stream (worker.stream); restart it to change its settings."
            );
            continue;
        };
        match reloaded_streams(&started, Settings::load(config.as_deref())) {
            Ok((list, others)) => {
                let names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
                info!(message = "SIGHUP: settings file read again; the stream set changes at the next shard sync.", streams = ?names);
                if !others.is_empty() {
                    warn!(
                        message = "SIGHUP: settings other than worker.streams changed; only worker.streams is read again, so these take effect at the next restart.",
                        settings = %others.join(", ")
                    );
                }
                match current.lock() {
                    Ok(mut current) => *current = list,
                    Err(_) => tracing::error!(
                        message =
                            "SIGHUP: the stream list's lock is poisoned; the set is not changed."
                    ),
                }
            }
            Err(error) => {
                tracing::error!(message = "SIGHUP: settings file not taken; the worker keeps its stream set.", %error);
            }
        }
    }
}

/// `flotilla multilang`: the properties file as the lowest settings layer, one child
/// per lease.
pub(super) async fn multilang(args: MultiLangArgs) -> anyhow::Result<()> {
    let path = args.properties.display().to_string();
    let text = std::fs::read_to_string(&args.properties)
        .with_context(|| format!("cannot read properties file {path}"))?;
    let properties = Properties::parse(&text).with_context(|| format!("properties file {path}"))?;
    let daemon = DaemonConfig::from_properties(&properties)
        .with_context(|| format!("properties file {path}"))?;
    for note in &daemon.warnings {
        warn!(message = "MultiLang property not used.", file = %path, note = %note);
    }
    // Before anything starts: a program that cannot be run would fail each shard.
    daemon
        .command
        .check()
        .with_context(|| format!("properties file {path}"))?;
    let mut base = daemon.settings.clone();
    // The child decides what is processed: its checkpoints are the only ones.
    base.push(("checkpoint.mode".to_owned(), "manual".to_owned()));
    let settings = Settings::load_over(
        &base,
        &format!("properties file {path}"),
        args.config.as_deref(),
        Settings::environment()?,
    )?;
    if settings.checkpoint.mode != CheckpointMode::Manual {
        bail!(
            "checkpoint.mode = {:?}: a MultiLang processor checkpoints itself, so the mode must be manual (remove the override)",
            settings.checkpoint.mode
        );
    }
    let stream = settings.worker.stream.clone();
    let backend = Backend::aws(&settings.aws).await;
    let terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    // As `run` on one stream: a SIGHUP (whose default ends the process with its leases
    // held) is said and ignored; nothing here can be re-read while running.
    let mut hangup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            warn!(
                message = "SIGHUP: flotilla multilang reads its properties file and settings only at start; nothing is re-read. Restart it to change them (SIGTERM stops it gracefully)."
            );
        }
    });
    let command = Arc::new(daemon.command);
    let worker = Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |_| MultiLangProcessor::new(command.clone()))
        .start()
        .await
        .with_context(|| format!("cannot start a worker on stream {stream}"))?;
    serve(worker, terminate).await
}

/// Runs a started worker until Ctrl-C, SIGTERM or its own stop, then shuts it down
/// gracefully and reports how.
async fn serve(
    mut worker: Worker,
    mut terminate: tokio::signal::unix::Signal,
) -> anyhow::Result<()> {
    #[cfg(feature = "otel")]
    crate::otel::watch(&worker);
    let signal_name = tokio::select! {
        result = tokio::signal::ctrl_c() => {
            result.context("cannot listen for Ctrl-C")?;
            "Ctrl-C"
        }
        _ = terminate.recv() => "SIGTERM",
        result = worker.wait() => {
            // Only a failure stops this worker on its own: nothing here holds a handle.
            let stopped = result.context("the worker stopped")?;
            eprintln!("flotilla: stopped ({}); {}", stopped.reason, shutdown_summary(&stopped.report));
            if !stopped.report.clean() {
                bail!("the shutdown was not clean");
            }
            return Ok(());
        }
    };
    info!(message = "Shutting down.", signal = signal_name, worker_id = %worker.id());
    // A second signal gives up on the graceful path: the leases then stay owned until
    // they expire, and their next owners resume from the last written checkpoints.
    let report = tokio::select! {
        result = worker.shutdown() => result.context("the worker did not shut down")?,
        _ = tokio::signal::ctrl_c() => bail!("interrupted during shutdown; leases are left to expire"),
        _ = terminate.recv() => bail!("terminated during shutdown; leases are left to expire"),
    };
    eprintln!("flotilla: {}", shutdown_summary(&report));
    if !report.clean() {
        bail!("the shutdown was not clean");
    }
    Ok(())
}

/// One line on what a graceful shutdown achieved, naming whatever failed.
fn shutdown_summary(report: &ShutdownReport) -> String {
    let shards = report.shards.len();
    let flushed = report
        .shards
        .iter()
        .filter(|s| s.checkpoint_flushed)
        .count();
    let mut text = format!(
        "shutdown {}: {shards} shards stopped, {flushed} checkpoints flushed, {} leases handed off, {} released",
        if report.clean() { "clean" } else { "NOT clean" },
        report.leases.handed_off.len(),
        report.leases.released.len(),
    );
    for shard in &report.shards {
        let mut problems = Vec::new();
        if !shard.processor_ok {
            problems.push("processor failed".to_owned());
        }
        if !shard.checkpoint_flushed {
            problems.push("checkpoint not flushed".to_owned());
        }
        if let Some(error) = &shard.error {
            problems.push(error.clone());
        }
        if !problems.is_empty() {
            text.push_str(&format!("; {}: {}", shard.shard_id, problems.join(", ")));
        }
    }
    for lease in &report.leases.failed {
        text.push_str(&format!("; lease not released: {lease}"));
    }
    for failure in report.checkpoint_failures.iter().chain(&report.errors) {
        text.push_str(&format!("; {failure}"));
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use super::*;
    use flotilla_actors::settings::StreamEntry;

    fn started() -> Settings {
        let mut s = Settings::default();
        s.worker.application = "app".into();
        s.worker.streams = vec![StreamEntry::Name("a".into())];
        s
    }

    /// A re-read file gives its list; a bad one keeps the old list and names the key;
    /// other changed settings are named as needing a restart.
    #[test]
    fn a_reloaded_file_gives_its_list_or_says_which_key_is_wrong() {
        let mut next = started();
        next.worker.streams.push(StreamEntry::Name("b".into()));
        let (list, others) = reloaded_streams(&started(), Ok(next.clone())).unwrap();
        assert_eq!(
            list.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(others.is_empty(), "{others:?}");
        next.lease.max_leases = 7;
        next.reader.mode = flotilla_actors::settings::ReadMode::Fanout;
        assert_eq!(
            reloaded_streams(&started(), Ok(next.clone())).unwrap().1,
            ["lease.max_leases", "reader.mode"],
            "the settings that need a restart, by name"
        );
        let mut bad = started();
        bad.worker.streams.push(StreamEntry::Name("a".into()));
        let error = reloaded_streams(&started(), Ok(bad)).unwrap_err();
        assert!(error.contains("worker.streams[1]"), "{error}");
        let mut single = started();
        single.worker.streams.clear();
        single.worker.stream = "a".into();
        let error = reloaded_streams(&started(), Ok(single)).unwrap_err();
        assert!(error.contains("worker.streams"), "{error}");
        let unreadable = Settings::load(Some(std::path::Path::new("/nonexistent/flotilla.toml")));
        assert!(reloaded_streams(&started(), unreadable).is_err());
    }
}
