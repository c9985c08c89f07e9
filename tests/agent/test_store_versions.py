"""The rendezvous store across torch versions (docs/COMPAT.md): torch 2.4's default (libuv)
TCPStore refuses a listen fd with NotImplementedError, so the store hands the same socket to
its legacy backend and still listens on the rendezvous address alone; a TCPStore with no
``master_listen_fd`` at all listens where it likes, and the store says so instead of failing.

The TCPStore classes here have the constructor shapes of those torch versions; the real
thing, per version, is bench/compat.py's "store on rdzv addr" row.
"""

import os
import socket

from agent.store.tcpstore import listen_socket, master_store

ADDR = "127.0.0.2"


class Torch24Store:
    """torch 2.4: libuv by default, which takes no listen fd; ``use_libuv=False`` does."""
    made = []

    def __init__(self, host, port, is_master, wait_for_workers, master_listen_fd=None,
                 use_libuv=True):
        if master_listen_fd is not None and use_libuv:
            raise NotImplementedError("The libuv TCPStore backend does not support "
                                      "initialization with an listen fd.")
        self.port = port
        self.made.append({"fd": master_listen_fd, "use_libuv": use_libuv})


class NoListenFdStore:
    """A TCPStore without ``master_listen_fd``: it binds its own socket."""

    def __init__(self, host, port, is_master, wait_for_workers):
        self.port = port


def bound_to(fd):
    sock = socket.socket(fileno=os.dup(fd))
    try:
        return sock.getsockname()
    finally:
        sock.close()


def test_torch_2_4_store_gets_the_socket_bound_to_the_rendezvous_address():
    sock = listen_socket(ADDR, 0)
    port = sock.getsockname()[1]
    store, listens, note = master_store(Torch24Store, ADDR, sock)
    try:
        assert store.port == port
        assert [m["use_libuv"] for m in Torch24Store.made] == [False]
        assert bound_to(Torch24Store.made[0]["fd"]) == (ADDR, store.port)
        assert listens == "%s:%d" % (ADDR, store.port)
        assert note == ""
    finally:
        os.close(Torch24Store.made[0]["fd"])


def test_a_store_that_takes_no_listen_fd_says_where_it_listens():
    sock = listen_socket(ADDR, 0)
    port = sock.getsockname()[1]
    store, listens, note = master_store(NoListenFdStore, ADDR, sock)
    # the port the store said it bound, before torch: its socket closed, TCPStore's own on it
    assert store.port == port and sock.fileno() == -1
    assert listens == "*:%d" % store.port
    assert note == ("this torch takes no listen fd: the store listens on *:%d (every address "
                    "of the host), not on %s alone" % (store.port, ADDR))
