"""What an agent sends, checked before the console believes it.

A host is not trusted to be well-formed: a broken or hostile agent can send JSON nested a
million deep, ``recs: [5]``, a record without its file id, a non-integer request id or a
supervisor state no agent has. :func:`parse` turns one line into a message whose every field
that RunState and NodeLink use has the type they expect, or raises
``protocol.ProtocolError`` with the reason (NodeLink shows it as the node's ``protocol
error`` and reconnects). Message kinds and fields: docs/PROTOCOL.md.
"""

from __future__ import annotations

import json

from agent.rules.kinds import integer
from agent.wire import protocol

# a supervisor's states (state.json ``state``; agent/supervisor/supervisor.py, agent/node/folder.py "lost")
SUPERVISOR_STATES = ("starting", "held", "running", "stopping", "restarting", "exited", "failed",
                     "stopped", "lost")
ENDED_STATES = ("exited", "failed", "stopped")
_INT, _NUM, _STR, _DICT = "a whole number", "a number", "text", "an object"
_LOSS = "a number or inf/nan"
# a `sample` record (agent/supervisor/ranksample.py): what the straggler and CPU rules may be handed
SAMPLE_RANKS_MAX = 1024  # worker processes on one node
SAMPLE_FR_MAX = 4096  # collectives a rank (the agent sends 64)
WHOLE_MAX = 2 ** 62  # ticks, pids, sequence numbers, offsets, steps, entry times in us
SECONDS_MAX = 2.0 ** 40  # CPU seconds, or seconds since 1970: past this it is garbage
WORLD_MAX = 2 ** 20  # ranks in one run: a world size is 1..WORLD_MAX, a rank below it
EXIT_RANGE = (-2 ** 31, 2 ** 31)  # exit codes: negative for a signal (Popen, torchrun)
NUMBER_MAX = 1e300  # any other number: finite and within this (a loss, a rate, bytes)
MAX_FRAME = 16 * 1024 * 1024  # bytes of journal one jbytes message may bring (as a line)


def parse(line: bytes) -> dict:
    """One message from an agent's line; ProtocolError (with the reason) if it is malformed.

    Usually means the host runs something that is not a matching rankdeck agent, or the
    agent is broken; the node's connection is dropped and made again.
    """
    msg = protocol.decode(line)  # ProtocolError for JSON nested too deeply too
    check(msg)
    return msg


def check(msg: dict) -> None:
    """Raise ProtocolError unless ``msg`` (a decoded message) is well-formed."""
    kind = msg.get("t")
    if kind == "res":
        _field(msg, "id", _INT, "an answer")
        if not isinstance(msg.get("ok"), bool):
            _bad("an answer's ok is %s, not true or false" % _what(msg.get("ok")))
        if msg["ok"]:
            _field(msg, "data", _DICT, "an answer", optional=True)
        else:
            _field(msg, "kind", _STR, "an error answer", optional=True)
    elif kind == "journal":
        _field(msg, "end", _INT, "a journal message")
        recs = msg.get("recs")
        if not isinstance(recs, list):
            _bad("a journal message's recs is %s, not a list" % _what(recs))
        for rec in recs:
            _record(rec)
    elif kind == "jbytes":
        _field(msg, "start", _INT, "a jbytes message")
        _field(msg, "n", _INT, "a jbytes message", span=(0, MAX_FRAME + 1))
        if msg.get("end") != msg["start"] + msg["n"]:
            _bad("a jbytes message's end is %s, not start + n" % _what(msg.get("end")))
    elif kind == "stream_end":
        _field(msg, "sub", _STR, "a stream_end message")
        _field(msg, "offset", _INT, "a stream_end message")
        _field(msg, "why", _STR, "a stream_end message")
    elif kind == "state":
        st = msg.get("state")
        if st is not None:
            _supervisor_state(st)
    elif kind == "gpu":
        snap = msg.get("snap")
        if snap is not None:
            if not isinstance(snap, dict):
                _bad("a gpu snapshot is %s, not an object" % _what(snap))
            gpus = snap.get("gpus")
            if gpus is not None and not (isinstance(gpus, list)
                                         and all(isinstance(g, dict) for g in gpus)):
                _bad("a gpu snapshot's gpus is not a list of objects")
            for i, gpu in enumerate(gpus or ()):  # the index keys a node's GPUs (telemetry)
                _field(gpu, "index", _INT, "a gpu snapshot's gpus[%d]" % i, optional=True,
                       span=(0, SAMPLE_RANKS_MAX))
        _field(msg, "host", _DICT, "a gpu message", optional=True)
    # other kinds (a newer agent's) are ignored by NodeLink


