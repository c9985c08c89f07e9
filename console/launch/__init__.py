"""What a launch is made of: the spec, launchers, options, the run's environment,
the dry run and the code sync.
"""
