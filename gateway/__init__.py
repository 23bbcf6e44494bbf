"""The gateway: public Generation gRPC API and OpenAI-compatible HTTP bridge. CPU only; never imports torch."""
