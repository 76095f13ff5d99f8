"""The env server: the FastAPI app (`sandgym.server.app`), the episode service, the sandbox API,
the OpenEnv wire, metrics, and running it under uvicorn (`sandgym.server.runner`)."""
