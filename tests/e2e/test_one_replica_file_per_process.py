"""Two embedded replicas of one file in one process corrupt it: the second is refused, clearly."""

from __future__ import annotations

import pytest

from harel_edge.connection import EdgeConnection
from harel_edge.errors import ConfigurationError
from harel_edge.settings import ExplicitSettings

pytestmark = pytest.mark.sqld


def replica(server, path) -> ExplicitSettings:
    return ExplicitSettings.load(profile="replica", db_path=str(path), sync_url=server.http_url, auth_token=server.rw_token)


def test_a_second_replica_of_an_open_file_is_refused_and_the_file_opens_again_once_closed(fresh_sqld_primary, tmp_path):
    first = EdgeConnection(replica(fresh_sqld_primary, tmp_path / "r.db"))
    try:
        with pytest.raises(ConfigurationError, match="already open as an embedded replica in this process"):
            EdgeConnection(replica(fresh_sqld_primary, tmp_path / "." / "r.db"))  # the same file, named otherwise
        assert first.execute("SELECT 1") == [(1,)], "the first one is untouched"
        other = EdgeConnection(replica(fresh_sqld_primary, tmp_path / "other.db"))  # another file is fine
        other.close()
    finally:
        first.close()
    again = EdgeConnection(replica(fresh_sqld_primary, tmp_path / "r.db"))
    again.close()
