"""``python -m blocks``: the same as the ``blocks`` command."""

from blocks.cli.main import main

main()
