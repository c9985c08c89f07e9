"""A once-a-second GPU snapshot of this host, from NVML, nvidia-smi, or neither.

``GpuProbe.snapshot()`` never raises. A missing library or driver means ``"source": "none"``
with a short reason naming why each source failed, never a crash; a single NVML field that
fails comes back as None and does not cost the others. Here: which source, when to look for
one again, and the snapshot; the sources are agent/host/gpu_nvml.py (NVML, with its event set for
Xid errors) and agent/host/gpu_smi.py (nvidia-smi's CSV, from a child killed on a timeout), each
filling one GPU's entry of agent/host/gpu_fields.py field for field.

pynvml (package ``nvidia-ml-py``) is optional and imported only inside the probe, so this
module imports the standard library alone. Runs on Python >= 3.9 (docs/COMPAT.md).

Snapshot::

    {"source": "nvml" | "nvidia-smi" | "none", "reason": str | None, "ts": time.time(),
     "gpus": [{"index": int, "name": str|None, "uuid": str|None, "util": int|None (%),
               "mem_used": int|None (bytes), "mem_total": int|None (bytes),
               "temp": int|None (C), "power": float|None (W), "power_limit": float|None (W),
               "sm_clock": int|None (MHz), "throttle": [str, ...]|None,
               "ecc_corrected": int|None, "ecc_uncorrected": int|None,
               "xid": [[ts, xid], ...]|None,
               "pids": [int, ...], "pid_mem": [[pid, bytes], ...]}]}

``throttle`` names the active clock throttle reasons (agent/host/gpu_nvml.py
``THROTTLE_REASONS``; ``gpu_idle`` alone means idle, not slowed). ``ecc_*`` are volatile
totals (since the driver loaded).
``xid`` lists the Xid errors NVML's event API delivered since the previous snapshot
(``[]``: none; None: events not available on this GPU). nvidia-smi gives none of these five
(None); they come from NVML only.

``pid_mem`` lists the processes whose GPU memory the driver reports (see agent/host/gpu_fields.py
``gpu_pids_memory``); it may be shorter than ``pids``.
"""

import time

from .gpu_nvml import open_nvml
from .gpu_smi import NvidiaSmi

__all__ = ["GpuProbe"]


class GpuProbe:
    """Takes GPU snapshots of this host. Not thread-safe: poll it from one worker thread.

    ``nvidia_smi``: the nvidia-smi to fall back on (name on PATH or a path).
    ``smi_timeout``: seconds before a hung nvidia-smi is killed (it can hang on a wedged GPU).
    ``clock``: monotonic seconds, for tests of the rediscovery back-off.
    """

    #: Seconds between attempts to find a GPU source after all of them failed.
    RETRY_S = 60.0
    #: Sooner retry when a source that worked stops working (a transient nvidia-smi hang).
    RETRY_AFTER_LOSS_S = 5.0

    def __init__(self, nvidia_smi="nvidia-smi", smi_timeout=2.0, clock=time.monotonic):
        self._smi = NvidiaSmi(nvidia_smi, smi_timeout)
        self._clock = clock
        self._nvml = None  # an Nvml (agent/host/gpu_nvml.py), once nvmlInit succeeded
        self._source = None  # "nvml" | "nvidia-smi" | None (not found yet)
        self._reason = None
        self._next_discovery = None  # clock time before which discovery is not retried

    @property
    def source(self):
        """The source in use, or None while none works."""
        return self._source

    def snapshot(self):
        """``{"source", "reason", "gpus", "ts"}`` for this host; never raises."""
        try:
            source, reason, gpus = self._take()
        except Exception as exc:  # a probe bug must not take the agent's poll loop down
            source, reason, gpus = "none", "GPU probe failed: %s: %s" % (type(exc).__name__, exc), []
        return {"source": source, "reason": reason, "gpus": gpus, "ts": time.time()}

    def close(self):
        """Releases NVML (``nvmlShutdown``); the next snapshot starts discovery again."""
        nvml, self._nvml = self._nvml, None
        self._source = None
        self._next_discovery = None
        if nvml is not None:
            nvml.close()

    # -- sources ---------------------------------------------------------------------------

    def _take(self):
        if self._source == "nvml":
            # Once NVML initialised it stays: a failing device call is per-field, and a
            # GPU that fell off the bus should show up as such, not as a source switch.
            return self._nvml.read()
        if self._source == "nvidia-smi":
            gpus, why = self._smi.read()
            if gpus is not None:
                return "nvidia-smi", None, gpus
            self._source = None
            self._reason = "no GPUs (nvidia-smi: %s)" % why
            self._next_discovery = self._clock() + self.RETRY_AFTER_LOSS_S
            return "none", self._reason, []
        if self._next_discovery is not None and self._clock() < self._next_discovery:
            return "none", self._reason, []
        return self._discover()

    def _discover(self):
        reasons = []
        why = self._init_nvml()
        if why is None:
            self._source = "nvml"
            return self._nvml.read()
        reasons.append("pynvml: " + why)
        gpus, why = self._smi.read()
        if gpus is not None:
            self._source = "nvidia-smi"
            return "nvidia-smi", None, gpus
        reasons.append("nvidia-smi: " + why)
        self._reason = "no GPUs (%s)" % "; ".join(reasons)
        self._next_discovery = self._clock() + self.RETRY_S
        return "none", self._reason, []

    def _init_nvml(self):
        """None once NVML is initialised, else a short reason."""
        nvml, why = open_nvml()
        if nvml is None:
            return why
        self._nvml = nvml
        nvml.register_xid()
        return None
