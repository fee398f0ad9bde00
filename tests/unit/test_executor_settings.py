"""The remote executor's address and the group-commit setting, refused or taken as a user gives them."""

from __future__ import annotations

import pytest

from harel_edge.errors import ConfigurationError
from harel_edge.executor.http import http_base_url
from harel_edge.settings import ExplicitSettings


@pytest.mark.parametrize(
    ("given", "sent_to"),
    [
        ("libsql://db-org.turso.io", "https://db-org.turso.io"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("https://primary.example:8443", "https://primary.example:8443"),
    ],
)
def test_a_turso_or_self_hosted_address_becomes_the_http_address_hrana_is_served_on(given, sent_to):
    assert http_base_url(given) == sent_to


@pytest.mark.parametrize("url", ["ftp://x", "ws://127.0.0.1:8080"])
def test_an_address_hrana_cannot_be_spoken_to_is_refused_by_name(url):
    with pytest.raises(ValueError, match=url):
        http_base_url(url)


@pytest.mark.parametrize("linger", ["-0.001", "0.5", "nan"])
def test_a_commit_linger_out_of_range_is_refused_naming_the_variable(linger):
    with pytest.raises(ConfigurationError, match="HAREL_EDGE_COMMIT_LINGER"):
        ExplicitSettings.load(commit_linger=linger)


def test_the_commit_linger_defaults_to_two_milliseconds_and_zero_turns_it_off():
    assert ExplicitSettings.load().commit_linger == 0.002
    assert ExplicitSettings.load(commit_linger="0").commit_linger == 0.0
