//! `flotilla init`'s table options on the external DynamoDB servers of scripts/test.sh:
//! point-in-time recovery, which the in-process dynoxide lacks, on moto (which has it)
//! and DynamoDB Local (which may not: then the error must say so, naming the way out).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../actors/tests/support/servers.rs"]
mod servers;

use std::process::Output;

fn flotilla(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Point-in-time recovery on a new table (asked for: a loopback server gets it off by
/// default), then off again on the existing one.
fn point_in_time_recovery_on_then_off(endpoint: &str) -> Result<(), String> {
    let app = servers::unique_name("pitr");
    let run = |extra: &[&str]| {
        let mut args = vec!["init", "--table", &app, "--dynamodb-endpoint", endpoint];
        args.extend(extra);
        flotilla(&args)
    };
    let out = run(&["--point-in-time-recovery", "on"]);
    if !out.status.success() {
        return Err(text(&out.stderr));
    }
    let said = text(&out.stdout);
    assert!(
        said.contains("created; on-demand, point-in-time recovery on"),
        "{said}"
    );
    let out = run(&["--point-in-time-recovery", "off"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("already exists; on-demand, point-in-time recovery off"),
        "{said}"
    );
    Ok(())
}

#[test]
fn moto_turns_point_in_time_recovery_on_and_off() {
    let endpoint = servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT");
    point_in_time_recovery_on_then_off(&endpoint).unwrap();
}

#[test]
fn dynamodb_local_turns_it_on_or_says_it_cannot() {
    let endpoint = servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT");
    match point_in_time_recovery_on_then_off(&endpoint) {
        Ok(()) => eprintln!("DynamoDB Local: point-in-time recovery on and off"),
        Err(err) => {
            assert!(
                err.contains("was created, but point-in-time recovery could not be turned on")
                    && err.contains("--point-in-time-recovery off"),
                "{err}"
            );
            eprintln!("DynamoDB Local: no point-in-time recovery, said so: {err}");
        }
    }
}
