"""Per-node telemetry in the console: the flat row, the odd node out, hardware events."""

from console.model.state import RunState
from console.model import telemetry
from console.model.telemetry import far_nodes, hardware_events, node_telemetry, row_cells


def gpu(index, util=90, **extra):
    return dict({"index": index, "util": util, "mem_used": 10 << 30, "mem_total": 80 << 30,
                 "temp": 60, "power": 300.0, "throttle": ["gpu_idle"], "ecc_corrected": 0,
                 "ecc_uncorrected": 0, "xid": []}, **extra)


def host(rx=10.0, tx=9.0, cpu=20.0, eth_up=True, ib_up=True):
    return {"cpu_pct": cpu, "mem_used": 4 << 30, "mem_total": 16 << 30, "load": [2.5, 2, 1],
            "net": [{"iface": "eth0", "up": eth_up, "rx_gbps": rx, "tx_gbps": tx}],
            "net_rx_gbps": rx, "net_tx_gbps": tx,
            "ib": [{"port": "mlx5_0/1", "state": "ACTIVE" if ib_up else "DOWN", "up": ib_up,
                    "rx_gbps": 100.0, "tx_gbps": 50.0}],
            "disk": {"dev": "nvme0n1", "read_mbs": 12.5, "write_mbs": 300.0}}


def test_node_row_folds_gpus_host_and_ranks():
    class Rank:
        def __init__(self, step_time, tok_s):
            self.step_time, self.tok_s = step_time, tok_s

    snap = {"gpus": [gpu(0, 80), gpu(1, 100, temp=71, throttle=["sw_thermal"])]}
    row = node_telemetry(snap, host(), [Rank(0.5, 1000.0), Rank(0.7, 900.0), Rank(None, None)])
    assert (row["gpu_util_min"], row["gpu_util_mean"]) == (80, 90.0)
    assert (row["gpu_mem_used"], row["gpu_mem_total"]) == (20 << 30, 160 << 30)
    assert (row["net_rx_gbps"], row["net_tx_gbps"], row["ib_rx_gbps"]) == (10.0, 9.0, 100.0)
    assert (row["step_time"], row["tok_s"], row["cpu_pct"], row["load1"]) == (0.6, 1900.0,
                                                                              20.0, 2.5)
    assert (row["disk_read_mbs"], row["disk_write_mbs"]) == (12.5, 300.0)
    assert row["gpu_temp_max"] == 71 and row["throttle"] == ["sw_thermal"]
    assert row["xid_count"] == 0 and row["links_down"] == []


def test_junk_from_a_host_reads_as_none():
    row = node_telemetry({"gpus": [{"util": "lots", "xid": None}, 5]},
                         {"cpu_pct": True, "net_rx_gbps": float("nan"), "load": "high",
                          "ib": "x", "disk": [1], "net": [{"up": False, "iface": "eth9"}]})
    assert row["gpu_util_min"] is None and row["cpu_pct"] is None
    assert row["net_rx_gbps"] is None and row["load1"] is None and row["ib_rx_gbps"] is None
    assert row["xid_count"] is None and row["links_down"] == ["eth9"]
    assert node_telemetry(None, None)["gpu_util_mean"] is None


def test_far_node_stands_out_and_close_ones_do_not():
    rows = {"n0": {"gpu_util_mean": 95, "net_rx_gbps": 40.0, "step_time": 0.50},
            "n1": {"gpu_util_mean": 93, "net_rx_gbps": 41.0, "step_time": 0.52},
            "n2": {"gpu_util_mean": 96, "net_rx_gbps": 39.5, "step_time": 0.49},
            "n3": {"gpu_util_mean": 40, "net_rx_gbps": 4.0, "step_time": 0.51}}
    assert far_nodes(rows) == {"n0": set(), "n1": set(), "n2": set(),
                               "n3": {"gpu_util_mean", "net_rx_gbps"}}
    # two nodes have no "others" to be far from
    assert far_nodes({"a": {"cpu_pct": 5}, "b": {"cpu_pct": 95}}) == {"a": set(), "b": set()}


def test_hardware_events_between_two_messages():
    old = {"gpus": [gpu(0), gpu(1)]}
    new = {"gpus": [gpu(0, xid=[[1.0, 79]], ecc_uncorrected=2),
                    gpu(1, throttle=["gpu_idle", "hw_thermal"], ecc_corrected=1)]}
    assert hardware_events(old, new, host(), host(eth_up=False, ib_up=False)) == [
        ("xid", "GPU 0: Xid 79"),
        ("ecc", "GPU 0: 2 new uncorrected ECC errors (2 since the driver loaded)"),
        ("ecc", "GPU 1: 1 new corrected ECC error (1 since the driver loaded)"),
        ("throttle", "GPU 1: throttling (hw_thermal)"),
        ("link down", "eth0 is down"),
        ("link down", "mlx5_0/1 is down"),
    ]
    # the first message: nothing to compare with but its Xids; a link already down is no news
    assert hardware_events(None, new, None, host(eth_up=False)) == [("xid", "GPU 0: Xid 79")]
    assert hardware_events(new, new, host(eth_up=False), host(eth_up=False)) == [
        ("xid", "GPU 0: Xid 79")]


