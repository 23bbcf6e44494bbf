"""Deployment: the local launcher for the whole stack (`ssd serve`)."""
