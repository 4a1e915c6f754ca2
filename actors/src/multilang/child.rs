//! [`MultiLangProcessor`]: a [`Processor`] that runs one child process per held lease
//! and speaks the MultiLangDaemon protocol to it, as the KCL's daemon does.
//!
//! Each call writes one action and reads the child's lines until its `status` for that
//! action, answering the `checkpoint` requests that come before it through the shard's
//! [`Checkpointer`] (manual mode: the child decides what is done). A checkpoint is
//! answered once it is written, as the KCL's synchronous checkpoint is, echoing the
//! request, with the KCL's exception name when refused. Lines that are not messages are
//! skipped and logged, as the daemon skips them (children print to stdout). The child
//! exiting, closing its stdout, a `status` for another action, or no line within the
//! watchdog (`timeoutInSeconds`, per line as in the daemon) fail the call, and with it
//! the shard, which restarts from its checkpoint with a new child. (The Java daemon
//! exits the whole process there, every shard with it.)
//!
//! As the daemon: `shardEnded` must be answered with a checkpoint at SHARD_END (no
//! sequence number, or the last record delivered) or the shard does not end (here: it
//! fails, and restarts, visibly); `shutdownRequested` is followed by `leaseLost`.
//!
//! The child's stderr goes to the log, a line each, with the shard id.
//!
//! While it waits for the child (to read an action, or to answer it), it tells the
//! shard's reader what it waits for (`processor::ProcessorWait`): a child that has not
//! answered for half its watchdog (30 s without one) shows as a stalled shard, with the
//! action, until it answers or the watchdog replaces it. [`ChildCommand::check`] finds
//! the program before any shard starts.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tracing::{info, warn};

use super::program::find_program;
use super::protocol::{CheckpointRefusal, CheckpointRequest, FromChild, ToChild};
use crate::model::{ExtendedSequenceNumber, ShardId};
use crate::processor::ProcessorWait;
use crate::protocol::{Batch, CheckpointError, Checkpointer, ShardInfo};
use crate::{Processor, ProcessorError};

/// How a child is started and watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildCommand {
    /// The program and its arguments (the properties' `executableName`, split).
    pub argv: Vec<String>,
    /// The longest a child may take to answer one action; `None`: no limit of its own
    /// (the reader's `processor_timeout` still fails a shard whose child never acks).
    /// Half of it (30 s without one) is when a child's silence shows as a stall.
    pub watchdog: Option<Duration>,
}

/// Runs a MultiLang record processor as a child process per shard.
pub struct MultiLangProcessor {
    command: Arc<ChildCommand>,
    shard: Option<ShardId>,
    /// Where the shard started, for a child started again after one that failed a batch
    /// (`[failure]` retries in the same processor; without it the shard restarts).
    started: Option<ShardInfo>,
    child: Option<Running>,
    /// The last record delivered, for a checkpoint without a sequence number.
    last_delivered: Option<ExtendedSequenceNumber>,
    /// The last checkpoint the child made: a lower one is refused, as the KCL does.
    last_checkpoint: Option<ExtendedSequenceNumber>,
    /// During `shardEnded`: the child checkpointed at SHARD_END.
    reached_shard_end: bool,
}

impl std::fmt::Debug for MultiLangProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLangProcessor")
            .field("command", &self.command)
            .field("shard", &self.shard)
            .field("running", &self.child.as_ref().and_then(|c| c.process.id()))
            .finish()
    }
}

