"""`python -m harness.cli`: the same app as the `accelharness` entry point."""

from harness.cli import app

app()
