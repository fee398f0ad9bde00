"""Which addresses name a primary the settings can reach, and the error, naming the variable, for
those that cannot (a WebSocket URL, another scheme, a malformed port, a token in the URL)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from harel_edge.redaction import scrub

# The schemes the Hrana-over-HTTP executor speaks to (and a replica's sync URL takes). `libsql://`
# is Turso's (TLS); `http://` is a self-hosted sqld's HTTP port.
SERVER_SCHEMES = ("http", "https", "libsql")
WEBSOCKET_SCHEMES = {"ws": "http", "wss": "https"}
TOKEN_PARAMETERS = ("authtoken", "auth_token", "token", "jwt")  # libsql's URL form of a token, and its kin


def is_url(value: str) -> bool:
    """Whether a database setting names a server rather than a file."""
    return "://" in value


def check_server_url(variable: str, url: str) -> None:
    """Refuse, naming `variable`, a URL that names no server harel_edge can speak Hrana over HTTP to."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(name.lower() in TOKEN_PARAMETERS for name, _ in query) or parts.password:
        # A URL is printed (status, migrate, the dashboard, errors): a token in it would go with it.
        kept = urlencode([(name, value) for name, value in query if name.lower() not in TOKEN_PARAMETERS])
        plain = urlunsplit((parts.scheme, parts.hostname + (f":{parts.port}" if parts.port else ""), parts.path, kept, ""))
        raise ValueError(
            f"{variable} carries a credential in the URL, which would be shown wherever the URL is: set "
            f"{variable}={plain} and give the token as HAREL_EDGE_AUTH_TOKEN"
        )
    url = scrub(url)
    if parts.scheme in WEBSOCKET_SCHEMES:
        same = urlunsplit((WEBSOCKET_SCHEMES[parts.scheme], *parts[1:]))
        raise ValueError(
            f"{variable}={url!r} is a WebSocket URL; harel_edge speaks Hrana over HTTP (every command "
            f"would fail): set {variable}={same} for the same server"
        )
    if parts.scheme not in SERVER_SCHEMES or not parts.hostname:
        raise ValueError(
            f"{variable}={url!r} is not a server URL: set it to http://host:port (self-hosted sqld) "
            "or libsql://<db>.turso.io"
        )
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise ValueError(f"{variable}={url!r} has a malformed port: set http://host:PORT") from None
