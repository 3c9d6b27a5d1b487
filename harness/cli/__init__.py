"""`accelharness`: the Typer app. Each command module holds plain functions that parse, validate and
call the Python API; they are registered here, in the order `--help` lists them."""

from __future__ import annotations

import typer

from harness.cli import ab, analysis, bench, bundle, manage, predict, suite, welcome
from harness.cli.stops import install_handlers

app = typer.Typer(invoke_without_command=True, pretty_exceptions_enable=False)


@app.callback()
def start(ctx: typer.Context) -> None:
    """Measured ML inference benchmarks: native backends and the browser, one DuckDB store."""
    install_handlers()  # before any command: SIGINT and SIGTERM stop a run alike
    welcome.welcome(ctx)  # no command: the three commands a newcomer needs rather than Typer's list


db_app = typer.Typer(help="Manage the DuckDB store.", no_args_is_help=True)
app.add_typer(db_app, name="db")

app.command()(bench.native)
app.command()(bench.web)
app.command()(bench.run)
app.command()(ab.ab)
app.command("hardware")(manage.hardware_command)
app.command()(manage.models)
db_app.command("init")(manage.db_init)
app.command()(analysis.report)
app.command()(analysis.matrix)
app.command()(predict.predict)
app.command()(analysis.recommend)
app.command("compare")(analysis.compare_command)
app.command("history")(analysis.history_command)
app.command("query")(analysis.query_command)
app.command("export")(analysis.export_command)
app.command("import")(bundle.import_command)
app.command("merge")(bundle.merge_command)
app.command()(suite.suite)

__all__ = ["app"]
