"""The supervisor: one detached process per run per node (``python -m agent
supervisor``) that owns torchrun, records its output into the journal, samples the ranks
and keeps the node's link to the judge.
"""
