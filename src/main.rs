//! `flotilla`: the service binary.
//!
//! * `flotilla demo`: a worker on an in-memory stream with a checking producer and
//!   processor (`demo`); no AWS needed.
//! * `flotilla run`: a worker on a Kinesis stream with the built-in stdout processor
//!   (`stdout_processor`), settings from `Settings::load`, until Ctrl-C or SIGTERM.
//! * `flotilla init`: makes sure the lease table exists (PAY_PER_REQUEST, keyed by
//!   `leaseKey`), refusing a table of the same name with another key schema.
//! * `flotilla leases`: prints the lease table, one JSON object per lease on stdout,
//!   with heartbeats and malformed rows reported on stderr.
//! * `flotilla status`: a running worker's status endpoint as tables (`status_client`).
//! * `flotilla rewind`, `flotilla position export|import`: rewrite or save checkpoints,
//!   refusing while live workers hold leases (`ops`).
//!
//! Logs go to stderr as text, or as JSON lines with `--log-format json`
//! (`FLOTILLA_LOG_FORMAT`); `FLOTILLA_LOG` filters them. Errors end here as `anyhow`
//! reports; the library's are typed.
//!
//! With the cargo feature `otel`, `OTEL_EXPORTER_OTLP_*` variables also export the spans
//! and the `/metrics` families over OTLP/HTTP (`otel`).

mod cli;
mod commands;
mod demo;
mod ops;
#[cfg(feature = "otel")]
mod otel;
mod status_client;
mod stdout_processor;

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, Registry};

    let args = cli::Cli::parse();
    let filter = match log_filter(
        std::env::var("FLOTILLA_LOG").ok().as_deref(),
        args.default_log_filter(),
    ) {
        Ok(filter) => filter,
        Err(error) => {
            eprintln!("flotilla: {error}");
            return ExitCode::FAILURE;
        }
    };
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    #[allow(unused_mut)] // more layers with the `otel` feature
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![match args.log_format {
        cli::LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter)
            .boxed(),
        // One object a line: the event's fields at the top (`message` among them), the
        // spans it is in (command, worker, shard) in `spans`.
        cli::LogFormat::Json => logs.json().flatten_event(true).with_filter(filter).boxed(),
    }];
    #[cfg(feature = "otel")]
    let export = match otel::from_env() {
        Ok(export) => {
            layers.extend(export.layer());
            export
        }
        Err(error) => {
            eprintln!("flotilla: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::registry().with(layers).init();
    let result = commands::run(args).await;
    #[cfg(feature = "otel")]
    export.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flotilla: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The levels a log filter names, lowest first (as `FLOTILLA_LOG=LEVEL` or
/// `TARGET=LEVEL`).
const LEVELS: &str = "off, error, warn, info, debug, trace";

/// The log filter from `FLOTILLA_LOG` (`None`: unset or empty, the command's default).
/// A filter is refused, naming the valid levels, where the subscriber would take it in
/// a way nobody meant: a directive that does not parse (`flotilla=loud`), and a bare
/// word that is not a level (`warning`, which would enable one target of that name and
/// silence every other line, ERROR included). A target at every level is written
/// `TARGET=trace`.
fn log_filter(spec: Option<&str>, default: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    let Some(spec) = spec.filter(|s| !s.trim().is_empty()) else {
        return Ok(tracing_subscriber::EnvFilter::new(default));
    };
    let invalid = |why: String| {
        format!(
            "FLOTILLA_LOG={spec:?}: {why}; the levels are {LEVELS} (e.g. FLOTILLA_LOG=warn, \
             or per target: FLOTILLA_LOG=info,flotilla_actors=debug)"
        )
    };
    for directive in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = !directive.contains(['=', '[']);
        if bare
            && directive
                .parse::<tracing_subscriber::filter::LevelFilter>()
                .is_err()
        {
            return Err(invalid(format!(
                "{directive:?} is not a level (a target at every level is written \
                 {directive}=trace)"
            )));
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(spec)
        .map_err(|error| invalid(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    /// A level, targets with levels, and nothing at all are filters; a word that is not
    /// a level (a typo of one) and a level that is not one are errors naming the levels.
    #[test]
    fn a_log_filter_that_would_silence_the_logs_is_refused_naming_the_levels() {
        for good in [
            None,
            Some(""),
            Some("warn"),
            Some("WARN"),
            Some("debug"),
            Some("flotilla_actors=debug"),
            Some("info,flotilla_actors=debug,aws_config=warn"),
            Some("flotilla_actors::shard_reader=trace"),
            Some("[shard]=debug"),
            Some("off"),
        ] {
            assert!(log_filter(good, "info").is_ok(), "{good:?}");
        }
        for bad in [
            "warning",
            "info,warning",
            "verbose",
            "flotilla=loud",
            "flotilla_actors",
        ] {
            let error = log_filter(Some(bad), "info").err().unwrap_or_default();
            assert!(
                error.contains("off, error, warn, info, debug, trace") && error.contains(bad),
                "{bad}: {error}"
            );
        }
        let error = log_filter(Some("warning"), "info")
            .err()
            .unwrap_or_default();
        assert!(error.contains("\"warning\" is not a level"), "{error}");
    }
}