def journal_of_bytes(msg: dict, data: bytes) -> dict:
    """The ``journal`` message a ``jbytes`` message (checked) and its ``data`` (whole journal
    records from offset ``start``, agent/host/journal.py) amount to: each record ``[meta]`` or
    ``[meta, text]``, ``j`` in its meta, as ``journal`` messages bring them; ProtocolError
    (with the reason) for bytes that are not whole journal records."""
    try:
        records, used = protocol.split_records(data, msg["start"])
        if used != len(data):
            raise ValueError("a record cut short")
        recs = []
        for meta, body, start, _end in records:
            meta = json.loads(meta)
            meta["j"] = start  # as serve puts it in a journal message's metas
            recs.append([meta, protocol.bytes_to_text(body)] if body else [meta])
    except RecursionError:
        _bad("a journal record's meta nested too deeply")
    except (ValueError, AttributeError, TypeError) as exc:  # JSONDecodeError, a list's "j"
        _bad("a jbytes message holds no whole journal records: %s" % str(exc)[:200])
    out = {"t": "journal", "sub": msg.get("sub"), "end": msg["end"], "recs": recs}
    check(out)
    return out


def check_answer(op: str, data) -> None:
    """Raise ProtocolError unless ``data``, the answer to a request ``op``, has the shape the
    console reads (docs/PROTOCOL.md, "Requests and answers"). Answers of ops not listed here
    are objects, read with ``.get`` and cleaned where shown."""
    what = "the answer to %s" % op
    if not isinstance(data, dict):
        _bad("%s is %s, not an object" % (what, _what(data)))
    if op in ("start", "restart", "stop", "state"):
        _supervisor_state(data, what, extra=("missing",) if op == "state" else ())
        _field(data, "journal_size", _INT, what, optional=True)
        _field(data, "procs", _INT, what, optional=True)
        if data.get("folder") is not None and not isinstance(data["folder"], bool):
            _bad("%s has folder = %s, not true or false" % (what, _what(data["folder"])))
        if data.get("alive") is not None and not isinstance(data["alive"], bool):
            _bad("%s has alive = %s, not true or false" % (what, _what(data["alive"])))
        left = data.get("left")
        if left is not None and not (isinstance(left, list) and len(left) <= SAMPLE_RANKS_MAX
                                     and all(integer(p) for p in left)):
            _bad("%s has left = %s, not a list of pids" % (what, _what(left)))
        _field(data, "sweep", _DICT, what, optional=True)
    elif op == "subscribe":
        _field(data, "offset", _INT, what)
    elif op in ("store_start", "store_wait"):
        _field(data, "port", _INT, what, span=(1, 65536))
        _field(data, "pid", _INT, what, optional=True)
        _field(data, "addr", _STR, what, optional=True)
        _field(data, "note", _STR, what, optional=True)
    elif op == "listen":
        _field(data, "port", _INT, what, span=(1, 65536))
    elif op == "probe_tcp":
        if not isinstance(data.get("ok"), bool):
            _bad("%s has ok = %s, not true or false" % (what, _what(data.get("ok"))))
        _field(data, "ms", _NUM, what, optional=True)
        _field(data, "error", _STR, what, optional=True)
    elif op == "scrollback":
        recs = data.get("recs")
        if not isinstance(recs, list):
            _bad("%s has recs = %s, not a list" % (what, _what(recs)))
        for rec in recs:
            _record(rec)
        _field(data, "start", _INT, what)
    elif op in ("stacks", "why"):
        _stacks(data, what)
    elif op == "judge":  # the console asks it `why` only
        _verdict(data, what)
    elif op == "judge_start":
        _field(data, "port", _INT, what, span=(1, 65536))


def _stacks(data: dict, what: str) -> None:
    """A node's ranks and their stacks: ``{"ranks": [{"pid", "rank", ...}], ...}``."""
    for where, rank in _rank_list(data, what):
        _field(rank, "pid", _INT, where)
        _rank_fields(rank, where)
        for key in ("state", "method", "stack", "error"):
            _field(rank, key, _STR, where, optional=True)
        for key in ("sources", "fr"):
            _field(rank, key, _DICT, where, optional=True)


