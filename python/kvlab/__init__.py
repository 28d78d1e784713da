"""kvlab Python helpers for the scripts and tests (stats: the statistics of every printed table)."""
