"""The run's model in the console: RunState and what it is built from (buffers,
checkpoints, consoles, ownership, telemetry, sources, scrollback) and its summaries.
"""
