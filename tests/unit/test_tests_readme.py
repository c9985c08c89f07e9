"""tests/README.md's folder table names every folder of tests, one line each."""

import os
import re

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_folder_table_lists_every_folder_of_tests():
    with open(os.path.join(TESTS, "README.md")) as f:
        rows = re.findall(r"^\| `([\w-]+)/` \|", f.read(), re.M)
    folders = sorted(name for name in os.listdir(TESTS)
                     if os.path.isdir(os.path.join(TESTS, name))
                     and any(n.startswith("test_") and n.endswith(".py")
                             for n in os.listdir(os.path.join(TESTS, name))))
    assert sorted(rows) == folders
    assert len(rows) == len(set(rows)), rows