struct Running {
    process: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

/// Why a call to the child failed (the shard restarts).
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// The child process could not be started (`executableName` empty, not found, not executable).
    #[error("cannot start {program:?}: {source}")]
    Spawn {
        /// The program as named by `executableName` (empty when it was empty).
        program: String,
        /// Why the operating system would not start it.
        source: std::io::Error,
    },
    /// The program `executableName` names cannot be run: not found (on `PATH`, or at
    /// its path), not a file, or not executable ([`ChildCommand::check`]).
    #[error("executableName: cannot run {program:?}: {why}")]
    NotRunnable {
        /// The program as `executableName` names it (empty when it was empty).
        program: String,
        /// Why it cannot be run, and what to do.
        why: String,
    },
    /// No child to talk to: an earlier call failed and killed it, or its pipes were missing.
    #[error("the child is not running (it failed earlier)")]
    NotRunning,
    /// Writing a message to the child's stdin failed (it has most likely exited).
    #[error("writing {action} to the child: {source}")]
    Write {
        /// The message being written (`processRecords`, `checkpoint`, …).
        action: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The child closed its stdout (exited) before its `status` for the action.
    #[error("the child closed its stdout while flotilla waited for its status for {action}{exit}")]
    Closed {
        /// The action whose status was awaited.
        action: &'static str,
        /// The child's exit status, as ` (exit status: 1)`, or empty when not known yet.
        exit: String,
    },
    /// Reading the child's stdout failed (or a line was not UTF-8).
    #[error("reading the child's stdout: {0}")]
    Read(std::io::Error),
    /// The child wrote a `status` or `checkpoint` message without a valid field it must carry
    /// (other lines that are not messages are skipped): a bug in the child.
    #[error(
        "the child wrote something that is not the protocol while flotilla waited for {action}: {error}"
    )]
    NotProtocol {
        /// The action whose status was awaited.
        action: &'static str,
        /// What is wrong with the line.
        error: super::protocol::LineError,
    },
    /// The child answered with a `status` for another action than the one sent: out of step.
    #[error("the child answered status for {got} while flotilla waited for {action}")]
    WrongStatus {
        /// The action sent.
        action: &'static str,
        /// The `responseFor` the child answered with.
        got: String,
    },
    /// The child wrote no line within the watchdog (`timeoutInSeconds`) while a status was awaited.
    #[error("the child wrote no line for {} while flotilla waited for its status for {action} (timeoutInSeconds)", humantime::format_duration(*.limit))]
    Timeout {
        /// The action whose status was awaited.
        action: &'static str,
        /// The watchdog, per line.
        limit: Duration,
    },
    /// The child answered `shardEnded` without checkpointing at SHARD_END, so the shard
    /// cannot end: a bug in the child's record processor.
    #[error(
        "the child answered shardEnded without checkpointing at SHARD_END; a MultiLang processor must call checkpoint() in shardEnded, or the shard never ends"
    )]
    NoShardEndCheckpoint,
}

impl ChildCommand {
    /// The program `executableName` names, found as the operating system will start it:
    /// a name with a `/` as a path (relative to the working directory), any other on
    /// `PATH`; it must be a file with an executable bit. Checked at start, so a missing
    /// or unrunnable program stops `flotilla multilang` naming it, instead of failing
    /// each shard as it starts.
    pub fn check(&self) -> Result<std::path::PathBuf, ChildError> {
        let Some(program) = self.argv.first() else {
            return Err(ChildError::NotRunnable {
                program: String::new(),
                why: "executableName is empty".to_owned(),
            });
        };
        let path = std::env::var_os("PATH").unwrap_or_default();
        let cwd = std::env::current_dir().unwrap_or_default();
        find_program(program, &path, &cwd).map_err(|why| ChildError::NotRunnable {
            program: program.clone(),
            why,
        })
    }
}

impl MultiLangProcessor {
    /// A processor for one shard that starts its child from `command` at `initialize`. The command
    /// is shared by every shard's processor.
    pub fn new(command: Arc<ChildCommand>) -> Self {
        Self {
            command,
            shard: None,
            started: None,
            child: None,
            last_delivered: None,
            last_checkpoint: None,
            reached_shard_end: false,
        }
    }

