"""Runs on Slurm from the console: submit, queued runs, stop, squeue's words.
"""
