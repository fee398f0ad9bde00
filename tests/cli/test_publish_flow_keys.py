"""A publish's flow-control keys: an empty limit or debounce key, or a debounce key without a
debounce, is refused naming the option, through the command and the library, on every profile,
and nothing is queued."""

from __future__ import annotations

import pytest
from cli_helpers import env_for, run
from harel.spec.states import Event

from harel_edge import LibsqlTransport, Message
from harel_edge.migration import migrate


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--limit-key", ""], "limit_key (--limit-key) must be a non-empty string"),
        (["--debounce", "1", "--debounce-key", ""], "debounce_key (--debounce-key) must be a non-empty string"),
        (["--debounce-key", "x"], "give debounce (--debounce SECONDS) too"),
    ],
    ids=["an empty limit key", "an empty debounce key", "a debounce key without a debounce"],
)
def test_publish_refuses_an_empty_or_idle_flow_key_naming_the_option_and_queues_nothing(place, tmp_path, args, says):
    settings = place.settings()
    migrate(settings)
    refused = run(["publish", "g", "Go", *args], env_for(settings.model_dump()), tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert says in refused.stderr and "Traceback" not in refused.stderr
    with LibsqlTransport(settings=settings, create_schema=False) as transport:
        assert transport.depth() == 0, "nothing was queued"


@pytest.mark.parametrize(
    ("flow", "says"),
    [
        ({"limit_key": ""}, "limit_key .* must be a non-empty string"),
        ({"debounce": 1, "debounce_key": ""}, "debounce_key .* must be a non-empty string"),
        ({"debounce_key": "x"}, "give debounce"),
    ],
    ids=["an empty limit key", "an empty debounce key", "a debounce key without a debounce"],
)
def test_the_librarys_publish_refuses_an_empty_or_idle_flow_key_and_queues_nothing(place, flow, says):
    with LibsqlTransport(settings=place.settings()) as transport:
        with pytest.raises(ValueError, match=says):
            transport.publish("g", Event(kind="Go"), **flow)
        with pytest.raises(ValueError, match=says):
            transport.publish_many([Message("ok", Event(kind="Go")), Message("g", Event(kind="Go"), **flow)])
        assert transport.depth() == 0, "nothing was queued, not even the valid message before it"
