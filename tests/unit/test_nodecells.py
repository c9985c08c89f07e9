"""The nodes table's detail column fitted to its room (console/tui/nodecells.py): whole cells
or short ones with their unit, by importance, never a figure cut at the edge."""

from console.model.telemetry import row_cells
from console.tui.nodecells import fit_cells, short_form

ROW = {"gpu_util_min": 84.0, "gpu_util_mean": 86.0, "net_rx_gbps": 1.2, "net_tx_gbps": 0.9,
       "ib_rx_gbps": 182.0, "ib_tx_gbps": 181.0, "cpu_pct": 63.0, "tok_s": 66000.0}


def cells(row):
    return [(text, short_form(text, row), 0 if "alert" in cols else 1)
            for text, cols in row_cells(row)]


def test_short_forms_keep_their_units():
    texts = [text for text, _cols in row_cells(ROW)]
    assert [short_form(t, ROW) for t in texts] == [
        "gpu 86%", "net 1.2G", "ib 182G", "cpu 63%", "66k t/s"]
    assert short_form("throttled: hw_slowdown,power", ROW) == "throttled"


def test_the_most_important_cells_fit_whole_or_short_else_left_out():
    full = cells(ROW)
    assert fit_cells(full, None) == [(i, c[0]) for i, c in enumerate(full)]
    assert fit_cells(full, 7) == [(0, "gpu 86%")]
    assert fit_cells(full, 11) == [(0, "gpu 84/86%")]
    assert fit_cells(full, 24) == [(0, "gpu 84/86%"), (1, "net 1.2/0.9G")]
    assert fit_cells(full, 3) == []  # nothing whole fits: nothing, not "gpu"
    ranked = [("gpu 84/86%", "gpu 86%", 2), ("throttled: power", "throttled", 0)]
    assert fit_cells(ranked, 12) == [(1, "throttled")]  # bad news first


def test_every_room_gives_whole_cells_only():
    full = cells(ROW)
    forms = {f for c in full for f in c[:2]}
    for room in range(0, 80):
        got = fit_cells(full, room)
        assert all(text in forms for _i, text in got)
        assert sum(len(t) for _i, t in got) + 2 * max(0, len(got) - 1) <= room
