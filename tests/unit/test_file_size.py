"""No product file over 450 lines: a file is one job you can read in one sitting.

Hubs grew back within days of a split when nothing held them (console/run/run.py went from 521
to 848 lines with six jobs); a new feature goes into the folder of its process and concern
(docs/LAYOUT.md), not into the biggest file.
"""

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRODUCT = ("agent", "console", "trainer", "inventory")
LIMIT = 450


def product_files():
    for top in PRODUCT:
        for folder, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(folder, name)


def test_no_product_file_is_over_450_lines():
    sizes = {}
    for path in product_files():
        with open(path, encoding="utf-8") as f:
            sizes[os.path.relpath(path, REPO)] = sum(1 for _ in f)
    assert len(sizes) > 100  # the walk found the product
    over = sorted("%s: %d lines" % (p, n) for p, n in sizes.items() if n > LIMIT)
    assert over == [], "split by job (docs/LAYOUT.md):\n" + "\n".join(over)
