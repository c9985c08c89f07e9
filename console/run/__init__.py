"""A live run: the controller, its links to the hosts, what agents send, preflight,
and a run's record read from its hosts.
"""
