"""sandgym: an environment server for training terminal and desktop agents with RL.

The one import package of the distribution. Its parts, in import order (docs/architecture.md):
`sandgym.wire` (the wire contract) <- `sandgym.client` (what a trainer's environment needs) <-
`sandgym.integrations` and `sandgym.trainer`; `sandgym.sandboxes` <- `sandgym.tasks` <-
`sandgym.server`; `sandgym.cli` on top. Importing `sandgym` itself loads none of them.
"""

__version__ = "0.1.0"
