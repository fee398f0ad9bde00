"""Where sqld can come from here, the binary or the Docker image, and which to use; when neither
works, the reason says what to install or run (docs/testing.md).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Literal

Backend = Literal["docker", "binary"]

DEFAULT_IMAGE = "harel-edge/sqld:0.24.32"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class SqldUnavailable(RuntimeError):
    """sqld cannot be started here at all (no binary, no Docker engine or image).

    Why a type of its own: test fixtures skip (or fail, when sqld is required) on this.
    """


def sqld_image() -> str:
    """The image the Docker backend runs: ``SQLD_IMAGE`` or the one sqld/build-image.sh builds."""
    return os.environ.get("SQLD_IMAGE") or DEFAULT_IMAGE


def _repo_cache_candidates() -> list[Path]:
    candidates = []
    if os.environ.get("SQLD_CACHE_DIR"):
        candidates.append(Path(os.environ["SQLD_CACHE_DIR"]) / "sqld")
    candidates.append(Path.cwd() / ".cache" / "sqld" / "sqld")
    # A source checkout (editable install): <repo>/.cache/sqld/sqld next to the package.
    candidates.append(Path(__file__).resolve().parents[3] / ".cache" / "sqld" / "sqld")
    return candidates


def find_sqld_binary() -> Path | None:
    """Where the sqld binary is: ``HAREL_EDGE_SQLD_BINARY``, the fetch cache, or ``PATH``."""
    explicit = os.environ.get("HAREL_EDGE_SQLD_BINARY")
    if explicit:
        path = Path(explicit)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    for candidate in _repo_cache_candidates():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("sqld")
    return Path(found) if found else None


def _docker_client():
    """A Docker SDK client that answered a ping (imported lazily; raises if unreachable)."""
    import docker  # noqa: PLC0415 - optional dependency, imported only for this backend

    client = docker.from_env(timeout=10)
    client.ping()
    return client


def backend_unavailable_reason(backend: Backend, *, image: str | None = None) -> str | None:
    """Why ``backend`` cannot run sqld here, or None when it can.

    Why: fixtures and tests skip or fail with this reason, so it says what to do.
    """
    if backend == "binary":
        binary = find_sqld_binary()
        if binary is None:
            where = os.environ.get("HAREL_EDGE_SQLD_BINARY")
            if where:
                return f"HAREL_EDGE_SQLD_BINARY={where} is not an executable file"
            return "no sqld binary found (run sqld/fetch-binary.sh, or set HAREL_EDGE_SQLD_BINARY)"
        if not CA_BUNDLE.is_file() and not os.environ.get("SSL_CERT_FILE"):
            return f"sqld needs a CA bundle at {CA_BUNDLE} (apt-get install ca-certificates)"
        return None
    if backend == "docker":
        image = image or sqld_image()
        try:
            import testcontainers.core.container  # noqa: F401, PLC0415
        except ImportError:
            return "the Docker backend needs the 'testcontainers' and 'docker' packages"
        try:
            client = _docker_client()
        except Exception as exc:  # noqa: BLE001 - any failure means "no engine"; say which
            return f"no Docker engine reachable ({type(exc).__name__}: {exc}); run scripts/start-docker.sh"
        try:
            client.images.get(image)
        except Exception:  # noqa: BLE001
            return f"Docker image {image} is missing (run sqld/build-image.sh, or set SQLD_IMAGE)"
        finally:
            client.close()
        return None
    return f"unknown sqld backend {backend!r} (use 'docker' or 'binary')"


def choose_backend(backend: str | None = None, *, image: str | None = None) -> Backend:
    """Pick the backend: the argument, else ``HAREL_EDGE_SQLD_BACKEND``, else docker if usable, else binary.

    Raises :class:`SqldUnavailable` with the reason when the chosen (or every) backend is unusable.
    """
    wanted = backend or os.environ.get("HAREL_EDGE_SQLD_BACKEND") or None
    if wanted:
        if wanted not in ("docker", "binary"):
            raise SqldUnavailable(
                f"HAREL_EDGE_SQLD_BACKEND={wanted!r} is not a backend (use 'docker' or 'binary')"
            )
        reason = backend_unavailable_reason(wanted, image=image)  # type: ignore[arg-type]
        if reason:
            raise SqldUnavailable(f"sqld backend {wanted!r} unavailable: {reason}")
        return wanted  # type: ignore[return-value]
    docker_reason = backend_unavailable_reason("docker", image=image)
    if docker_reason is None:
        return "docker"
    binary_reason = backend_unavailable_reason("binary")
    if binary_reason is None:
        return "binary"
    raise SqldUnavailable(f"cannot start sqld: docker: {docker_reason}; binary: {binary_reason}")
