"""A live run's members changed from the console: cordon, expel, surgery
proposals and the auto-cordon policy's view.
"""
