"""A fake agent `serve` that speaks the protocol until it is asked something, then answers
with one malformed line (chosen by argv[1]). Standard library only, like the real agent."""

import json
import sys

DEEP = 200000
BAD = {
    "deep": '{"t":"journal","end":1,"recs":' + "[" * DEEP + "]" * DEEP + "}",
    "recs5": '{"t":"journal","end":10,"recs":[5]}',
    "meta": '{"t":"journal","end":10,"recs":[["not an object","text"]]}',
    "file-no-f": '{"t":"journal","end":10,"recs":[[{"k":"file","rank":0,"stream":"stdout"}]]}',
    "id": '{"t":"res","id":"1","ok":true,"data":{}}',
    "state": '{"t":"state","state":{"state":"exploded"}}',
    "ended": '{"t":"journal","end":10,"recs":[[{"k":"event","what":"ended","state":"gone"}]]}',
    "sample-nan": '{"t":"journal","end":10,"recs":[[{"k":"sample","tick":5,"ts":50.0,'
                  '"period":10,"ranks":[{"rank":0,"pid":7,"cpu_s":NaN}]}]]}',
    "escape": '{"t":"res","id":1,"ok":false,"error":"bad \\u001b[2J\\u001b]0;pwned\\u0007 [/x]"}',
    # answers of the right id whose data has the wrong shape
    "answer-cause": '{"t":"res","id":1,"ok":true,"data":{"state":"running","cause":"boom"}}',
    "answer-left": '{"t":"res","id":1,"ok":true,"data":{"state":"stopped","left":"none"}}',
    "answer-ranks": '{"t":"res","id":1,"ok":true,"data":{"ranks":[{"pid":-3}]}}',
    # well-formed records, too many ranks for a node of 1 slot (console/model/ownership.py)
    "ranks-flood": json.dumps({"t": "journal", "end": 200, "recs": [
        [{"k": "file", "f": i + 1, "rank": i, "world_size": 16, "attempt": 0, "instance": "i",
          "local_rank": i, "stream": "stdout", "j": 100 + i}] for i in range(10)]}),
}


def send(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    mode = sys.argv[1]
    if mode == "silent":  # an agent that never says hello; it ends when its stdin closes
        for _ in sys.stdin:
            pass
        return
    if mode == "hello-deep":
        send(BAD["deep"])
        return
    send(json.dumps({"t": "hello", "proto": 1, "agent": "fake", "host": "h", "python": "3",
                     "pid": 1}))
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "subscribe":
            send(json.dumps({"t": "res", "id": req["id"], "ok": True,
                             "data": {"sub": "node0", "offset": 0}}))
        send(BAD[mode])


if __name__ == "__main__":
    main()
