"""The run's figures as the judge serves them to Prometheus (``launch --prometheus``,
docs/PROMETHEUS.md): what the judge keeps beside its view (agent/rules/judge_view.py) from what
each node's supervisor forwards, and the metric families read from both.

Beside the view, fed where the view is fed (agent/judge/listen.py, under the judge's lock):
each rank's newest loss and tokens per second (``metric`` metas), each node's restarts (its
state.json's ``restarts``), GPUs (``telemetry`` metas: utilization and memory) and the newest
complete checkpoint (``ckpt_done`` metas). The view gives each rank's step, whether it is
stalled, and each node's state and connection. Everything a node sends is untrusted: a value
that is no finite number in range is left out, a node keeps at most :data:`MAX_GPUS` GPUs.

Every label value is masked with the run's secrets (the judge's Masker) before it is written:
the run id, node names and host addresses. Standard library only; Python >= 3.9.
"""

from ..rules.kinds import finite
from ..rules.prom_text import Family

MAX_GPUS = 64  # a node's GPUs kept; a host that reports more is cut there
MOST = float(1 << 62)  # no figure of a real run is larger; a larger one is a host's nonsense

# name, type, HELP: Prometheus's conventions (a counter ends in _total, base units, ratios 0-1)
RANK_STEP = ("rankdeck_rank_step", "gauge",
             "The newest training step the rank printed (its trainer's own count).")
RANK_LOSS = ("rankdeck_rank_loss", "gauge",
             "The rank's newest training loss, as its trainer printed it (NaN when it diverged).")
RANK_TOKS = ("rankdeck_rank_tokens_per_second", "gauge",
             "Tokens per second the rank last reported, as its trainer printed it.")
RANK_STALLED = ("rankdeck_rank_stalled", "gauge",
                "1 while the run's judge holds the rank stalled (no step for longer than its "
                "threshold), else 0.")
NODE_UP = ("rankdeck_node_up", "gauge",
           "1 while the node's supervisor is connected to the run's judge and the node has not "
           "ended, else 0.")
NODE_RESTARTS = ("rankdeck_node_restarts_total", "counter",
                 "Restarts of the node's launcher (torchrun) by rankdeck in this run.")
GPU_UTIL = ("rankdeck_node_gpu_utilization", "gauge",
            "The GPU's utilization as a ratio from 0 to 1 (NVML's or nvidia-smi's percent / "
            "100), sampled every 10 s by the node's supervisor.")
GPU_MEM = ("rankdeck_node_gpu_memory_used_bytes", "gauge",
           "GPU memory in use, in bytes, sampled every 10 s by the node's supervisor.")
GPU_MEM_TOTAL = ("rankdeck_node_gpu_memory_total_bytes", "gauge",
                 "The GPU's memory, in bytes.")
CKPT_STEP = ("rankdeck_checkpoint_last_step", "gauge",
             "The step of the run's newest complete checkpoint (every file written and "
             "settled).")
RUN_GOODPUT = ("rankdeck_run_goodput", "gauge",
               "The share of the run's wall time that trained, from 0 to 1 (docs/GOODPUT.md: "
               "the productive bucket over the wall, on the judge's clock).")
RUN_AT_RISK = ("rankdeck_run_work_at_risk_gpu_seconds", "gauge",
               "GPU-seconds since the run's newest complete checkpoint: what losing a node now "
               "would cost (one GPU a rank; Prometheus's base unit, seconds, not hours).")


class RunFigures:
    """What the judge keeps for its metrics beyond its view; fed by agent/judge/listen.py
    under the judge's lock, read by :func:`families` under it too."""

    def __init__(self):
        self.rank = {}  # (node, rank) -> {"loss": float, "tok_s": float}
        self.restarts = {}  # node -> restarts (state.json)
        self.gpus = {}  # node -> {index: {"util": ratio, "mem_used": bytes, "mem_total": bytes}}
        self.ckpt_step = None  # the newest complete checkpoint's step

    def apply(self, node, meta, view):
        """One forwarded journal meta of ``node``, after the view took it (its files say
        whose rank a metric is)."""
        kind = meta.get("k")
        if kind == "metric":
            rank = view.files.get((node, meta.get("f")))
            if rank is None:
                return
            got = self.rank.setdefault((node, rank), {})
            for key in ("loss", "tok_s"):
                value = _number(meta.get(key), nan_ok=key == "loss")
                if value is not None:
                    got[key] = value
        elif kind == "telemetry" and node in view.nodes:
            self.gpus[node] = _gpus(meta.get("gpu"))
        elif kind == "ckpt_done" and meta.get("complete") is True:
            step = meta.get("step")
            if _whole(step) and (self.ckpt_step is None or step > self.ckpt_step):
                self.ckpt_step = step

    def apply_state(self, node, st):
        """A node's state.json as its link forwards it: its restarts."""
        if isinstance(st, dict) and _whole(st.get("restarts")):
            self.restarts[node] = st["restarts"]


