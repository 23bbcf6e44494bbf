"""gRPC plumbing shared by the three services: server building, channel options, error mapping; and the model
services' Prometheus /metrics HTTP port beside their gRPC one (metrics_http.py).

Imports grpc, prometheus_client and structlog only (never torch, never the engine), so the gateway can use it too.
"""
