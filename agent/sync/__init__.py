"""Code to the hosts, host side: a sync's ops place the console's files in a workdir
(serve runs them).
"""
