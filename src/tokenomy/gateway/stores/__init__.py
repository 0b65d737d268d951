"""Where token-operations state lives: the store interfaces and their in-process (memory) and SQL implementations."""
