"""The HTTP front and the request path: the Starlette app, request parsing, the proxy's chain of steps, the SSE relay, OpenAPI."""
