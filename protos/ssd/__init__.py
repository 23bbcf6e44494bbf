"""Generated-stub namespace for package ssd.v1 (see protos/build.py)."""
