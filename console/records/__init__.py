"""Recorded runs on this laptop: history, reports, exports and action logs.
"""
