"""rankdeck's laptop side: CLI, run controller, transports and the Textual app."""
