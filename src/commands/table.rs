//! `flotilla init` and `flotilla destroy`: the lease table made with its options (and a
//! local stream, on a local Kinesis), or deleted with the application's consumers once
//! nothing live uses it.

use anyhow::{Context as _, bail};
use flotilla_actors::backend::aws::{Billing, KinesisStream, Service, TableOptions};
use flotilla_actors::backend::{
    StreamAdmin as _, StreamClient as _, StreamError, TableState, WorkerRows as _,
};

use super::command_limits;
use crate::cli::{BillingMode, DestroyArgs, InitArgs, OnOff, StreamArgs};
use crate::ops;

/// `flotilla destroy`: checks (the table, its protection, live owners, the operator's
/// confirmation) before anything is deleted; then the consumers, then the table.
pub(super) async fn destroy(args: DestroyArgs) -> anyhow::Result<()> {
    let name = &args.table.table;
    let table = args.table.client(&args.table.sdk().await);
    let protected = table
        .deletion_protected()
        .await
        .map_err(|e| ops::explain(e, name))
        .with_context(|| format!("cannot look up lease table {name}"))?;
    match protected {
        None if args.streams.is_empty() => {
            println!("lease table {name}: does not exist; nothing to delete");
            return Ok(());
        }
        Some(true) => bail!(
            "lease table {name} has deletion protection on, so it is left alone. Turn the \
             protection off where it was turned on (the CloudFormation stack's \
             DeletionProtectionEnabled, or `aws dynamodb update-table --table-name {name} \
             --no-deletion-protection-enabled`) and run this again"
        ),
        _ => {}
    }
    if protected.is_some() && args.force {
        ops::forced(&ops::scan(&table).await?, "deleting the lease table");
    }
    if protected.is_some() && !args.force {
        let scan = ops::scan(&table).await?;
        ops::refuse_while_alive(
            &table,
            scan,
            args.failover_time,
            &format!("delete lease table {name}"),
            "Stop them first and run this again. --force deletes anyway: the live workers then \
             lose their checkpoints and fail",
        )
        .await?;
    }
    let consumer = args.consumer_name.clone().unwrap_or_else(|| name.clone());
    if !args.yes {
        ops::confirm(
            &format!(
                "This deletes lease table {name} and every checkpoint in it{}. Type the table's \
             name to go on: ",
                if args.streams.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", and consumer {consumer} of stream(s) {}",
                        args.streams.join(", ")
                    )
                }
            ),
            name,
        )?;
    }
    for stream in &args.streams {
        let stream_args = StreamArgs {
            stream: stream.clone(),
            region: args.table.region.clone(),
            kinesis_endpoint: args.kinesis_endpoint.clone(),
        };
        let (client, arn) = stream_args.open().await?;
        match client.describe_stream_consumer(&arn, &consumer).await {
            Ok(found) => {
                client
                    .deregister_stream_consumer(&found.arn)
                    .await
                    .with_context(|| format!("cannot deregister consumer {consumer}"))?;
                println!("consumer {consumer} of stream {stream}: deregistered");
            }
            Err(StreamError::NotFound { .. }) => {
                println!("consumer {consumer} of stream {stream}: none registered");
            }
            Err(error) => {
                return Err(anyhow::Error::new(error))
                    .with_context(|| format!("cannot look up consumer {consumer}"));
            }
        }
    }
    if protected.is_none() {
        println!("lease table {name}: does not exist; nothing to delete");
        return Ok(());
    }
    let deleted = table
        .delete_table()
        .await
        .map_err(|e| ops::explain(e, name))
        .with_context(|| format!("cannot delete lease table {name}"))?;
    if deleted {
        println!(
            "lease table {name}: deleted, with its worker table {}",
            table.worker_table_name()
        );
    } else {
        println!("lease table {name}: already gone");
    }
    Ok(())
}

