"""Judgement as the console shows it: the judge's events, verdicts, stacks,
liveness and how the run ended.
"""
