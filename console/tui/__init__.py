"""The Textual console: ``run_app(ctl, launch)`` shows a run live (see app.py)."""
