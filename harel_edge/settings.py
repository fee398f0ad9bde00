"""EdgeSettings: one configuration profile, read from the environment when asked for, never at import.

Every wrong combination fails at start with a `ConfigurationError` naming the variable (docs/profiles.md).
"""

from __future__ import annotations

import math
import os
import secrets
import socket
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AliasChoices,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from harel_edge import database_names, settings_combination
from harel_edge.errors import ConfigurationError
from harel_edge.redaction import MARK, remember
from harel_edge.schema_harel import check_prefix
from harel_edge.settings_variables import ENV_PREFIX, explain, variable_for, warn_unknown_variables

Profile = Literal["local", "sqld", "replica"]
PROFILES: tuple[str, ...] = ("local", "sqld", "replica")


# The publish window's range: at least a retry's whole default deadline (60 s) past the first
# attempt, at most a year (the table keeps one row an event for the window).
MIN_PUBLISH_WINDOW = 60.0
MAX_PUBLISH_WINDOW = 365 * 86400.0

# Why ten: docs/operations.md ("Dead letters"); 0 turns dead-lettering off.
DEFAULT_MAX_DELIVERIES = 10
# Events of one group a claim leases together: enough to keep a hot group moving 100 ms from its
# primary (docs/tuning.md, "Runs"), few enough that a run commits in one modest request.
MAX_RUN = 512
# A run's leases are acked in one DELETE of three parameters each (`queue.statements.ACK_ROWS`):
# far above it, its commit would pass SQLite's 32,766 parameters and fail every time.
MAX_RUN_BOUND = 2000

# The range of sync_interval, and the measurements behind it: docs/tuning.md.
MIN_SYNC_INTERVAL = 0.05
MAX_SYNC_INTERVAL = 3600.0

TOKEN_WITH_WHITESPACE = (
    "HAREL_EDGE_AUTH_TOKEN (or HAREL_LIBSQL_AUTH_TOKEN) has whitespace inside it, or a character no "
    "token has (only printable ASCII travels in an HTTP header): set it to the token alone, on one "
    "line (a token wrapped over several lines: join them), e.g. "
    "HAREL_EDGE_AUTH_TOKEN=\"$(tr -d '\\r\\n' < token-file)\""
)


def _default_worker_id() -> str:
    # The random part: containers on the host network share a hostname and are all pid 1.
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _within(value: float, low: float, high: float, refusal: str) -> float:
    """`value` when it is a finite number from `low` to `high`; else the setting's own refusal."""
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(refusal)
    return value


