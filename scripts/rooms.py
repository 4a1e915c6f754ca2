#!/usr/bin/env python3
"""Room sizes: no production source file over 600 lines, no actor state over 15 fields.

Usage: scripts/rooms.py [REPO_ROOT]

Production lines are a file's lines before its `#[cfg(test)] mod name {` block (tests
live beside the code they test and do not count). Every `.rs` file under actors/src and
src/ is checked, except those EXCEPTIONS names, each with why it may be long: a flat file
that says one thing, read from top to bottom (a table of settings, one policy, one
codec, one in-memory server). A state struct is a struct whose name ends in `State`; its
fields are counted without comments. Exit 1 naming each file or struct over its limit,
and each exception that no longer needs to be one (so the list cannot rot).
Python 3 standard library only.
"""

import os
import re
import sys

MAX_LINES = 600
MAX_FIELDS = 15

# Files that may be longer than MAX_LINES, and why. Keep this list short: a file on it
# says one thing, and splitting it would scatter that one thing.
EXCEPTIONS = {
    "actors/src/settings.rs": "every setting, its default and its validation, one table read top to bottom",
    "actors/src/balance.rs": "the one lease-balancing policy: a pure decide() over observations",
    "actors/src/model/item.rs": "the lease table's item codec (every attribute, both ways)",
    "actors/src/backend/aws/dynamodb.rs": "the DynamoDB adapter's codec: each call's request and lenient answer decoding",
    "actors/src/backend/aws/kinesis.rs": "the Kinesis adapter's codec: each call's request and lenient answer decoding",
    "actors/src/backend/aws/dynamodb_streams.rs": "the DynamoDB Streams adapter's codec",
    "actors/src/backend/memory/stream.rs": "the in-memory Kinesis: one server's state, conditions and errors",
    "actors/src/backend/memory/lease_table.rs": "the in-memory lease table: one server's state, conditions and errors",
    "actors/src/backend/memory/table_stream.rs": "the in-memory DynamoDB Streams: one server's state and errors",
    "actors/src/lease_keeper/model.rs": "the keeper's model checker (test-only): the protocol as one stateright model",
}

TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
STATE = re.compile(r"(?:pub(?:\([^)]*\))?\s+)?struct\s+(\w*State)\s*(?:<[^>]*>)?\s*\{")
FIELD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?[a-z_][a-z0-9_]*\s*:", re.M)


def production(text):
    return TEST_MOD.split(text)[0]


def state_fields(prod):
    for m in STATE.finditer(prod):
        depth, i = 1, m.end()
        while depth and i < len(prod):
            depth += {"{": 1, "}": -1}.get(prod[i], 0)
            i += 1
        body = re.sub(r"//[^\n]*", "", prod[m.end():i - 1])
        yield m.group(1), len(FIELD.findall(body))


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems, sizes = [], []
    for top in ("actors/src", "src"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8") as f:
                    prod = production(f.read())
                lines = prod.count("\n")
                sizes.append((lines, rel))
                if lines > MAX_LINES and rel not in EXCEPTIONS:
                    problems.append(f"{rel}: {lines} production lines (limit {MAX_LINES}): split it by what it holds")
                if lines <= MAX_LINES and rel in EXCEPTIONS:
                    problems.append(f"{rel}: {lines} lines, no longer needs its exception: take it off EXCEPTIONS")
                for struct, fields in state_fields(prod):
                    if fields > MAX_FIELDS:
                        problems.append(f"{rel}: {struct} has {fields} fields (limit {MAX_FIELDS}): split the state into parts")
    for rel in EXCEPTIONS:
        if not os.path.exists(os.path.join(root, rel)):
            problems.append(f"{rel}: on EXCEPTIONS but gone: take it off")
    sizes.sort(reverse=True)
    largest = ", ".join(f"{rel} {n}" for n, rel in sizes if rel not in EXCEPTIONS)
    print(f"rooms: largest files not excepted: {', '.join(largest.split(', ')[:4])}")
    if problems:
        for p in problems:
            print(f"rooms: {p}")
        sys.exit(1)
    print(f"rooms: every production file <= {MAX_LINES} lines (but {len(EXCEPTIONS)} excepted), every *State <= {MAX_FIELDS} fields")


if __name__ == "__main__":
    main()
