"""torchrun and its workers: its own log and phase, the quirks of a torch version,
the hooks rankdeck puts into its Python (they run inside torchrun and its workers), the
flight recorder and the ranks' stacks, and why a launcher failed.
"""
