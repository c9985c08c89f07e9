"""The one-line sync progress shown while code goes to the hosts."""

from console.launch.sync import SyncProgress, progress_line


def test_progress_line_names_every_host_with_files_and_bytes():
    line = progress_line({
        "node0": SyncProgress("sending", 12, 40, 3_100_000, 8_000_000),
        "node1": SyncProgress("unchanged"),
        "node2": SyncProgress("done", 40, 40, 8_000_000, 8_000_000),
        "node3": SyncProgress("checking", 0, 40, 0, 8_000_000),
    })
    assert line == ("sync: node0 12/40 files 3.1/8.0 MB \u00b7 node1 unchanged \u00b7 "
                    "node2 40/40 files 8.0/8.0 MB done \u00b7 node3 checking")