    fn start(&mut self, shard: &ShardId) -> Result<(), ChildError> {
        let Some((program, args)) = self.command.argv.split_first() else {
            return Err(ChildError::Spawn {
                program: String::new(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "executableName is empty",
                ),
            });
        };
        let mut process = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ChildError::Spawn {
                program: program.clone(),
                source,
            })?;
        let (Some(stdin), Some(stdout)) = (process.stdin.take(), process.stdout.take()) else {
            return Err(ChildError::NotRunning);
        };
        if let Some(stderr) = process.stderr.take() {
            let shard = shard.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    warn!(message = "MultiLang child wrote to stderr.", shard_id = %shard, line = %line);
                }
            });
        }
        info!(message = "MultiLang child started.", shard_id = %shard, program = %program, pid = process.id());
        self.child = Some(Running {
            process,
            stdin,
            stdout: BufReader::new(stdout).lines(),
        });
        Ok(())
    }

    /// Sends `message` and serves the child until its status for it.
    async fn call(
        &mut self,
        message: ToChild<'_>,
        checkpointer: Option<&Checkpointer>,
    ) -> Result<(), ChildError> {
        let result = self.exchange(message, checkpointer).await;
        if result.is_err() {
            // The shard restarts with a new child; this one must not live on.
            if let Some(mut child) = self.child.take() {
                let _ = child.process.start_kill();
            }
        }
        result
    }

    async fn exchange(
        &mut self,
        message: ToChild<'_>,
        checkpointer: Option<&Checkpointer>,
    ) -> Result<(), ChildError> {
        let action = message.action();
        let watchdog = self.command.watchdog;
        // Told to the shard's reader, which reports a wait past its stall time as a
        // stalled processor (with the action in the reason); per line, as the watchdog.
        let wait = ProcessorWait::current();
        let waiting = || {
            if let Some(wait) = &wait {
                wait.begin(
                    format!("the MultiLang child has not answered {action}"),
                    watchdog,
                );
            }
        };
        waiting();
        self.send(&message).await?;
        loop {
            waiting();
            let line = {
                let child = self.child.as_mut().ok_or(ChildError::NotRunning)?;
                let next = child.stdout.next_line();
                match watchdog {
                    Some(limit) => tokio::time::timeout(limit, next)
                        .await
                        .map_err(|_| ChildError::Timeout { action, limit })?,
                    None => next.await,
                }
                .map_err(ChildError::Read)?
            };
            if let Some(wait) = &wait {
                wait.end();
            }
            let Some(line) = line else {
                let exit = self.exit_status().await;
                return Err(ChildError::Closed { action, exit });
            };
            match FromChild::parse(&line) {
                Ok(None) => {}
                Ok(Some(FromChild::Status { response_for })) if response_for == action => {
                    return Ok(());
                }
                Ok(Some(FromChild::Status { response_for })) => {
                    return Err(ChildError::WrongStatus {
                        action,
                        got: response_for,
                    });
                }
                Ok(Some(FromChild::Checkpoint(request))) => {
                    let error = self.checkpoint(&request, action, checkpointer).await.err();
                    let reply = ToChild::Checkpoint {
                        request: &request,
                        error,
                    };
                    let line = reply.to_line();
                    self.write(line.as_bytes(), "checkpoint").await?;
                }
                Err(error) if error.is_skippable() => {
                    warn!(
                        message = "MultiLang child wrote a line that is not a message; skipped.",
                        shard_id = %self.shard_str(),
                        waiting_for = action,
                        %error,
                    );
                }
                Err(error) => return Err(ChildError::NotProtocol { action, error }),
            }
        }
    }

    async fn send(&mut self, message: &ToChild<'_>) -> Result<(), ChildError> {
        let line = message.to_line();
        self.write(line.as_bytes(), message.action()).await
    }

    async fn write(&mut self, bytes: &[u8], action: &'static str) -> Result<(), ChildError> {
        let child = self.child.as_mut().ok_or(ChildError::NotRunning)?;
        child
            .stdin
            .write_all(bytes)
            .await
            .map_err(|source| ChildError::Write { action, source })?;
        child
            .stdin
            .flush()
            .await
            .map_err(|source| ChildError::Write { action, source })
    }

    async fn exit_status(&mut self) -> String {
        let Some(child) = self.child.as_mut() else {
            return String::new();
        };
        match tokio::time::timeout(Duration::from_secs(1), child.process.wait()).await {
            Ok(Ok(status)) => format!(" ({status})"),
            _ => String::new(),
        }
    }

    /// Serves one checkpoint request, or says why the KCL would refuse it.
    async fn checkpoint(
        &mut self,
        request: &CheckpointRequest,
        action: &'static str,
        checkpointer: Option<&Checkpointer>,
    ) -> Result<(), CheckpointRefusal> {
        // During initialize and leaseLost the daemon has no checkpointer.
        let Some(checkpointer) = checkpointer else {
            return Err(CheckpointRefusal::InvalidState);
        };
        let asked = request
            .position()
            .map_err(|_| CheckpointRefusal::IllegalArgument)?;
        if action == "shardEnded" {
            // No sequence number, or the last record delivered: SHARD_END, which
            // flotilla writes once shardEnded is answered (with the children).
            let at_end = match &asked {
                None => true,
                Some(at) => self.last_delivered.as_ref().is_none_or(|last| at == last),
            };
            if at_end {
                self.reached_shard_end = true;
                return Ok(());
            }
        }
        let at = match asked.or_else(|| self.last_delivered.clone()) {
            Some(at) => at,
            // Nothing delivered yet: the largest permitted position is where the
            // shard started; nothing to move.
            None => return Ok(()),
        };
        if self.last_checkpoint.as_ref().is_some_and(|last| at < *last) {
            return Err(CheckpointRefusal::IllegalArgument);
        }
        let written = match checkpointer.checkpoint(at.clone()).await {
            Ok(()) => checkpointer.flush().await,
            Err(error) => Err(error),
        };
        match written {
            Ok(()) => {
                self.last_checkpoint = Some(at);
                Ok(())
            }
            Err(error) => Err(refusal(&error)),
        }
    }

    /// The shard this child serves, for log lines and errors ("?" before initialize).
    fn shard_str(&self) -> &str {
        self.shard.as_ref().map_or("?", |s| s.as_str())
    }

    fn failed(&self, error: ChildError) -> ProcessorError {
        ProcessorError::msg(format!(
            "shard {}: MultiLang child: {error}",
            self.shard_str()
        ))
    }
}

