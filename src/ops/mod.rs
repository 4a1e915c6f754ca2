//! Operator commands on the lease table: `rewind` ([`rewind()`]), `position export` and
//! `position import` ([`positions`]), the liveness check they and `destroy` make before
//! changing what live workers use ([`liveness`]), and the helpers every command on the
//! table shares (below: reading it, explaining its errors, asking for confirmation).
//!
//! * `liveness`: whether the owners of the leases are alive, asked of `balance`, the
//!   workers' own rule.
//! * `rewind`: where `--to` puts the leases, and the command.
//! * `positions`: the position token, `export` and `import`.
//! * `writes`: a batch of checkpoint writes and what it did.

mod liveness;
mod positions;
mod rewind;
mod writes;

pub use liveness::{forced, refuse_while_alive};
pub use positions::{export, import};
pub use rewind::{Target, parse_target, rewind};

use anyhow::{Context as _, anyhow, bail};
use flotilla_actors::backend::{LeaseError, LeaseTable, ScanOutput};

/// Reads the whole table, naming it (and what to do) on failure.
pub async fn scan(table: &dyn LeaseTable) -> anyhow::Result<ScanOutput> {
    let scan = table
        .scan()
        .await
        .map_err(|e| explain(e, table.table_name()))
        .with_context(|| format!("cannot read lease table {}", table.table_name()))?;
    for bad in &scan.malformed {
        eprintln!("flotilla: skipped a malformed row, left as is: {bad}");
    }
    Ok(scan)
}

/// Asks on the terminal for `expected` to be typed back. Without a terminal (a script,
/// a pipe) it refuses rather than reading whatever stdin holds: scripts pass `--yes`.
pub fn confirm(prompt: &str, expected: &str) -> anyhow::Result<()> {
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!("not confirmed: there is no terminal to ask on; pass --yes to confirm in a script");
    }
    let mut err = std::io::stderr().lock();
    err.write_all(prompt.as_bytes())?;
    err.flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    if answer.trim() != expected {
        bail!("not confirmed: the answer was not {expected:?}; nothing was deleted");
    }
    Ok(())
}

/// Adds what to do to the lease-table errors an operator can fix.
pub fn explain(error: LeaseError, table: &str) -> anyhow::Error {
    let hint = match &error {
        LeaseError::WrongKeySchema { .. } => Some(format!(
            "table {table} is not a lease table. Pick another application name (--table), \
             or, if {table} is a lease table of an old program you no longer need, delete it \
             and run flotilla init again"
        )),
        LeaseError::NotFound { .. } => Some(format!(
            "there is no table {table} in this region: create it with `flotilla init --table \
             {table}`, or check --region / AWS_REGION and --dynamodb-endpoint"
        )),
        LeaseError::AccessDenied { .. } => Some(format!(
            "the AWS credentials in use may not do this. Grant them dynamodb:DescribeTable, \
             CreateTable, Scan, GetItem, PutItem, UpdateItem and DeleteItem on \
             arn:aws:dynamodb:REGION:ACCOUNT:table/{table}, or use other credentials \
             (AWS_PROFILE); `aws sts get-caller-identity` shows whose they are"
        )),
        _ => None,
    };
    match hint {
        Some(hint) => anyhow!(error).context(hint),
        None => anyhow!(error),
    }
}

/// Whether `url` names a server on this machine (loopback address or `localhost`).
pub fn is_local_endpoint(url: &str) -> bool {
    let Ok(uri) = url.parse::<hyper::Uri>() else {
        return false;
    };
    let Some(host) = uri.host() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_endpoints_are_local() {
        for url in [
            "http://127.0.0.1:4567",
            "http://localhost:4567",
            "http://[::1]:4567",
            "https://127.0.0.2",
        ] {
            assert!(is_local_endpoint(url), "{url}");
        }
        for url in [
            "https://kinesis.us-east-1.amazonaws.com",
            "http://10.0.0.1:4567",
            "not a url",
        ] {
            assert!(!is_local_endpoint(url), "{url}");
        }
    }

    #[test]
    fn access_denied_and_key_schema_errors_say_what_to_do() {
        let denied = LeaseError::AccessDenied {
            op: "DescribeTable",
            message:
                "table app: service error: AccessDeniedException: User: arn:aws:iam::1:user/x \
                      is not authorized to perform: dynamodb:DescribeTable (HTTP 400)"
                    .into(),
        };
        let text = format!("{:#}", explain(denied, "app"));
        assert!(
            text.contains("dynamodb:DescribeTable, CreateTable"),
            "{text}"
        );
        assert!(text.contains("table/app"), "{text}");
        let schema = LeaseError::WrongKeySchema {
            table: "app".into(),
            found: "id (HASH)".into(),
        };
        let text = format!("{:#}", explain(schema, "app"));
        assert!(
            text.contains("not a lease table") && text.contains("--table"),
            "{text}"
        );
        assert!(text.contains("id (HASH)"), "{text}");
    }
}
