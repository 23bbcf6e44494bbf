"""gRPC plumbing shared by the three services: server building, channel options, error mapping.

Imports grpc and structlog only (never torch, never the engine), so the gateway can use it too.
"""
