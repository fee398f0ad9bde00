"""`python -m harel_edge.cli`: the `harel-edge` command where no console script is installed
(the compose workers' image runs the checkout's package this way)."""

from harel_edge.cli import app

app(prog_name="harel-edge")
