"""`python -m gpudash`: the same as the `gpudash` command."""

from gpudash.cli import main

main()