/// `flotilla init`: the lease table, and a local stream if asked.
pub(super) async fn init(args: InitArgs) -> anyhow::Result<()> {
    // Checked before anything is created: a refusal must leave nothing half done.
    let kinesis = match (&args.stream, &args.kinesis_endpoint) {
        (Some(stream), Some(endpoint)) if !ops::is_local_endpoint(endpoint) => bail!(
            "--stream creates streams on a local Kinesis only, and {endpoint} is not on \
             loopback. On AWS, create stream {stream} with your infrastructure code or \
             `aws kinesis create-stream --stream-name {stream} --shard-count {}`",
            args.shards
        ),
        (Some(stream), Some(endpoint)) => Some((stream.clone(), endpoint.clone())),
        _ => None,
    };
    let billing = match (args.billing_mode, args.read_capacity, args.write_capacity) {
        (None | Some(BillingMode::OnDemand), None, None) => Billing::OnDemand,
        (None | Some(BillingMode::OnDemand), _, _) => bail!(
            "--read-capacity and --write-capacity are for a provisioned table: add \
             --billing-mode provisioned, or leave them out for on-demand"
        ),
        (Some(BillingMode::Provisioned), Some(read), Some(write)) => {
            Billing::Provisioned { read, write }
        }
        (Some(BillingMode::Provisioned), _, _) => {
            bail!("--billing-mode provisioned needs both --read-capacity and --write-capacity")
        }
    };
    // A local server lacks point-in-time recovery, and a development table is deleted
    // and made again: both are off there unless asked for.
    let on_aws = !args
        .table
        .dynamodb_endpoint
        .as_deref()
        .is_some_and(ops::is_local_endpoint);
    let sdk = args.table.sdk().await;
    let name = &args.table.table;
    let table = args.table.client(&sdk);
    let options = TableOptions {
        billing,
        deletion_protection: args.deletion_protection.map_or(on_aws, OnOff::is_on),
        tags: args.tags.clone(),
    };
    let explain = |e| ops::explain(e, name);
    let state = table
        .ensure_table_with(&options)
        .await
        .map_err(explain)
        .with_context(|| format!("cannot make lease table {name}"))?;
    match state {
        TableState::Created => {
            if args.point_in_time_recovery.map_or(on_aws, OnOff::is_on) {
                table
                    .set_point_in_time_recovery(true)
                    .await
                    .map_err(explain)
                    .with_context(|| {
                        format!(
                            "lease table {name} was created, but point-in-time recovery could \
                             not be turned on (run again with --point-in-time-recovery off to \
                             go without)"
                        )
                    })?;
            }
        }
        // An existing table changes only where the command line says so.
        TableState::Existed => {
            if let Some(pitr) = args.point_in_time_recovery {
                table
                    .set_point_in_time_recovery(pitr.is_on())
                    .await
                    .map_err(explain)
                    .context("cannot change point-in-time recovery")?;
            }
            if let Some(protection) = args.deletion_protection {
                table
                    .set_deletion_protection(protection.is_on())
                    .await
                    .map_err(explain)
                    .context("cannot change deletion protection")?;
            }
            if !args.tags.is_empty() {
                table
                    .tag(&args.tags)
                    .await
                    .map_err(explain)
                    .context("cannot tag the table")?;
            }
        }
    }
    let now = table
        .table_settings()
        .await
        .map_err(explain)
        .with_context(|| format!("cannot describe lease table {name}"))?
        .ok_or_else(|| anyhow::anyhow!("lease table {name} disappeared after it was made"))?;
    let what = match state {
        TableState::Created => "created",
        TableState::Existed => "already exists",
    };
    let billed = match now.billing {
        Billing::OnDemand => "on-demand".to_owned(),
        Billing::Provisioned { read, write } => {
            format!("provisioned {read} RCU / {write} WCU")
        }
    };
    let on = |b: bool| if b { "on" } else { "off" };
    let pitr = now
        .point_in_time_recovery
        .map_or("not supported by this server", on);
    let note =
        if state == TableState::Existed && args.billing_mode.is_some() && now.billing != billing {
            " (billing left as it is: change it with UpdateTable)"
        } else {
            ""
        };
    println!(
        "lease table {name}: {what}; {billed}{note}, point-in-time recovery {pitr}, deletion \
         protection {}; heartbeats in {}",
        on(now.deletion_protection),
        table.worker_table_name()
    );
    if let Some((stream, endpoint)) = kinesis {
        let sdk = command_limits(&sdk, Service::Stream);
        let client = KinesisStream::new(&sdk, Some(&endpoint));
        let existing = match client.describe_stream_summary(&stream).await {
            Ok(summary) => Some(summary),
            Err(StreamError::NotFound { .. }) => None,
            Err(error) => {
                return Err(anyhow::Error::new(error))
                    .with_context(|| format!("cannot look up stream {stream} at {endpoint}"));
            }
        };
        let summary = match existing {
            Some(summary) => summary,
            None => {
                match client.create_stream(&stream, args.shards).await {
                    Ok(()) => {}
                    // Created by someone else since the look-up: as good.
                    Err(StreamError::InUse { .. }) => {}
                    Err(error) if error.to_string().contains("ResourceInUse") => {}
                    Err(error) => {
                        return Err(anyhow::Error::new(error)).with_context(|| {
                            format!("cannot create stream {stream} at {endpoint}")
                        });
                    }
                }
                println!("stream {stream}: created with {} shards", args.shards);
                return Ok(());
            }
        };
        let note = if summary.open_shard_count == args.shards {
            String::new()
        } else {
            format!(" (not {} as --shards asked; left as it is)", args.shards)
        };
        println!(
            "stream {stream}: already exists, {} open shards{note}",
            summary.open_shard_count
        );
    }
    Ok(())
}
