"""A node's run on this host: its folder and state, and its supervisor's lifecycle
(start, stop, restart, fence, standby), as serve and the judge's link order it.
"""
