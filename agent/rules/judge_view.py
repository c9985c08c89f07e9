"""What the run's judge knows (plain data, no I/O, no threads): a :class:`RunView` of the run's
nodes and ranks, reduced from what each node's supervisor forwards.

The judge (agent/judge/judge.py) feeds it with what each node's supervisor forwards of its journal
(the records' metas: files and their ranks, metrics, events) and of its state.json; a record
may cause an event at once (``stepping`` after a stall, ``diverged`` at a rank's first
non-finite loss, ``cordon proposed`` for a node in trouble again soon after its restart or a
GPU's Xid or ECC error: agent/rules/judge.py words each). The rules that read the view
every second are agent/rules/judge.py.

Times are the judge's own clock (when a record arrived), never a host's: nodes' clocks differ.
Standard library only; Python >= 3.9.
"""

from collections import deque

from . import rankcpu, rendezvous
from .judge import (CORDON_WITHIN_S, ENDED, cordon_proposal, event, gpu_proposal, how_it_ended,
                    nan_loss)
from .kinds import finite, whole
from .straggler import Stragglers

CASCADE_S = 30.0  # a worker failure this soon after another node's failure or restart is its echo


class RankView:
    def __init__(self, rank, node):
        self.rank = rank
        self.node = node
        self.state = "running"
        self.step = None
        self.last_progress = None  # judge time of its last step
        self.reports = False  # it has printed a step
        self.step_times = deque(maxlen=64)
        self.diverged = None  # the step of its first non-finite loss
        self.nan_streak = 0  # its metric records in a row with a non-finite loss
        self.busy = False  # its worker's CPU has advanced (a rank that prints no steps)


class NodeView:
    def __init__(self, name):
        self.name = name
        self.state = "starting"
        self.phase = None
        self.worker_failure = None
        self.cause = None
        self.connected = False
        self.restarting = False  # rankdeck restarts it: between `restarting` and `launched`
        self.restarted_at = None  # judge time its torchrun started again after that restart
        self.proposed_at = None  # restarted_at of the restart its cordon was proposed after
        self.gpu_proposed = set()  # (gpu, error) its cordon was proposed for
        # its host is flagged (agent/rules/fleet.py): its first trouble of this run proposes it
        self.flagged = False
        self.flag_proposed = False

    @property
    def ended(self):
        return self.state in ENDED


