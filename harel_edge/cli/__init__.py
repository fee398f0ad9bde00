"""`harel-edge`: run, inspect and repair a harel_edge deployment from the shell.

The package parses, renders and maps errors to exit codes; the work is in the library modules.
"""

from harel_edge.cli.app import app, config_app, dead_letter_app, executions_app, workflows_app
from harel_edge.cli.commands import config_show, dashboard, demo, doctor, migrate, worker
from harel_edge.cli.databases import databases_app, databases_create
from harel_edge.cli.dead_letters import (
    dead_letter_list,
    dead_letter_purge,
    dead_letter_requeue,
    dead_letter_show,
)
from harel_edge.cli.execution_control import (
    executions_cancel,
    executions_resume,
    executions_retry,
    executions_suspend,
    executions_terminate,
)
from harel_edge.cli.executions import executions_list, executions_show, workflows_list, workflows_show
from harel_edge.cli.limits import limits_app, limits_clear, limits_list, limits_set
from harel_edge.cli.publish import publish
from harel_edge.cli.reference import command_paths, help_text, reference, reference_markdown
from harel_edge.cli.status import status
from harel_edge.cli.workflow_control import workflows_cancel, workflows_fork, workflows_resume

# Registered here, in the order `--help` lists them: the README's first command first.
for _command in (demo, worker, publish, status, dashboard, migrate, doctor):
    app.command()(_command)
config_app.command("show")(config_show)
for _name, _command in (
    ("list", dead_letter_list),
    ("show", dead_letter_show),
    ("requeue", dead_letter_requeue),
    ("purge", dead_letter_purge),
):
    dead_letter_app.command(_name)(_command)
executions_app.command("list")(executions_list)
executions_app.command("show")(executions_show)
for _name, _command in (
    ("suspend", executions_suspend),
    ("resume", executions_resume),
    ("cancel", executions_cancel),
    ("terminate", executions_terminate),
    ("retry", executions_retry),
):
    executions_app.command(_name)(_command)
for _name, _command in (
    ("list", workflows_list),
    ("show", workflows_show),
    ("cancel", workflows_cancel),
    ("resume", workflows_resume),
    ("fork", workflows_fork),
):
    workflows_app.command(_name)(_command)
app.add_typer(limits_app, name="limits")
app.add_typer(databases_app, name="databases")
databases_app.command("create")(databases_create)
for _name, _command in (("set", limits_set), ("list", limits_list), ("clear", limits_clear)):
    limits_app.command(_name)(_command)
app.command("reference", hidden=True)(reference)

__all__ = ["app", "command_paths", "help_text", "reference_markdown"]
