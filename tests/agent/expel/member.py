"""Nodes of a real torch c10d rendezvous, for tests/agent/test_expel.py.

``python member.py ENDPOINT --rdzv-backend c10d --rdzv-id RUN --local-addr ADDR [--spare ADDR]``
(torchrun's own flags, so agent/surgery/expel.py reads this process as it reads a torchrun): one
node (ADDR, this pid) joins a 2-node rendezvous and prints ``joined``. With ``--spare``, a
line on stdin makes it join again (what torchrun does when its workers fail) beside a second
node of this process (the spare): ``round N: ADDR, ADDR`` once that round completes.
Keep-alive 60 s x 3: without an expel, a killed node's entry would stay for 3 minutes.
"""

import sys
import threading

from agent.surgery.expel import flag
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler


def handler(addr):
    return get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=sys.argv[1], run_id=flag(sys.argv, ["--rdzv-id"]),
        min_nodes=2, max_nodes=2, local_addr=addr, is_host="false",
        keep_alive_interval="60", keep_alive_max_attempt="3", join_timeout="60"))


def main():
    me = handler(flag(sys.argv, ["--local-addr"]))
    me.next_rendezvous()
    print("joined", flush=True)
    spare_addr = flag(sys.argv, ["--spare"])
    if not spare_addr:
        threading.Event().wait()  # until killed
    sys.stdin.readline()
    spare = handler(spare_addr)
    joining = threading.Thread(target=spare.next_rendezvous)
    joining.start()
    me.next_rendezvous()
    joining.join()
    state = me._state_holder.state  # torch's own view: who is in the round
    print("round %d: %s" % (state.round, ", ".join(sorted(n.addr for n in state.participants))),
          flush=True)


if __name__ == "__main__":
    main()
