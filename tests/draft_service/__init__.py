"""Tests of the draft service that run in-process (no servers)."""