def families(run, view, figures, hosts, mask, goodput=None):
    """The run's metric families now: ``run`` its id, ``view`` the judge's RunView,
    ``figures`` its RunFigures, ``hosts`` {node: address}, ``mask`` a label value's masking
    (the judge's ``Masker.mask_text``), ``goodput`` the judge's goodput report
    (agent/judge/goodput.py; None: no goodput served). Ranks and nodes the view no longer holds (a cordoned
    node's) are left out, and their figures forgotten."""
    fams = {spec[0]: Family(*spec) for spec in (
        RANK_STEP, RANK_LOSS, RANK_TOKS, RANK_STALLED, NODE_UP, NODE_RESTARTS, GPU_UTIL,
        GPU_MEM, GPU_MEM_TOTAL, CKPT_STEP, RUN_GOODPUT, RUN_AT_RISK)}
    run_label = mask(str(run))

    def node_labels(node):
        return {"run": run_label, "node": mask(node), "host": mask(str(hosts.get(node) or ""))}

    for node in sorted(view.nodes):
        ns = view.nodes[node]
        labels = node_labels(node)
        fams[NODE_UP[0]].add(labels, 1 if ns.connected and not ns.ended else 0)
        fams[NODE_RESTARTS[0]].add(labels, figures.restarts.get(node, 0))
        for index, gpu in sorted(figures.gpus.get(node, {}).items()):
            gpu_labels = dict(labels, gpu=str(index))
            fams[GPU_UTIL[0]].add(gpu_labels, gpu.get("util"))
            fams[GPU_MEM[0]].add(gpu_labels, gpu.get("mem_used"))
            fams[GPU_MEM_TOTAL[0]].add(gpu_labels, gpu.get("mem_total"))
    kept = set()
    for rank in sorted(view.ranks):
        rs = view.ranks[rank]
        labels = dict(node_labels(rs.node), rank=str(rank))
        got = figures.rank.get((rs.node, rank), {})
        kept.add((rs.node, rank))
        fams[RANK_STEP[0]].add(labels, rs.step if _whole(rs.step) else None)
        fams[RANK_LOSS[0]].add(labels, got.get("loss"))
        fams[RANK_TOKS[0]].add(labels, got.get("tok_s"))
        fams[RANK_STALLED[0]].add(labels, 1 if rs.state == "stalled" else 0)
    fams[CKPT_STEP[0]].add({"run": run_label}, figures.ckpt_step)
    if goodput is not None:  # None before the run has a wall / before any rank stepped
        fams[RUN_GOODPUT[0]].add({"run": run_label}, goodput.get("goodput"))
        at_risk = goodput.get("work_at_risk_gpu_h")
        fams[RUN_AT_RISK[0]].add({"run": run_label}, at_risk * 3600 if isinstance(
            at_risk, (int, float)) else at_risk)
    for key in [k for k in figures.rank if k not in kept]:
        del figures.rank[key]
    for table in (figures.gpus, figures.restarts):
        for node in [n for n in table if n not in view.nodes]:
            del table[node]
    return list(fams.values())


def _gpus(snap):
    """{index: figures} of a GPU snapshot (agent/host/gpu.py), what is a number in range."""
    out = {}
    listed = snap.get("gpus") if isinstance(snap, dict) else None
    for gpu in listed if isinstance(listed, list) else []:
        if len(out) >= MAX_GPUS:
            break
        if not isinstance(gpu, dict) or not _whole(gpu.get("index")) or gpu["index"] > 1 << 16:
            continue
        util = _number(gpu.get("util"))
        out[gpu["index"]] = {
            "util": util / 100.0 if util is not None and util <= 100 else None,
            "mem_used": _number(gpu.get("mem_used")),
            "mem_total": _number(gpu.get("mem_total"))}
    return out


def _number(value, nan_ok=False):
    """``value`` if it is a number a figure can be (finite, 0 <= |value| < 2^62; a loss may be
    inf or NaN), else None."""
    if not finite(value):  # an int no float can hold too
        return value if nan_ok and isinstance(value, float) else None
    if abs(value) >= MOST or (value < 0 and not nan_ok):
        return None
    return value


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MOST
