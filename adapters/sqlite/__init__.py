"""Embedded SQLite: the log backend, its row formats, its writer thread and its checks."""
