"""The demo application served by `make run` (see app.py)."""
