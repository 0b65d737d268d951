"""Real vLLM under Tokenomy: the tiny model it serves on a CPU, and starting vLLM instances.

Nothing here imports vLLM: instances run in the Python of a vLLM install (the project's
``.venv-vllm`` built by ``make vllm``, or the user's own), started as subprocesses.
"""
