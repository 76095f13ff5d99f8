"""Moved to `tasks.dockerfile.heredoc`; this path is kept for existing imports."""

from tasks.dockerfile.heredoc import has_heredoc, rewrite_heredocs

__all__ = ["has_heredoc", "rewrite_heredocs"]
