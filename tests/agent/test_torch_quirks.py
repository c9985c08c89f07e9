"""agent/torchrun/quirks.py: which torch closes the job's rendezvous when its torchrun stops.

The installed torch (2.13) is read for real; torch 2.4's line is in a folder shaped like its
package (the suite has no torch 2.4; bench/compat.py runs the restart under it for real)."""

import os
import sys

import torch

from agent.torchrun import quirks as torch_quirks

TORCH_24_SHUTDOWN = '''
    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, is_restart: bool = False) -> None:
        if self._pcontext:
            self._pcontext.close(death_sig)
        if not is_restart and self._rdzv_handler:
            self._rdzv_handler.shutdown()
'''


def test_the_installed_torch_is_found_without_importing_it_and_does_not_close():
    folder = torch_quirks.torch_dir(sys.executable)
    assert folder == os.path.dirname(torch.__file__)
    assert os.path.exists(os.path.join(folder, *torch_quirks.AGENT_FILE))
    assert torch_quirks.closes_rendezvous_on_stop(folder) is False


def test_a_torch_whose_torchrun_closes_the_rendezvous_on_stop_is_told(tmp_path):
    path = tmp_path.joinpath("torch", *torch_quirks.AGENT_FILE)
    path.parent.mkdir(parents=True)
    path.write_text(TORCH_24_SHUTDOWN)
    assert torch_quirks.closes_rendezvous_on_stop(str(tmp_path / "torch")) is True


def test_no_torch_or_no_python_is_not_a_quirk(tmp_path):
    assert torch_quirks.torch_dir(str(tmp_path / "no-python")) is None
    assert torch_quirks.closes_rendezvous_on_stop(None) is False
    assert torch_quirks.closes_rendezvous_on_stop(str(tmp_path)) is False
