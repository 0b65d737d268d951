"""Token-operations gateway: an OpenAI-compatible front door with metering, limits and routing."""
