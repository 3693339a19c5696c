"""`python -m quiver.cli`: the `quiver` command."""

from quiver.cli import main

main()
