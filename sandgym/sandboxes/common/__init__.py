"""What every sandbox backend shares, so that no backend imports another.

- `output`: the capped output buffer and the truncation marker (exec streams, the shell);
- `files`: small tar archives (one file, a few request files) and removal of a host tree
  that a sandboxed command may have made read-only;
- `kill`: the in-sandbox scripts that kill an exec's processes (by its environment marker), a
  process tree, or everything but init;
- `hashing`, `users`, `tolerated`: a directory's content hash, root-user checks, logged
  tolerated failures.

These sit below `sandgym.sandboxes.spec` and `sandgym.sandboxes.shell`; `sandgym.sandboxes.lazy_shell` (a `Sandbox`
whose persistent shell starts on first use, shared by the docker, e2b and local backends) sits
above them.
"""
