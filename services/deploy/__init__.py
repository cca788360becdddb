"""The robotloop deploy service (see app.py)."""
