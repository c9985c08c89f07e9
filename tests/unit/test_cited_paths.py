"""Every path into the repository that the code, tests and docs cite exists.

Docstrings and docs/ say where things live (``agent/host/journal.py``, ``docs/JUDGE.md``); after
a file moves, a citation of its old path sends a reader to nothing. The moves of docs/LAYOUT.md
rewrote them from one map; this keeps them true.
"""

import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPS = ("agent", "console", "trainer", "inventory", "tests", "bench", "docs", "scripts")
# a path of the repo: one of its top folders, then names, ending in a file of a known kind; not
# the tail of a longer path (torch's .../elastic/agent/server/local_elastic_agent.py)
CITED = re.compile(r"(?<![\w./~<>-])((?:%s)/[\w/.-]*?\w\.(?:py|md|sh|tcss|yaml|toml|svg|json))(?![\w/])"
                   % "|".join(TOPS))


# paths a text names as examples, not as files of the repo: the user's own inventory (README's
# `cp inventory/cluster.example.yaml inventory/cluster.yaml`) and the agent copy's name patterns
EXAMPLES = {"inventory/cluster.yaml", "inventory/cluster.toml", "agent/NAME.py",
            "agent/PACKAGE/NAME.py"}
# files whose paths are test data (a sync's manifest, a crafted agent payload) or this test's own
DATA = {"tests/unit/test_sync_manifest.py", "tests/agent/test_bootstrap.py",
        "tests/unit/test_cited_paths.py"}


def tracked():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [n for n in out.stdout.decode().split("\0")
            if n.endswith((".py", ".md", ".toml", ".sh", ".tcss", ".yaml"))]


def citations():
    for name in tracked():
        path = os.path.join(REPO, name)
        if name in DATA or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                for m in CITED.finditer(line):
                    if m.group(1) not in EXAMPLES:
                        yield name, lineno, m.group(1)


def test_every_cited_path_exists():
    missing = ["%s:%d cites %s" % (name, lineno, cited) for name, lineno, cited in citations()
               if not os.path.exists(os.path.join(REPO, cited))]
    assert missing == [], "cited paths that do not exist:\n" + "\n".join(missing)


def test_the_check_sees_citations():
    # the pattern finds what docstrings write, or the test above could pass on nothing
    found = {cited for _name, _lineno, cited in citations()}
    assert "agent/host/journal.py" in found and "docs/SECURITY.md" in found
    assert len(found) > 100


# a section cited by its heading: docs/BENCHMARKS.md, "Ingest" (a heading that starts so)
SECTION = re.compile(r'(docs/[A-Z][\w-]*\.md), "([A-Za-z`][^"]*)"')


def headings(doc):
    with open(os.path.join(REPO, doc), encoding="utf-8") as f:
        return [plain(line.lstrip("#")) for line in f if line.startswith("#")]


def plain(text):
    return " ".join(text.replace("`", "").split())


def test_every_cited_section_exists():
    missing = []
    for name in tracked():
        if name in DATA:
            continue
        with open(os.path.join(REPO, name), encoding="utf-8", errors="replace") as f:
            # a citation may wrap onto the next line, of a comment too
            text = " ".join(re.sub(r"\n\s*#+\s*", " ", f.read()).split())
        for doc, section in SECTION.findall(text):
            if os.path.exists(os.path.join(REPO, doc)) and not any(
                    h.startswith(plain(section)) for h in headings(doc)):
                missing.append("%s cites %s, %r" % (name, doc, section))
    assert missing == [], "cited sections that do not exist:\n" + "\n".join(sorted(set(missing)))