def _record(rec) -> None:
    if not isinstance(rec, list) or not 1 <= len(rec) <= 2:
        _bad("a journal record is %s, not [meta] or [meta, text]" % _what(rec))
    meta = rec[0]
    if not isinstance(meta, dict):
        _bad("a journal record's meta is %s, not an object" % _what(meta))
    if len(rec) == 2 and not isinstance(rec[1], str):
        _bad("a journal record's text is %s, not text" % _what(rec[1]))
    kind = meta.get("k")
    what = "a %r record" % kind if isinstance(kind, str) else "a journal record"
    for key in ("j", "o"):
        _field(meta, key, _INT, what, optional=True)
    _bounded(meta, "ts", what, SECONDS_MAX, optional=True)
    if kind in ("file", "data", "metric"):
        _field(meta, "f", _INT, what)
    if kind == "file":
        for key in ("attempt", "pid"):
            _field(meta, key, _INT, what, optional=True)
        _rank_fields(meta, what)
        _field(meta, "world_size", _INT, what, optional=True, span=(1, WORLD_MAX + 1))
        if integer(meta.get("rank")) and integer(meta.get("world_size")) \
                and meta["rank"] >= meta["world_size"]:
            _bad("%s has rank %d in a world of %d" % (what, meta["rank"], meta["world_size"]))
        for key in ("stream", "instance", "path"):
            _field(meta, key, _STR, what, optional=True)
    elif kind == "metric":
        _field(meta, "step", _INT, what, optional=True)
        _field(meta, "loss", _LOSS, what, optional=True)
        for key in ("lr", "step_time", "tok_s", "samples_s", "tflops"):
            _field(meta, key, _NUM, what, optional=True)
    elif kind in ("ckpt", "ckpt_gone", "ckpt_done", "resumed"):
        _field(meta, "f", _INT, what, optional=True)
        _field(meta, "step", _INT, what, optional=True)
        _field(meta, "bytes", _NUM, what, optional=True)
        _field(meta, "seconds", _NUM, what, optional=True)
        _field(meta, "path", _STR, what, optional=True)
        missing = meta.get("missing")
        if missing is not None and not (isinstance(missing, list)
                                        and all(isinstance(m, str) for m in missing)):
            _bad("%s has missing = %s, not a list of names" % (what, _what(missing)))
    elif kind == "sample":
        _sample(meta, what)
    elif kind == "event":
        _field(meta, "what", _STR, what)
        _field(meta, "report", _DICT, what, optional=True)
        _rank_fields(meta, what)  # worker_failed
        _field(meta, "exit_code", _INT, what, optional=True, span=EXIT_RANGE)
        _field(meta, "step", _INT, what, optional=True)  # the judge's (console/judgement/judged.py)
        for key in ("text", "node"):
            _field(meta, key, _STR, what, optional=True)
        _field(meta, "stall_after", _NUM, what, optional=True)
        if meta.get("verdict") is not None:
            _verdict(meta["verdict"], what)
        if meta["what"] == "ended":
            if meta.get("state") not in ENDED_STATES:
                _bad("an 'ended' event with the unknown state %s" % _what(meta.get("state")))
            _cause(meta.get("cause"), what)


def _sample(meta: dict, what: str) -> None:
    """A periodic sample of a node's ranks (docs/PROTOCOL.md, ``sample``)."""
    _bounded(meta, "tick", what, WHOLE_MAX, whole=True)
    _bounded(meta, "ts", what, SECONDS_MAX)
    _bounded(meta, "period", what, SECONDS_MAX)
    if not meta["period"] > 0:
        _bad("%s has period = %s, not more than 0" % (what, _what(meta["period"])))
    for where, rank in _rank_list(meta, what):
        _bounded(rank, "rank", where, WHOLE_MAX, whole=True)
        _bounded(rank, "pid", where, WHOLE_MAX, whole=True)
        for key in ("cpu_s", "cpu_after_s"):  # None: the worker was gone when read
            _bounded(rank, key, where, SECONDS_MAX, optional=True)
        for key in ("state", "fr_error"):
            _field(rank, key, _STR, where, optional=True)
        _entry_times(rank.get("fr"), where)


def _verdict(verdict, what: str) -> None:
    """Who is stuck, as agent/rules/verdict.py decides it (the judge's, or an answer to `judge`)."""
    where = what + "'s verdict"
    if not isinstance(verdict, dict):
        _bad("%s is %s, not an object" % (where, _what(verdict)))
    for key in ("kind", "summary"):
        _field(verdict, key, _STR, where)
    _field(verdict, "evidence", _DICT, where, optional=True)
    suspects = verdict.get("suspects")
    if not isinstance(suspects, list) or len(suspects) > SAMPLE_RANKS_MAX:
        _bad("%s has suspects = %s, not a list" % (where, _what(suspects)))
    for i, suspect in enumerate(suspects):
        at = "%s's suspects[%d]" % (where, i)
        if not isinstance(suspect, dict):
            _bad("%s is %s, not an object" % (at, _what(suspect)))
        _field(suspect, "rank", _INT, at, span=(0, WORLD_MAX))
        _field(suspect, "node", _STR, at)
        for key in ("frame", "source"):
            _field(suspect, key, _STR, at, optional=True)


