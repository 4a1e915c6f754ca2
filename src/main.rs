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
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(args.default_log_filter()));
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
    let result = cli::run(args).await;
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
