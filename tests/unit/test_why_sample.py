"""console/judgement/why.py: a node that did not answer the verdict's first sample is not asked again
(a cut host would cost each sample the whole request timeout), and is named unreachable."""

import asyncio
from types import SimpleNamespace

from console.judgement import why
from console.model.state import RunState


class Link:
    def __init__(self, name, answers):
        self.name, self.run_root, self.answers = name, "/r", answers
        self.host = SimpleNamespace(python="python3")
        self.asked = 0

    async def request(self, op, **_args):
        self.asked += 1
        if self.answers is None:
            raise TimeoutError("%s: why got no answer within 20 s" % self.name)
        return self.answers


class Ctl:
    def __init__(self, links):
        self.links = {link.name: link for link in links}
        self.state = RunState("r", [(n, n) for n in self.links])
        # the ranks the run knows alive (console/judgement/why.py expected_ranks: the saved status)
        self.record = {"status": {"nodes": [
            {"name": n, "ranks": [{"rank": i, "state": "running"}]}
            for i, n in enumerate(self.links)]}}

    async def gather_nodes(self, fn, names=None):
        names = list(names or self.links)
        results = await asyncio.gather(*(fn(self.links[n]) for n in names),
                                       return_exceptions=True)
        return dict(zip(names, results))


def test_a_silent_node_is_asked_once_and_named_unreachable():
    good = Link("node0", {"ranks": [{"rank": 0, "stack": "x"}]})
    cut = Link("node1", None)
    ctl = Ctl([good, cut])
    verdict = asyncio.run(why.take_verdict(ctl, gap=0))
    assert (good.asked, cut.asked) == (2, 1)
    assert verdict["kind"] == "unreachable", verdict
    assert "node1 unreachable" in verdict["summary"], verdict


def test_when_no_node_answers_the_second_sample_asks_nobody():
    cut = [Link("node0", None), Link("node1", None)]
    asyncio.run(why.take_verdict(Ctl(cut), gap=0))
    assert [link.asked for link in cut] == [1, 1]
