"""A MultiLang child that misbehaves on purpose, speaking the protocol by hand.

    python3 scripted.py MODE OUT

Every message it receives is appended to OUT as one line (`action shardId-or-count`),
and what it learns from flotilla's answers too. MODE:

    empty         nothing special (a processRecords with no records is logged as `processRecords 0`)
    beyond        checkpoints past the last record it was given; writes the answer
    garbage       prints text and unknown JSON to stdout before each status
    hang          never answers processRecords
    no-shard-end  answers shardEnded without checkpointing
    poison        raises (the child exits with a traceback) on a processRecords holding a
                  record whose data starts with "poison"; otherwise logs `processed DATA`
                  for each record
"""
import base64
import json
import sys

mode, out = sys.argv[1], sys.argv[2]


def log(text):
    with open(out, "a") as f:
        f.write(text + "\n")


def send(obj):
    sys.stdout.write("\n" + json.dumps(obj) + "\n")
    sys.stdout.flush()


def answer():
    while True:
        line = sys.stdin.readline()
        if not line:
            sys.exit(0)
        if line.strip():
            return json.loads(line)


log("started")
while True:
    line = sys.stdin.readline()
    if not line:
        break
    if not line.strip():
        continue
    message = json.loads(line)
    action = message["action"]
    if action == "processRecords":
        records = message["records"]
        log("processRecords %d" % len(records))
        if mode == "poison":
            datas = [base64.b64decode(r["data"]).decode() for r in records]
            if any(d.startswith("poison") for d in datas):
                raise ValueError("cannot handle the poison record")
            for d in datas:
                log("processed " + d)
        if mode == "hang":
            while True:
                sys.stdin.readline()
        if mode == "beyond" and records:
            last = int(records[-1]["sequenceNumber"])
            send({"action": "checkpoint", "sequenceNumber": str(last + 1000), "subSequenceNumber": 0})
            reply = answer()
            log("beyond-answer %s %s" % (reply.get("error"), reply.get("sequenceNumber")))
            send({"action": "checkpoint", "sequenceNumber": records[-1]["sequenceNumber"]})
            reply = answer()
            log("last-answer %s" % reply.get("error"))
    else:
        log(action + " " + str(message.get("shardId", "")))
        if action == "shardEnded" and mode != "no-shard-end":
            send({"action": "checkpoint", "sequenceNumber": None})
            reply = answer()
            log("shard-end-answer %s" % reply.get("error"))
        if action in ("initialize", "leaseLost"):
            send({"action": "checkpoint", "sequenceNumber": None})
            reply = answer()
            log("%s-checkpoint-answer %s" % (action, reply.get("error")))
    if mode == "garbage":
        print("a line that is not a message")
        send({"action": "log", "message": "not a protocol action"})
    send({"action": "status", "responseFor": action})