/// The KCL's name for why a checkpoint was refused.
fn refusal(error: &CheckpointError) -> CheckpointRefusal {
    match error {
        CheckpointError::LeaseLost { .. } | CheckpointError::ReaderGone { .. } => {
            CheckpointRefusal::Shutdown
        }
        CheckpointError::BeyondDelivered { .. } | CheckpointError::BeforeCheckpoint { .. } => {
            CheckpointRefusal::IllegalArgument
        }
        // The MultiLang protocol has no prepare; a processor outside manual mode cannot
        // prepare now.
        CheckpointError::PrepareNeedsManualMode { .. }
        | CheckpointError::PrepareNeedsOneLane { .. } => CheckpointRefusal::InvalidState,
        CheckpointError::NotWritten { .. } => CheckpointRefusal::Throttling,
    }
}

impl Processor for MultiLangProcessor {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        self.shard = Some(shard.shard_id.clone());
        self.started = Some(shard.clone());
        if let crate::model::Checkpoint::At(at) = &shard.starting_at {
            self.last_checkpoint = Some(at.clone());
        }
        self.start(&shard.shard_id).map_err(|e| self.failed(e))?;
        let message = ToChild::Initialize {
            shard_id: shard.shard_id.as_str(),
            starting_at: &shard.starting_at,
        };
        self.call(message, None).await.map_err(|e| self.failed(e))
    }

    async fn process(
        &mut self,
        batch: &Batch,
        checkpointer: &Checkpointer,
    ) -> Result<(), ProcessorError> {
        self.ensure_child().await?;
        if let Some(last) = batch.records().last() {
            self.last_delivered = Some(ExtendedSequenceNumber::new(
                last.sequence_number.clone(),
                last.sub_sequence_number,
            ));
        }
        let message = ToChild::ProcessRecords {
            records: batch.records(),
            millis_behind_latest: batch.millis_behind_latest(),
            received_at: std::time::SystemTime::now(),
        };
        // Manual mode: the host acks the batch when this returns (its window space is
        // freed); what counts as processed is what the child checkpointed.
        self.call(message, Some(checkpointer))
            .await
            .map_err(|e| self.failed(e))
    }

    async fn lease_lost(&mut self) {
        if let Err(error) = self.call(ToChild::LeaseLost, None).await {
            warn!(message = "MultiLang child did not finish leaseLost.", shard_id = %self.shard_str(), %error);
        }
        self.stop().await;
    }

    async fn shard_ended(&mut self, checkpointer: &Checkpointer) -> Result<(), ProcessorError> {
        self.ensure_child().await?;
        self.reached_shard_end = false;
        let mut result = self.call(ToChild::ShardEnded, Some(checkpointer)).await;
        if result.is_ok() && !self.reached_shard_end {
            result = Err(ChildError::NoShardEndCheckpoint);
        }
        self.stop().await;
        result.map_err(|e| self.failed(e))
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &Checkpointer,
    ) -> Result<(), ProcessorError> {
        self.ensure_child().await?;
        let result = self
            .call(ToChild::ShutdownRequested, Some(checkpointer))
            .await
            .map_err(|e| self.failed(e));
        // The daemon ends a child that was asked to shut down with leaseLost (its lease
        // is passed on); the client libraries end the processor there.
        if result.is_ok()
            && let Err(error) = self.call(ToChild::LeaseLost, None).await
        {
            warn!(message = "MultiLang child did not finish leaseLost.", shard_id = %self.shard_str(), %error);
        }
        self.stop().await;
        result
    }
}

impl MultiLangProcessor {
    /// The child that failed the last batch was ended: the failure policy (`[failure]`)
    /// goes on with a new one, initialized at the shard's last checkpoint, as a
    /// restarted shard's would be. Nothing before `initialize`.
    async fn ensure_child(&mut self) -> Result<(), ProcessorError> {
        if self.child.is_some() {
            return Ok(());
        }
        let Some(mut info) = self.started.clone() else {
            return Ok(());
        };
        if let Some(at) = &self.last_checkpoint {
            info.starting_at = crate::model::Checkpoint::At(at.clone());
        }
        Processor::initialize(self, &info).await
    }

    /// Closes the child's stdin (the client libraries end on it) and waits briefly for
    /// it to exit; kills it otherwise.
    async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        drop(child.stdin);
        if tokio::time::timeout(Duration::from_secs(5), child.process.wait())
            .await
            .is_err()
        {
            let _ = child.process.start_kill();
        }
    }
}
