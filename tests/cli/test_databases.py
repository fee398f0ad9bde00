"""A deployment of many databases on the local profile (a file a tenant), as a user runs it:
`databases create`, `migrate --all`, `--database`, `status --all`, and the refusals."""

from __future__ import annotations

import json

from cli_helpers import env_for, run

from harel_edge.migrations import SCHEMA_VERSION


def deployment(tmp_path, names: str = "acme,globex") -> dict[str, str]:
    return env_for({"db_path": str(tmp_path / "{database}.db"), "databases": names})


def test_databases_create_makes_each_tenants_file_and_schema_and_again_says_it_is_there(tmp_path):
    env = deployment(tmp_path)
    made = run(["databases", "create", "acme", "globex"], env, tmp_path)
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    assert lines[0].startswith(f"acme: made; schema version 0 -> {SCHEMA_VERSION}") and lines[1].startswith("globex: made;")
    assert (tmp_path / "acme.db").is_file() and (tmp_path / "globex.db").is_file()
    again = run(["databases", "create", "acme"], env, tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"acme: already there; schema version {SCHEMA_VERSION}: up to date")


def test_databases_create_all_makes_every_database_of_the_deployment_and_refuses_names_beside_it(tmp_path):
    env = deployment(tmp_path)
    both = run(["databases", "create", "--all", "acme"], env, tmp_path)
    assert both.returncode == 2 and "or --all" in both.stderr
    neither = run(["databases", "create"], env, tmp_path)
    assert neither.returncode == 2 and "or --all" in neither.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing was made"
    made = run(["databases", "create", "--all"], env, tmp_path)
    assert made.returncode == 0, made.stderr
    assert [line.split(":")[0] for line in made.stdout.splitlines()] == ["acme", "globex"]
    assert (tmp_path / "acme.db").is_file() and (tmp_path / "globex.db").is_file()


def test_a_command_that_needs_one_database_names_the_deployments_and_changes_nothing(tmp_path):
    env = deployment(tmp_path)
    refused = run(["publish", "order-1", "Start"], env, tmp_path)
    assert refused.returncode == 2
    assert "HAREL_EDGE_DATABASES names 2 databases (acme, globex): say which one with --database NAME" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "no file was made"
    bad = run(["databases", "create", "Not.A.Name"], env, tmp_path)
    assert bad.returncode == 2 and "is not a database name" in bad.stderr


def test_each_database_keeps_its_own_queue_and_status_all_adds_them_up(tmp_path):
    env = deployment(tmp_path)
    assert run(["databases", "create", "acme", "globex"], env, tmp_path).returncode == 0
    for args in (["publish", "g1", "Go", "--database", "acme"], ["--database", "acme", "publish", "g2", "Go"],
                 ["--database", "acme", "publish", "g3", "Go", "--database", "globex"]):
        done = run(args, env, tmp_path)
        assert done.returncode == 0, done.stderr
    shown = run(["status", "--all", "--json"], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    queued = {name: each["queue"]["totals"]["queued"] for name, each in report["databases"].items()}
    assert queued == {"acme": 2, "globex": 1}, "a command's --database wins over the global one"
    assert report["total"]["queued"] == 3
    one = run(["status", "--json", "--database", "globex"], env, tmp_path)
    assert json.loads(one.stdout)["queue"]["totals"]["queued"] == 1


def test_migrate_all_says_which_database_failed_migrates_the_others_and_leaves_the_refused_file_as_it_was(tmp_path):
    env = deployment(tmp_path, "acme,broken,globex")
    broken = tmp_path / "broken.db"
    broken.write_bytes(b"these are notes, not a database\n" * 8)
    before = broken.read_bytes()
    done = run(["migrate", "--all"], env, tmp_path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"acme: schema version 0 -> {SCHEMA_VERSION}") and lines[2].startswith(f"globex: schema version 0 -> {SCHEMA_VERSION}")
    assert lines[1].startswith("broken: FAILED:") and "not a" in lines[1].lower()
    assert "1 of 3 databases not migrated: broken" in done.stderr
    assert broken.read_bytes() == before
    listed = run(["status", "--all"], env, tmp_path)
    assert listed.returncode == 1, "a database that cannot be read fails the command, after the others are shown"
    assert "broken" in listed.stdout and "FAILED" in listed.stdout and "total" in listed.stdout


def test_going_through_each_database_runs_several_at_once_and_reports_them_in_order_with_their_errors(tmp_path):
    import threading  # noqa: PLC0415

    from harel_edge.deployment import each_database  # noqa: PLC0415
    from harel_edge.settings import ExplicitSettings  # noqa: PLC0415

    names = [f"t{i}" for i in range(6)]
    deployment = ExplicitSettings.load(db_path=str(tmp_path / "{database}.db"), databases=",".join(names))
    together = threading.Barrier(2, timeout=30)  # broken unless two databases are gone through at once

    def look(one):  # noqa: ANN001, ANN202
        if one.database == "t3":
            raise ValueError("t3 refused")
        if one.database in ("t0", "t1"):
            together.wait()
        return one.database.upper()

    results = each_database(deployment, look)
    assert [r.database for r in results] == names
    assert [r.value for r in results] == ["T0", "T1", "T2", None, "T4", "T5"]
    assert [r.error for r in results] == [None, None, None, "t3 refused", None, None]
