"""The wire contract, a leaf: the episode protocol (`sandgym.wire.protocol`, websocket
`/v1/env`), the sandbox API's models (`sandgym.wire.sandbox_protocol`, HTTP `/v1/sandboxes`).
It imports nothing else of sandgym; client and server share only this package."""
