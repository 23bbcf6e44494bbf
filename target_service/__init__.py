"""The target (verifier) service: gRPC server around the engine; owns its requests, KV and scheduling."""
