#!/usr/bin/env python3
"""A no-op record processor for benches/kcl.rs: the same child under the Java KCL's
MultiLangDaemon and under `flotilla multilang`, to compare the two daemons' MultiLang
throughput (written with the amazon_kclpy module, v3 API, that comes with the KCL's wheel).

It does nothing per record. Per batch it checkpoints once, at the batch's last record,
then appends one JSON line to $FLOTILLA_KCL_OUT: {"event": "batch", "shard_id", "n" (the
batch's records), "worker" ($FLOTILLA_KCL_WORKER), "t" (seconds since the epoch, after the
checkpoint was answered)}. The bench sums `n` to know when a backlog is all delivered.

`--stall SECONDS` (argument): initialize sleeps that long, then appends {"event": "ready",
"shard_id", "worker", "t"}: meanwhile the daemon reads ahead (the KCL's prefetch, flotilla's
window), so that the batches after it measure the daemon and the pipe, not the stream.

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
STALL = float(sys.argv[sys.argv.index("--stall") + 1]) if "--stall" in sys.argv else 0.0


def emit(line):
    line["worker"] = WORKER
    line["t"] = time.time()
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


class NoopProcessor(processor.RecordProcessorBase):
    def __init__(self):
        self.shard = None

    def initialize(self, initialize_input):
        self.shard = initialize_input.shard_id
        if STALL > 0:
            time.sleep(STALL)
            emit({"event": "ready", "shard_id": self.shard})

    def process_records(self, process_records_input):
        records = process_records_input.records
        if not records:
            return
        last = records[-1]
        try:
            process_records_input.checkpointer.checkpoint(
                last.sequence_number, last.sub_sequence_number)
        except kcl.CheckpointError:
            pass  # the lease moved on; the batch is counted all the same
        emit({"event": "batch", "shard_id": self.shard, "n": len(records)})

    def lease_lost(self, lease_lost_input):
        pass

    def shard_ended(self, shard_ended_input):
        try:
            shard_ended_input.checkpointer.checkpoint()
        except kcl.CheckpointError:
            pass

    def shutdown_requested(self, shutdown_requested_input):
        pass


if __name__ == "__main__":
    kcl.KCLProcess(NoopProcessor()).run()
