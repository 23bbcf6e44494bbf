"""Tests of the shared gRPC plumbing."""
