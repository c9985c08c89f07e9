"""rankdeck's host side. Standard library only (pynvml optional); runs on Python >= 3.8.

Copied to each host into a content-addressed folder and run with the host's training
interpreter as ``python -m agent serve``.
"""