def _rank_list(obj: dict, what: str):
    """(where, rank) for each object of ``obj["ranks"]``, a list of at most SAMPLE_RANKS_MAX."""
    ranks = obj.get("ranks")
    if not isinstance(ranks, list) or len(ranks) > SAMPLE_RANKS_MAX:
        _bad("%s has ranks = %s, not a list of at most %d" % (what, _what(ranks),
                                                              SAMPLE_RANKS_MAX))
    for i, rank in enumerate(ranks):
        where = "%s's ranks[%d]" % (what, i)
        if not isinstance(rank, dict):
            _bad("%s is %s, not an object" % (where, _what(rank)))
        yield where, rank


def _entry_times(rows, where: str) -> None:
    """``[[pg, seq, t_us], ...]`` or absent."""
    if rows is None:
        return
    if not isinstance(rows, list) or len(rows) > SAMPLE_FR_MAX:
        _bad("%s has fr = %s, not a list of at most %d" % (where, _what(rows), SAMPLE_FR_MAX))
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str)
                and all(_in_range(v, WHOLE_MAX, True) for v in row[1:])):
            _bad("%s has the fr entry %s, not [pg, seq, t_us]" % (where, _what(row)))


def _bounded(obj: dict, key: str, what: str, most, whole: bool = False,
             optional: bool = False) -> None:
    """``obj[key]`` is a number (a whole one if ``whole``) in [0, most]: not NaN, not
    infinite, not negative."""
    value = obj.get(key)
    if value is None and optional:
        return
    if not _in_range(value, most, whole):
        _bad("%s has %s %s, not %s from 0 to %s" % (
            what, key, "no value" if value is None else "= " + _what(value),
            _INT if whole else _NUM, "{:.3g}".format(most)))


def _in_range(value, most, whole: bool) -> bool:
    types = int if whole else (int, float)
    # NaN fails every comparison, so the range check refuses it too
    return isinstance(value, types) and not isinstance(value, bool) and 0 <= value <= most


def _supervisor_state(st, what: str = "a node's state", extra: tuple = ()) -> None:
    if not isinstance(st, dict):
        _bad("%s is %s, not an object" % (what, _what(st)))
    if st.get("state") not in SUPERVISOR_STATES + extra:
        _bad("%s has the unknown state %s" % (what, _what(st.get("state"))))
    for key in ("restarts", "max_restarts", "launches", "attempt", "pid"):
        _field(st, key, _INT, what, optional=True)
    _field(st, "exit_code", _INT, what, optional=True, span=EXIT_RANGE)
    _cause(st.get("cause"), what)


def _cause(cause, what: str) -> None:
    if cause is None:
        return
    if not isinstance(cause, dict):
        _bad("%s has a cause that is %s, not an object" % (what, _what(cause)))
    _field(cause, "message", _STR, what + "'s cause", optional=True)
    _field(cause, "rank", _INT, what + "'s cause", optional=True, span=(0, WORLD_MAX))


def _rank_fields(meta: dict, what: str) -> None:
    for key in ("rank", "local_rank"):
        _field(meta, key, _INT, what, optional=True, span=(0, WORLD_MAX))


def _field(obj: dict, key: str, kind: str, what: str, optional: bool = False,
           span: tuple = (0, WHOLE_MAX)) -> None:
    """``obj[key]`` is of ``kind``: a whole number in ``span`` (lowest included, highest not),
    a finite number (:data:`NUMBER_MAX` at most either way), text or an object."""
    value = obj.get(key)
    if value is None and optional:
        return
    if kind == _INT:  # the one test asked for, not all five: a few a record, every record
        ok = integer(value) and span[0] <= value < span[1]
    elif kind == _NUM:
        ok = _is_num(value) and -NUMBER_MAX <= value <= NUMBER_MAX  # NaN fails both
    elif kind == _LOSS:
        # inf and NaN pass: a diverged run's loss (state_ranks.py marks it); an int no float
        # can hold does not
        ok = isinstance(value, float) or integer(value) and abs(value) <= NUMBER_MAX
    else:
        ok = isinstance(value, str if kind == _STR else dict)
    if not ok:
        if value is None:
            _bad("%s has %s no value, not %s" % (what, key, kind))
        if kind == _INT and integer(value):
            _bad("%s has %s = %s, not from %d to %d" % (what, key, _what(value), span[0],
                                                         span[1] - 1))
        if kind == _NUM and _is_num(value):
            _bad("%s has %s = %s, not a finite number" % (what, key, _what(value)))
        _bad("%s has %s = %s, not %s" % (what, key, _what(value), kind))


def _is_num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _what(value) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _bad(reason: str):
    raise protocol.ProtocolError(reason)
