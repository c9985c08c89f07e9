"""The run's rendezvous store: a standalone torch TCPStore process on the
rendezvous host, started by serve (or the judge) and ended with the run.
"""