class EdgeSettings(BaseSettings):
    """Where the data lives and how to reach it, plus the queue's and the retry policy's knobs.

    Build it with `EdgeSettings.load()` (errors name the variable), or with keyword arguments.
    """

    # Whether `load()` reads the environment (and so warns about variables that are no setting).
    reads_environment: ClassVar[bool] = True
    _named_by_header: bool = PrivateAttr(default=False)  # requests name the database (sqld's namespace)
    _addresses: dict[str, Any] = PrivateAttr(default_factory=dict)  # as given: `{database}` not yet filled in

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        populate_by_name=True,
        validate_default=True,
    )

    profile: Profile | None = Field(
        default=None,
        description="local (one SQLite file, the default), sqld (a server over HTTP) or replica "
        "(an embedded replica synced with a primary). Inferred from the other settings when unset.",
    )
    db_path: str = Field(
        default="harel_edge.db",
        validation_alias=AliasChoices("db_path", "HAREL_EDGE_DB_PATH", "HAREL_LIBSQL_DB"),
        description="The database file (local) or the replica's local file (replica).",
    )
    url: str | None = Field(
        default=None,
        description="The server to talk to on the sqld profile: http(s)://host:port or libsql://…",
    )
    sync_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("sync_url", "HAREL_EDGE_SYNC_URL", "HAREL_LIBSQL_SYNC_URL"),
        description="The primary an embedded replica syncs with (replica profile).",
    )
    auth_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("auth_token", "HAREL_EDGE_AUTH_TOKEN", "HAREL_LIBSQL_AUTH_TOKEN"),
        description="The JWT the primary expects. Never logged or shown.",
    )
    sync_interval: float | None = Field(
        default=None,
        description="Seconds between background syncs of an embedded replica; unset: sync on demand.",
    )
    prefix: str = Field(default="harel", description="Prefix of every table harel_edge creates.")
    database: str | None = Field(
        default=None,
        description="Which one of many databases (a sqld namespace, a Turso database): it fills "
        "{database} in HAREL_EDGE_URL, HAREL_EDGE_SYNC_URL and HAREL_EDGE_DB_PATH; without {database} "
        "in HAREL_EDGE_URL, each request to sqld names the namespace. Unset: the server's one database.",
    )
    databases: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Comma-separated databases of a deployment: one worker serves them all, "
        "`migrate --all` and `status --all` go through each; other commands take --database NAME.",
    )
    databases_file: str | None = Field(
        default=None,
        description="A file naming the deployment's databases, one a line (# comments): read at start "
        "instead of HAREL_EDGE_DATABASES, and again by a running worker when it changes.",
    )
    doorbell: str | None = Field(
        default=None,
        description="A database of the deployment's address where publishers ring for the database they "
        "published to: a worker then polls its idle databases about once a minute and is woken by the ring.",
    )
    admin_url: str | None = Field(
        default=None, description="sqld's admin API (its --admin-listen-addr), where `databases create` makes namespaces."
    )
    admin_key: SecretStr | None = Field(default=None, description="sqld's --admin-auth-key, if it has one. Never logged or shown.")
    busy_timeout_ms: int = Field(
        default=5000, description="How long a writer waits for the file's write lock (local profile)."
    )
    durability: Literal["full", "normal"] = Field(
        default="full",
        description="PRAGMA synchronous on the local profile: full survives power loss, normal may lose "
        "the last commits on an OS crash.",
    )
    visibility: float = Field(default=30.0, description="Seconds a claimed message stays leased.")
    max_in_flight: int = Field(
        default=1024,
        description="Most statechart events one worker process keeps in flight: its window follows "
        "the link to the primary up to this.",
    )
    max_run: int = Field(
        default=MAX_RUN,
        description="Most events of one group a claim hands a worker at once, handled one after "
        "another and committed together (1: one commit an event).",
    )
    max_workflow_passes: int = Field(
        default=32,
        description="Most durable-workflow passes one worker process runs at once (each namespace): "
        "a pass mostly waits for its commits, so passes side by side share them.",
    )
    max_open_replicas: int = Field(
        default=64,
        description="Most embedded replicas a deployment's worker keeps open at once (about 8 open "
        "files each): a database's replica opens when it has work and closes when it has had none "
        "for HAREL_EDGE_REPLICA_IDLE_CLOSE.",
    )
    replica_idle_close: float = Field(
        default=60.0,
        description="Seconds without work after which a deployment's worker closes a database's "
        "embedded replica (its file stays, and syncs again when the work comes back).",
    )
    max_deliveries: int = Field(
        default=DEFAULT_MAX_DELIVERIES,
        description="Deliveries of a message whose handling failed (or failed passes of a durable "
        "workflow) after which the worker moves it to the dead-letter table; 0: never.",
    )
    routing_keys: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), description="Comma-separated routing keys this worker claims; empty: any group."
    )
    worker_id: str = Field(default_factory=_default_worker_id, description="This worker's name in leases.")
    retry_attempts: int = Field(default=8, description="Attempts for a transient error before giving up.")
    retry_initial_delay: float = Field(default=0.05, description="First backoff delay, seconds.")
    retry_max_delay: float = Field(default=5.0, description="Cap on one backoff delay, seconds.")
    retry_deadline: float = Field(default=60.0, description="Cap on the time one operation may retry.")
    publish_window: float = Field(
        default=3600.0,
        description="Seconds a group remembers an event id it was sent: publishing the same event "
        "to it again within them (a retry of an ambiguous publish) queues nothing.",
    )
    metrics_port: int | None = Field(default=None, description="Serve Prometheus metrics on this port.")
    commit_linger: float = Field(
        default=0.002,
        description="Seconds a new request to the primary (or a local commit) waits for other "
        "events' commits and acks to join it (group commit); 0: send at once.",
    )

    @field_validator("commit_linger")
    @classmethod
    def _bounded_linger(cls, value: float) -> float:
        return _within(value, 0, 0.1, f"HAREL_EDGE_COMMIT_LINGER={value} is out of range: set 0 to 0.1 seconds (default 0.002)")

    # ---- field checks: each names its variable ------------------------------------------------

    @field_validator("auth_token", mode="before")
    @classmethod
    def _one_word_token(cls, value: Any) -> Any:
        """The token without the whitespace around it (a token file's newline, an env file's CR);
        whitespace or a control character inside it is refused: the driver would send no request
        at all ("Hrana: http error: http::Error(InvalidHeaderValue)")."""
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if not isinstance(value, str):
            return value
        token = value.strip()
        if not token:
            return None
        if any(not 33 <= ord(c) <= 126 for c in token):
            raise ValueError(TOKEN_WITH_WHITESPACE)
        remember(token)  # scrubbed from every error and log line of this process from now on
        return token

    @field_validator("database")
    @classmethod
    def _database_name(cls, value: str | None) -> str | None:
        return None if value is None else database_names.check_name("HAREL_EDGE_DATABASE", value)

    @field_validator("doorbell")
    @classmethod
    def _doorbell_name(cls, value: str | None) -> str | None:
        return None if value is None else database_names.check_name("HAREL_EDGE_DOORBELL", value)

    @field_validator("databases", mode="before")
    @classmethod
    def _database_names(cls, value: Any) -> Any:
        return database_names.split_names("HAREL_EDGE_DATABASES", value)

    @field_validator("admin_key", mode="before")
    @classmethod
    def _secret_admin_key(cls, value: Any) -> Any:
        key = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(key, str) and key.strip():
            remember(key.strip())  # scrubbed from every error and log line of this process
            return key.strip()
        return None if isinstance(key, str) else value

    @field_validator("routing_keys", mode="before")
    @classmethod
    def _split_routing_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("profile", mode="before")
    @classmethod
    def _known_profile(cls, value: Any) -> Any:
        if value is None or value == "":
            return None
        if isinstance(value, str) and value.strip().lower() in PROFILES:
            return value.strip().lower()
        raise ValueError(
            f"HAREL_EDGE_PROFILE={value!r} is not a profile: set it to one of {', '.join(PROFILES)}"
        )

    @field_validator("prefix")
    @classmethod
    def _valid_prefix(cls, value: str) -> str:
        try:
            check_prefix(value)
        except ValueError as exc:
            raise ValueError(f"HAREL_EDGE_PREFIX: {exc}") from None
        if f"{value}_".lower().startswith("sqlite_"):  # every table is named `<prefix>_...`
            raise ValueError(
                f"HAREL_EDGE_PREFIX={value!r} would name the tables sqlite_..., which SQLite reserves for "
                "itself (CREATE TABLE fails): choose another prefix, e.g. the default 'harel'"
            )
        return value

    @field_validator("sync_interval")
    @classmethod
    def _workable_interval(cls, value: float | None) -> float | None:
        if value is None:
            return None
        refusal = f"set seconds between {MIN_SYNC_INTERVAL} and {MAX_SYNC_INTERVAL:g}, or unset it to sync on demand"
        return _within(value, MIN_SYNC_INTERVAL, MAX_SYNC_INTERVAL, f"HAREL_EDGE_SYNC_INTERVAL={value} cannot work: {refusal}")

    @field_validator("visibility", "retry_initial_delay", "retry_max_delay", "retry_deadline")
    @classmethod
    def _positive_seconds(cls, value: float, info: Any) -> float:
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{variable_for(info.field_name)}={value} must be a positive number of seconds")
        return value

    @field_validator("publish_window")
    @classmethod
    def _window(cls, value: float) -> float:
        # Shorter than a retry's back-off, a lost answer could be published twice after all.
        refusal = f"set {MIN_PUBLISH_WINDOW:g} to {MAX_PUBLISH_WINDOW:.0f} seconds (default 3600, an hour)"
        return _within(value, MIN_PUBLISH_WINDOW, MAX_PUBLISH_WINDOW, f"HAREL_EDGE_PUBLISH_WINDOW={value} is out of range: {refusal}")

    @field_validator("max_run")
    @classmethod
    def _run_bound(cls, value: int) -> int:
        if value > MAX_RUN_BOUND:
            raise ValueError(
                f"HAREL_EDGE_MAX_RUN={value} is out of range: set 1 to {MAX_RUN_BOUND} events "
                f"(default {MAX_RUN}); a run's commit acks its events in one statement"
            )
        return value

    @field_validator("replica_idle_close")
    @classmethod
    def _positive_idle_close(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(
                f"HAREL_EDGE_REPLICA_IDLE_CLOSE={value} is out of range: set a number of seconds above 0 (default 60)"
            )
        return value

    @field_validator("busy_timeout_ms", "retry_attempts", "max_in_flight", "max_run", "max_workflow_passes",
                     "max_open_replicas")
    @classmethod
    def _non_negative(cls, value: int, info: Any) -> int:
        if value < (0 if info.field_name == "busy_timeout_ms" else 1):
            raise ValueError(f"{variable_for(info.field_name)}={value} is out of range: set a positive whole number")
        return value

    @field_validator("max_deliveries")
    @classmethod
    def _delivery_limit(cls, value: int) -> int:
        if value < 0:
            raise ValueError(
                f"HAREL_EDGE_MAX_DELIVERIES={value} is out of range: set a whole number of deliveries "
                f"(default {DEFAULT_MAX_DELIVERIES}), or 0 never to dead-letter"
            )
        return value

    @field_validator("worker_id")
    @classmethod
    def _sane_worker_id(cls, value: str) -> str:
        if not value or "#" in value or value == "__parked__":
            raise ValueError(
                f"HAREL_EDGE_WORKER_ID={value!r} is not usable: set a non-empty name without '#'"
            )
        return value

    # ---- the combination (settings_combination.py) ---------------------------------------------

    @model_validator(mode="after")
    def _combined(self) -> EdgeSettings:
        self._addresses = {field: getattr(self, field) for field in ("db_path", "url", "sync_url")}
        self._named_by_header = settings_combination.check(self)
        return self

    # ---- reading -------------------------------------------------------------------------------

    @classmethod
    def load(cls, **overrides: Any) -> EdgeSettings:
        """Read the environment (and `.env`) now, turning any failure into a `ConfigurationError`.

        An unknown `HAREL_EDGE_*` variable is warned about once a process, with the setting it resembles.
        """
        if cls.reads_environment:
            warn_unknown_variables(cls.model_fields, overrides.get("_env_file", cls.model_config.get("env_file")))
        try:
            return cls(**overrides)
        except ValidationError as exc:
            raise ConfigurationError(explain(exc)) from None

    # What a profile can do, for code that must not compare profile names.
    @property
    def has_file(self) -> bool:
        """A database file on this machine: the local file, or an embedded replica's."""
        return self.profile in ("local", "replica")

    @property
    def has_primary(self) -> bool:
        """Writes are decided by a primary reached over Hrana: sqld, and every write of a replica."""
        return self.profile in ("sqld", "replica")

    @property
    def syncs(self) -> bool:
        """An embedded replica: a local file kept in step with its primary."""
        return self.profile == "replica"

    @property
    def server(self) -> str | None:
        """The primary's address for the profiles that have one."""
        return self.url if self.profile == "sqld" else self.sync_url if self.profile == "replica" else None

    @property
    def database_header(self) -> dict[str, str]:
        """The header each request to the primary carries to name the database, if one must."""
        return database_names.namespace_header(self.database) if self._named_by_header and self.database else {}

    @property
    def is_deployment(self) -> bool:
        """Settings of many databases (HAREL_EDGE_DATABASES) that do not say which one."""
        return bool(self.databases) and self.database is None

    def for_database(self, name: str) -> EdgeSettings:
        """These settings for the deployment's database `name`: its file, server and namespace."""
        if self.database is not None:
            raise ConfigurationError(f"these settings are for the database {self.database!r} already")
        return self._of_database(name)

    def doorbell_settings(self) -> EdgeSettings | None:
        """The settings of the deployment's doorbell database (HAREL_EDGE_DOORBELL), if it has one."""
        return None if self.doorbell is None else self._of_database(self.doorbell)

    def _of_database(self, name: str) -> EdgeSettings:
        values = {field: getattr(self, field) for field in type(self).model_fields}
        return ExplicitSettings.load(**{**values, **self._addresses, "database": name})

    def one_database(self) -> EdgeSettings:
        """These settings, refused when they name a deployment's databases but not which one."""
        if self.is_deployment:
            raise ConfigurationError(
                f"HAREL_EDGE_DATABASES names {len(self.databases)} databases ({', '.join(self.databases[:5])}"
                f"{', ...' if len(self.databases) > 5 else ''}): say which one with --database NAME or "
                "HAREL_EDGE_DATABASE"
            )
        return self

    def redacted(self) -> dict[str, Any]:
        """Every setting as `config show` prints it: the tokens replaced by a marker."""
        data = self.model_dump()
        data["auth_token"] = MARK if self.auth_token else None
        data["admin_key"] = MARK if self.admin_key else None
        data["routing_keys"] = list(self.routing_keys)
        data["databases"] = list(self.databases)
        return data


class ExplicitSettings(EdgeSettings):
    """Settings given in code only: the environment and `.env` are not read, so an explicit argument
    (`LibsqlTransport("queue.db")`) never meets a contradicting variable.
    """

    reads_environment: ClassVar[bool] = False

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, *args, **kwargs):  # type: ignore[override]
        return (init_settings,)
