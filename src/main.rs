//! `flotilla`: the service binary.
//!
//! * `flotilla init`: makes sure the lease table exists (PAY_PER_REQUEST, keyed by
//!   `leaseKey`), refusing a table of the same name with another key schema.
//! * `flotilla leases`: prints the lease table, one JSON object per lease on stdout,
//!   with heartbeats and malformed rows reported on stderr.
//!
//! Errors end here as `anyhow` reports; the library's are typed.

mod cli;
mod settings;

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let args = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match cli::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flotilla: {error:#}");
            ExitCode::FAILURE
        }
    }
}
