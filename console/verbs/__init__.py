"""The command line: ``rankdeck VERB``, the command table, the launch and recorded
verbs, their output (the TUI or ``--no-tui``), and the Slurm follower's entry point.
"""
