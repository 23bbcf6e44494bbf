"""Torch tensors between the two model services: inline bytes, shared memory, CUDA IPC handles.

The torch half of the wire; `rpc/` stays the gRPC-only half (no torch), which the gateway also uses.
"""