def test_run_state_logs_hardware_events_and_reports_host_in_status():
    state = RunState("r1", [("node0", "10.0.0.1"), ("node1", "10.0.0.2")])
    state.apply_telemetry("node0", {"gpus": [gpu(0)]}, host())
    state.apply_telemetry("node0", {"gpus": [gpu(0, xid=[[5.0, 48]])]},
                          host(eth_up=False))
    assert [(e.node, e.kind, e.text) for e in state.events] == [
        ("node0", "xid", "GPU 0: Xid 48"), ("node0", "link down", "eth0 is down")]
    nodes = {n["name"]: n for n in state.status()["nodes"]}
    assert nodes["node0"]["host"]["net_rx_gbps"] == 10.0
    assert nodes["node0"]["host"]["links_down"] == ["eth0"]
    assert nodes["node1"]["host"] is None  # no telemetry came yet


def test_row_cells_say_only_what_the_host_gave():
    row = node_telemetry({"gpus": [gpu(0, 80), gpu(1, 100)]}, host(rx=41.23, tx=0.05, cpu=23.4))
    assert [text for text, _cols in row_cells(row)] == [
        "gpu 80/90%", "net 41.2/0.05G", "ib 100/50.0G", "cpu 23%"]
    assert [text for text, _cols in row_cells(node_telemetry(None, {"cpu_pct": 5.0}))] == [
        "cpu 5%"]
    down = row_cells(node_telemetry({"gpus": [gpu(0, throttle=["hw_thermal"])]},
                                    host(ib_up=False)))
    assert down[-2:] == [("throttled: hw_thermal", ("alert",)), ("down: mlx5_0/1", ("alert",))]


def test_gpu_panel_shows_host_line_and_gpu_health():
    from console.tui.gpu import node_gpu_lines

    state = RunState("r1", [("node0", "10.0.0.1")])
    state.apply_telemetry("node0", {"gpus": [
        gpu(0, sm_clock=1980, throttle=["gpu_idle"]),
        gpu(1, sm_clock=1410, throttle=["hw_thermal"], ecc_uncorrected=2)]},
        host(rx=41.23, tx=40.8, eth_up=False))
    lines = ["".join(text for text, _style in line)
             for line in node_gpu_lines(state, "node0", [])]
    assert lines[1] == ("  cpu 20%  mem 4.0/16.0G  load 2.5  net 41.2↓ 40.8↑ Gb/s"
                        "  ib 100↓ 50↑ Gb/s  disk 12r 300w MB/s  down: eth0")
    assert lines[2].endswith("300/-W  1980MHz") and "ECC" not in lines[2]
    assert lines[3].endswith("300/-W  1410MHz  hw_thermal  ECC 2")
    state.nodes["node0"].host = None  # an older agent: no host line, GPU lines as before
    assert len(node_gpu_lines(state, "node0", [])) == 3


def test_a_nodes_hardware_columns_are_made_once_for_each_sample(monkeypatch):
    """The nodes table redraws every node's row several times a second; the hardware part
    of a row changes only when the node sends a sample (once a second)."""
    made = []
    real = telemetry.hardware_row
    monkeypatch.setattr(telemetry, "hardware_row", lambda s, h: made.append(1) or real(s, h))

    class Rank:
        step_time, tok_s = 0.5, 1000.0

    state = RunState("r1", [("node0", "10.0.0.1")])
    ns = state.nodes["node0"]
    snap = {"gpus": [gpu(0, 80)]}
    state.apply_telemetry("node0", snap, host())
    assert len(made) == 1
    rows = [telemetry.node_row(ns, [Rank()]) for _ in range(5)]
    assert len(made) == 1
    assert rows[0] == node_telemetry(snap, host(), [Rank()])  # the same row as made afresh
    assert list(rows[0]) == list(node_telemetry(snap, host(), [Rank()]))  # column order too
    made.clear()
    state.apply_telemetry("node0", {"gpus": [gpu(0, 20)]}, host())
    assert len(made) == 1  # the new sample
    assert telemetry.node_row(ns)["gpu_util_min"] == 20
    ns.gpu = {"gpus": [gpu(0, 55)]}  # set directly (as a resumed attach or a test may)
    assert telemetry.node_row(ns)["gpu_util_min"] == 55
