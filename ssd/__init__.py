"""ssd-serve engine: models, paged KV cache, scheduler, sampling, speculation."""
