"""Lines of text from the hosts: kept lines, windows over them, time order, and
making untrusted text safe to print.
"""
