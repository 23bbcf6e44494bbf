"""The draft (speculator) service: gRPC server around the engine's proposers; owns its own draft KV."""
