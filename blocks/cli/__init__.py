"""The `blocks` command line."""
