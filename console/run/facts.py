"""A host's preflight answer (agent/serve/preflight.py ``host_facts``), checked field by field
before anything judges or shows it: a host's answer is untrusted, and the checks compare,
count and format these fields (a list where a version string belongs would stop the whole
check with a TypeError, a string where a byte count belongs would be printed as one).

Each known field keeps its value only when it is of its kind (strings are already cleaned of
escapes by console/lines/sanitize.py); a field of another kind is left out and named, so the
check can say the host's answer was malformed. Unknown fields are left out silently (a newer
agent may send more). :func:`whole` and :func:`number` are also what `rankdeck hosts` reads a
host's answer with (console/run/fleet.py).
"""

from __future__ import annotations

from agent.rules import kinds

MAX_GPUS = 64
MAX_ITEMS = 64  # throttle reasons, Xid events, pids per GPU


def _text(v):
    return isinstance(v, str)


def _flag(v):
    return isinstance(v, bool)


def _maybe_flag(v):
    return v is None or isinstance(v, bool)


def _maybe_text(v):
    return v is None or isinstance(v, str)


def whole(v) -> bool:
    """A host's count, size, pid or start time: a whole number from 0 below 2**62."""
    return kinds.whole(v, (1 << 62) - 1)


def _maybe_whole(v):
    return v is None or whole(v)


def number(v) -> bool:
    """A host's figure (a time, a rate, a load): finite and under 1e18 either way, so it
    prints as a figure, not as hundreds of digits."""
    return kinds.finite(v) and abs(v) < 1e18


def _rate(v):
    return number(v) and v >= 0


FIELDS = {
    "hostname": _text, "hostname_resolves": _maybe_text, "hostname_error": _maybe_text,
    "time": number, "time_after": number, "agent_python": _text,
    "workdir": _text, "workdir_exists": _flag, "workdir_writable": _flag,
    "python_path": _maybe_text, "python_exists": _flag, "disk_free": _maybe_whole,
    "disk_dir": _text, "disk_write_mbps": _rate, "disk_write_error": _text,
    "gpu_source": _maybe_text, "gpu_reason": _maybe_text,
    "python": _text, "executable": _maybe_text, "torch": _maybe_text, "cuda": _maybe_text,
    "nccl": _maybe_text, "cuda_available": _flag, "cuda_devices": whole,
    "cuda_error": _text, "torch_error": _text, "python_error": _text,
    "script": _text, "script_module": _flag, "script_exists": _maybe_flag,
    "script_error": _text,
}
GPU_FIELDS = {"index": whole, "name": _maybe_text, "mem_free": _maybe_whole}
HEALTH_FIELDS = {
    "index": whole, "name": _maybe_text, "ecc_corrected": _maybe_whole,
    "ecc_uncorrected": _maybe_whole, "sm_clock": _maybe_whole, "retired_sbe": _maybe_whole,
    "retired_dbe": _maybe_whole, "retired_pending": _maybe_flag, "pcie_width": _maybe_whole,
    "pcie_width_max": _maybe_whole, "pcie_gen": _maybe_whole, "pcie_gen_max": _maybe_whole,
    "sm_clock_max": _maybe_whole,
}


def checked(raw) -> tuple[dict, list[str]]:
    """``(facts, malformed)``: the known fields of ``raw`` that are of their kind, and the
    names of those that were not (``["the answer"]`` when it is no object at all)."""
    if not isinstance(raw, dict):
        return {}, ["the answer"]
    facts, bad = _fields(raw, FIELDS, "")
    if "gpus" in raw:
        facts["gpus"], more = _gpu_list(raw["gpus"], GPU_FIELDS, "gpus")
        bad += more
    if "gpu_health" in raw:
        facts["gpu_health"], more = _gpu_list(raw["gpu_health"], HEALTH_FIELDS, "gpu_health",
                                              _lists)
        bad += more
    return facts, bad


def _fields(raw: dict, kinds: dict, where: str) -> tuple[dict, list[str]]:
    out, bad = {}, []
    for key, ok in kinds.items():
        if key in raw:
            if ok(raw[key]):
                out[key] = raw[key]
            else:
                bad.append(where + key)
    return out, bad


def _items(value) -> list:
    return [v for v in value[:MAX_GPUS] if isinstance(v, dict)] if isinstance(value, list) \
        else []


def _gpu_list(value, kinds: dict, name: str, more_of=None) -> tuple[list[dict], list[str]]:
    """A list of per-GPU objects: each kept with its fields of their kind (and what
    ``more_of(fields, item)`` adds); one without a whole ``index`` is left out."""
    if not isinstance(value, list):
        return [], [name]
    out, bad = [], []
    for item in _items(value):
        fields, more = _fields(item, kinds, name + ".")
        bad += more + ["%s.%s" % (name, key) for key in (more_of(fields, item) if more_of
                                                           else [])]
        if "index" in fields:
            out.append(fields)
    if len(out) < len(value[:MAX_GPUS]):
        bad.append(name + " (an entry that is not a GPU)")
    return out, sorted(set(bad))


def _lists(entry: dict, item: dict) -> list[str]:
    """A GPU's health lists into ``entry``: throttle reasons (strings), Xid events
    (``[time, code]``), pids (whole numbers), each at most MAX_ITEMS."""
    bad = []
    for key, ok in (("throttle", _text), ("pids", whole),
                    ("xid", lambda x: isinstance(x, list) and len(x) == 2 and number(x[0])
                     and whole(x[1]))):
        value = item.get(key)
        if value is None:
            continue
        if isinstance(value, list) and all(ok(v) for v in value):
            entry[key] = value[:MAX_ITEMS]
        else:
            bad.append(key)
    return bad
