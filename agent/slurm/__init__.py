"""A node's run inside a Slurm job: the job watched, and the job's ``rankdeck-host``
step (``python -m agent host JOB``), the parent of the run's detached processes.
"""
