"""The wire: what both sides read. The console-agent protocol and the journal's
record format, the sync's manifest, the judge's and Slurm's words, the agent's version.
The console may import this package (and agent.rules), nothing else of the agent.
"""
