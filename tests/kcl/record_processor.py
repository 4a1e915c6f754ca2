#!/usr/bin/env python3
"""A record processor for the real Java KCL's MultiLangDaemon, written with the
amazon_kclpy module (v3 API) that comes with it (tests/kcl.rs starts the daemon with
this file as its `executableName`).

It appends one JSON line per record to $FLOTILLA_KCL_OUT, in the fields `flotilla run`
writes on stdout (shard_id, sequence_number, sub_sequence_number, partition_key, data)
plus the worker ($FLOTILLA_KCL_WORKER) and the time (`t`, seconds since the epoch), so
the tests read both kinds of worker alike; and one line per lifecycle call (`event`:
initialize with the position it starts after, checkpoint, checkpoint_error, lease_lost,
shard_ended, shutdown_requested). It checkpoints at the last record of every batch, at
its sub-sequence number (a KPL aggregate may be checkpointed in its middle).

$FLOTILLA_KCL_STOP_AT (optional): the data of a record after which this worker
checkpoints at that record and then neither delivers nor checkpoints anything more (a
cold migration's last position, in the middle of an aggregate if the record is in one).

stdout belongs to the MultiLang protocol: nothing else is written to it.
"""
import json
import os
import sys
import time

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

OUT = os.environ["FLOTILLA_KCL_OUT"]
WORKER = os.environ["FLOTILLA_KCL_WORKER"]
STOP_AT = os.environ.get("FLOTILLA_KCL_STOP_AT") or None


def emit(line):
    line["worker"] = WORKER
    line["t"] = time.time()
    # One write of a whole line in append mode: the lines of children of one worker
    # (one child per shard) do not interleave.
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


class RecordProcessor(processor.RecordProcessorBase):
    def __init__(self):
        self.shard = None
        self.stopped = False

    def initialize(self, initialize_input):
        self.shard = initialize_input.shard_id
        emit({"event": "initialize", "shard_id": self.shard,
              "sequence_number": initialize_input.sequence_number,
              "sub_sequence_number": initialize_input.sub_sequence_number})

    def process_records(self, process_records_input):
        last = None
        for record in process_records_input.records:
            if self.stopped:
                break
            try:
                data = record.binary_data.decode("utf-8")
            except UnicodeDecodeError:
                data = record.data
            emit({"shard_id": self.shard,
                  "sequence_number": record.sequence_number,
                  "sub_sequence_number": record.sub_sequence_number or 0,
                  "partition_key": record.partition_key,
                  "data": data})
            last = record
            if STOP_AT is not None and data == STOP_AT:
                self.stopped = True
        if last is not None:
            self.checkpoint(process_records_input.checkpointer,
                            last.sequence_number, last.sub_sequence_number)

    def checkpoint(self, checkpointer, sequence_number=None, sub_sequence_number=None):
        try:
            checkpointer.checkpoint(sequence_number, sub_sequence_number)
            emit({"event": "checkpoint", "shard_id": self.shard,
                  "sequence_number": sequence_number,
                  "sub_sequence_number": sub_sequence_number})
        except kcl.CheckpointError as error:
            emit({"event": "checkpoint_error", "shard_id": self.shard,
                  "sequence_number": sequence_number, "error": str(error.value)})
            sys.stderr.write("checkpoint error on %s: %s\n" % (self.shard, error.value))

    def lease_lost(self, lease_lost_input):
        emit({"event": "lease_lost", "shard_id": self.shard})

    def shard_ended(self, shard_ended_input):
        emit({"event": "shard_ended", "shard_id": self.shard})
        self.checkpoint(shard_ended_input.checkpointer)

    def shutdown_requested(self, shutdown_requested_input):
        # Every delivered record was checkpointed with its batch: nothing to add (and a
        # worker that stopped at STOP_AT must not move past it).
        emit({"event": "shutdown_requested", "shard_id": self.shard})


if __name__ == "__main__":
    kcl.KCLProcess(RecordProcessor()).run()
