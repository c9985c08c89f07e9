"""Host basics any agent process uses: paths, processes, a run folder's small files,
the journal, the action log, GPU and host samples, following files, waits.
"""
