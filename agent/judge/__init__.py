"""The run's judge: one process per run on the rendezvous host (``python -m agent
judge``) that applies the run's rules with no console attached; its start, stop and
questions from serve's side (control), its cordon policy and its notifications.
"""
