#!/usr/bin/env python3
"""Stands between a MultiLang daemon (the Java KCL's, or `flotilla multilang`) and the
record processor it starts, and writes every line either side sends the other to
$FLOTILLA_KCL_TRANSCRIPT: one JSON object a line, {"pid", "n", "dir", "message"}, where
`dir` is "in" (daemon to processor) or "out" (processor to daemon) and `message` the
line as the processor read or wrote it, parsed. tests/kcl.rs compares the two daemons'
transcripts of the same records.

    executableName = PYTHON transcript.py PYTHON record_processor.py

Each line is written to the transcript before it is passed on, so the transcript's order
is the exchange's order (the protocol answers one message at a time).
"""
import json
import os
import subprocess
import sys
import threading

OUT = os.environ["FLOTILLA_KCL_TRANSCRIPT"]
LOCK = threading.Lock()
COUNT = [0]


def log(direction, raw):
    text = raw.decode("utf-8", "replace").rstrip("\n")
    try:
        message = json.loads(text)
    except ValueError:
        message = {"unparsed": text}
    with LOCK:
        COUNT[0] += 1
        with open(OUT, "a", encoding="utf-8") as f:
            f.write(json.dumps({"pid": os.getpid(), "n": COUNT[0], "dir": direction,
                                "message": message}) + "\n")


def main():
    child = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def upward():
        for line in iter(child.stdout.readline, b""):
            log("out", line)
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    relay = threading.Thread(target=upward, daemon=True)
    relay.start()
    for line in iter(sys.stdin.buffer.readline, b""):
        log("in", line)
        try:
            child.stdin.write(line)
            child.stdin.flush()
        except BrokenPipeError:
            break
    try:
        child.stdin.close()
    except BrokenPipeError:
        pass
    code = child.wait()
    relay.join(timeout=5)
    sys.exit(code)


if __name__ == "__main__":
    main()
