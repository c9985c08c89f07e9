"""Inventories: which hosts a run uses and how to reach them (YAML, TOML, or a hostfile)."""
