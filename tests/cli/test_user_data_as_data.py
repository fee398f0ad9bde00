"""What users stored (ids, kinds, keys, errors) is printed as data: a control character is shown
as its escape, never sent to the terminal, and Rich markup or an :emoji: code is printed as the
characters it is, on every command that shows it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import env_for, run
from harel.engine.execution import Execution, Status
from harel.spec.states import Event

from harel_edge import LibsqlTransport
from harel_edge.cli.app import shown
from harel_edge.migration import migrate
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore

# An OSC title, a bell, a clear screen and a cursor move; markup with a link; an emoji code.
HOSTILE = "o\x1b]0;pwned\x07\x1b[2J\x1b[H[red]red[/red][link=https://evil.example]click[/link]:thumbs_up:"
ESCAPED = "o\\x1b]0;pwned\\x07\\x1b[2J\\x1b[H[red]red[/red][link=https://evil.example]click[/link]:thumbs_up:"


def printed_as_data(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, repr(text)
    assert ESCAPED in text, text
    assert "\N{THUMBS UP SIGN}" not in text, text


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A local database holding a running execution whose id, error and queued event's kind are hostile."""
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "q.db"))
    migrate(settings)
    with EdgeStore(settings, create_schema=False) as store, LibsqlTransport(settings=settings, create_schema=False) as t:
        store.save(
            Execution(id=HOSTILE, definition_id="order", status=Status.RUNNING, active_path="AwaitingPayment", error=HOSTILE)
        )
        t.publish(HOSTILE, Event(kind=HOSTILE), routing_key=HOSTILE)
    return env_for({"profile": "local", "db_path": settings.db_path}, COLUMNS="400")


def test_shown_escapes_control_and_invisible_characters_and_keeps_the_rest():
    assert shown(HOSTILE) == ESCAPED
    assert shown("\u202eevil\u200b, é and \N{THUMBS UP SIGN}") == "\\u202eevil\\u200b, é and \N{THUMBS UP SIGN}"
    assert shown("one\ntwo\x1b", lines=True) == "one\ntwo\\x1b"
    assert shown("one\ntwo") == "one\\ntwo"


@pytest.mark.parametrize(
    "args",
    [
        ["executions", "list"],
        ["executions", "show", HOSTILE],
        ["status"],
        ["executions", "suspend", HOSTILE],
    ],
    ids=lambda args: " ".join(args[:2]) if args[0] == "executions" else args[0],
)
def test_an_id_holding_escape_sequences_and_markup_is_printed_as_data(env, tmp_path, args):
    result = run(args, env, tmp_path)
    assert result.returncode == 0, result.stderr
    printed_as_data(result.stdout)


def test_an_error_naming_an_id_prints_it_as_data(env, tmp_path):
    result = run(["executions", "show", "missing\x1b[2J:thumbs_up:"], env, tmp_path)
    assert result.returncode == 1
    assert "\x1b" not in result.stderr and "\N{THUMBS UP SIGN}" not in result.stderr, result.stderr
    assert "no execution 'missing\\x1b[2J:thumbs_up:'" in result.stderr, result.stderr


def test_publish_prints_the_group_kind_and_routing_key_it_was_given_as_data(env, tmp_path):
    result = run(["publish", HOSTILE, HOSTILE, "--routing-key", HOSTILE], env, tmp_path)
    assert result.returncode == 0, result.stderr
    printed_as_data(result.stdout)
    assert result.stdout.count(ESCAPED) == 3, result.stdout
