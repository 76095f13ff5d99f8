"""tasks: task models, loaders, the verifier and the built-in catalog."""
