"""Helpers shared by test folders (``tests`` is on pytest's ``pythonpath``)."""
