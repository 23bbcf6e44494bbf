"""`ssd loadtest`: a ghz-compatible gRPC load generator for the gateway, target and draft services (no torch)."""