class RunView:
    """Nodes, ranks and the verdict's timing, as the judge has heard of them."""

    def __init__(self, nodes, stall_after, cordon_within_s=CORDON_WITHIN_S, flagged=()):
        self.nodes = {name: NodeView(name) for name in nodes}
        for name in flagged or ():
            if name in self.nodes:
                self.nodes[name].flagged = True
        self.cordon_within_s = float(cordon_within_s or 0)  # 0: no proposals
        self.ranks = {}
        self.files = {}  # (node, fid) -> rank
        self.stall_after = float(stall_after)
        self.verdict = None
        self.verdict_at = float("-inf")
        self.verdict_tries = 0
        self.world = None  # the world size the nodes' files say
        self.stragglers = Stragglers()  # from the supervisors' samples (agent/rules/straggler.py)
        self.rank_cpu = rankcpu.RankCpu()  # the same samples: silent ranks' CPU
        self.waiting = None  # the rendezvous waited in too long (agent/rules/rendezvous.py)
        self.disrupted = None  # (node, when) of the run's last worker failure or restart

    def cordon(self, out, into=None):
        """Node surgery (docs/SURGERY.md): ``out`` leaves the run with its ranks and files (no
        rule waits for it, the run's end does not count it); ``into`` (a spare) joins it."""
        self.nodes.pop(out, None)
        for rank in [r for r, rs in self.ranks.items() if rs.node == out]:
            del self.ranks[rank]
        for key in [k for k in self.files if k[0] == out]:
            del self.files[key]
        if into and into not in self.nodes:
            self.nodes[into] = NodeView(into)

    # -- what a node forwards --------------------------------------------------------------
    def apply(self, node, meta, now):
        """One forwarded journal meta; the events it causes (``stepping`` after a stall,
        ``diverged`` at a rank's first non-finite loss, ``cordon proposed``) as dicts."""
        kind = meta.get("k")
        if kind == "sample":
            return self._sampled(node, meta, now) if node in self.nodes else []
        if kind == "file" and node not in self.nodes:
            return []  # a cordoned node's last records: it is out of the run
        if kind == "file" and whole(meta.get("rank")) and whole(meta.get("f")):
            rank = meta["rank"]
            if whole(meta.get("world_size")) and 0 < meta["world_size"] <= 1 << 20:
                self.world = meta["world_size"]
            self.files[(node, meta["f"])] = rank
            rs = self.ranks.get(rank)
            if rs is None or rs.node != node or rs.state in ENDED:
                rs = self.ranks[rank] = RankView(rank, node)
            return []
        if kind == "metric":
            rank = self.files.get((node, meta.get("f")))
            rs = self.ranks.get(rank)
            if rs is None:
                return []
            return self._stepped(rs, meta, now)
        if kind == "event":
            what = meta.get("what")
            ns = self.nodes.get(node)
            if ns is None:
                return []
            if what == "worker_failed":
                ns.worker_failure = {"rank": meta.get("rank"), "exit_code": meta.get("exit_code")}
                # a failure that follows another node's within CASCADE_S is most likely that
                # one's echo (its peers' collectives fail with it): no trouble of this node
                echo = self.disrupted is not None and self.disrupted[0] != node \
                    and now - self.disrupted[1] <= CASCADE_S
                self.disrupted = (node, now)
                return [] if echo else cordon_proposal(self, node, "rank %s %s" % (
                    meta.get("rank"), how_it_ended(meta.get("exit_code"))), now)
            if what == "gpu_error":
                return gpu_proposal(self, node, meta.get("gpu"), meta.get("error"))
            if what == "restarting":
                ns.restarting = True
                self.disrupted = (node, now)
            elif what == "launched":
                ns.worker_failure = None
                if ns.restarting:
                    ns.restarting, ns.restarted_at = False, now
        return []

    def _sampled(self, node, meta, now):
        """A node's periodic sample: stragglers; whose CPU advanced, and in a run where no
        rank prints steps, the stalled ranks run again when one's does."""
        out = [event(what, self.ranks[r].node if r in self.ranks else node, r, text=text)
               for r, what, text in self.stragglers.add(meta, self.world)]
        moved = [r for r in self.rank_cpu.add(meta, at=now) if r in self.ranks]
        for r in moved:
            self.ranks[r].busy = True
        if moved and not any(rs.reports for rs in self.ranks.values()):
            for rs in self.ranks.values():
                if rs.state == "stalled":
                    rs.state = "running"
                    out.append(event("stepping", rs.node, rs.rank, text="rank %d %s"
                                     % (rs.rank, rankcpu.AGAIN_TEXT)))
        return out

    def _stepped(self, rs, meta, now):
        out = []
        loss = meta.get("loss")
        step = meta.get("step")
        nan, rs.nan_streak = nan_loss(meta, rs.nan_streak)
        if nan:
            if rs.diverged is None:
                rs.diverged = step if step is not None else rs.step
                out.append(event("diverged", rs.node, rs.rank, step=rs.diverged,
                                 text="rank %d diverged: loss %s at step %s"
                                 % (rs.rank, loss, rs.diverged)))
        if step is None:
            return out
        rs.step = step
        if finite(meta.get("step_time")) and meta["step_time"] >= 0:
            rs.step_times.append(meta["step_time"])
        rs.last_progress = now
        rs.reports = True
        for other in self.ranks.values():
            if other.state == "stalled" and (other is rs or not other.reports):
                other.state = "running"
                out.append(event("stepping", other.node, other.rank, step=step,
                                 text="rank %d stepping again (step %s)" % (other.rank, step)))
        return out

    def apply_state(self, node, st, now=None, stopping=()):
        """A node's state.json: its state, phase and cause; its ranks end with it. ``now``:
        the judge's time, into which the phase's ``since`` is moved (``st["sent"]``: the
        host's clock when its link read the file); without it the host's own. Returns a
        cordon proposal when the node just ended failed, unless it is in ``stopping`` (the
        judge ended it)."""
        ns = self.nodes.get(node)
        if ns is None or not isinstance(st, dict):
            return []
        was = ns.state
        ns.state = st.get("state") if isinstance(st.get("state"), str) else ns.state
        ns.phase = _phase_in(rendezvous.phase_of(st.get("phase")), ns.phase, st.get("sent"), now)
        ns.cause = st.get("cause") if isinstance(st.get("cause"), dict) else None
        if ns.ended:
            for rs in self.ranks.values():
                if rs.node == node:
                    rs.state = ns.state
        if ns.state != "failed" or was == "failed" or node in stopping or now is None:
            return []
        cause = (ns.cause or {}).get("message")
        return cordon_proposal(self, node, "it ended failed%s" % (
            ": %s" % cause if isinstance(cause, str) else ""), now)

    def alive_ranks(self):
        """rank -> node for every rank the run expects to answer (its node not ended)."""
        return {r: rs.node for r, rs in self.ranks.items()
                if rs.state in ("running", "stalled") and not self.nodes[rs.node].ended}


def _phase_in(phase, before, sent, now):
    """``phase`` with ``since`` in the judge's clock: as long ago as the host says, when it
    says when it sent it; else when the judge first heard of this phase."""
    if phase is None or now is None:
        return phase
    host_since = phase["since"]
    if host_since is not None and isinstance(sent, (int, float)) and not isinstance(sent, bool) \
            and abs(sent) < rendezvous.MOST:
        phase["since"] = now - max(0.0, sent - host_since)
    elif before is not None and all(before.get(k) == phase.get(k)
                                    for k in ("name", "round", "note")):
        phase["since"] = before["since"]
    else:
        phase["since"] = now
    return phase


