"""What every sandbox backend shares, so that no backend imports another.

- `output`: the capped output buffer and the truncation marker (exec streams, the shell);
- `files`: small tar archives (one file, a few request files) and removal of a host tree
  that a sandboxed command may have made read-only;
- `kill`: the in-sandbox scripts that kill an exec's processes (by its environment marker), a
  process tree, or everything but init;
- `lazy_shell`: `ShellSandbox`, a `Sandbox` whose persistent shell starts on first use and is
  restarted when it exits (the docker, e2b and local backends).
"""
