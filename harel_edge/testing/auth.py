"""Ed25519 keys and JWT tokens for a sqld with authentication on, minted offline, as production runs it.

Neither the private key nor a token ever appears in a `repr` (docs/testing.md, "Keys and tokens").
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

Access = Literal["rw", "ro"]
KeyFormat = Literal["pem", "base64"]

__all__ = [
    "SqldKeys",
    "generate_keys",
    "load_keys",
    "make_token",
]


@dataclass(frozen=True)
class SqldKeys:
    """An Ed25519 key pair for sqld: sign tokens of every kind with it, give sqld its public half.

    The private key is excluded from `repr`.
    """

    private_key_pem: bytes = field(repr=False)

    @property
    def _private_key(self) -> Ed25519PrivateKey:
        key = serialization.load_pem_private_key(self.private_key_pem, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise TypeError("sqld accepts Ed25519 keys only")
        return key

    @property
    def public_key_pem(self) -> bytes:
        """The public key as PKCS#8 (SubjectPublicKeyInfo) PEM, as sqld reads it."""
        return self._private_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @property
    def public_key_base64(self) -> str:
        """The raw 32 public key bytes in URL-safe base64 without padding, the form sqld reads from its key
        file and `SQLD_AUTH_JWT_KEY`, handier than PEM for containers.
        """
        raw = self._private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def token(self, access: Access | None = "rw", *, expires_in: float | None = None) -> str:
        """Mint a token signed with this key; see :func:`make_token`."""
        return make_token(self, access=access, expires_in=expires_in)

    def write_public_key(self, path: str | os.PathLike[str], fmt: KeyFormat = "pem") -> Path:
        """Write the public key where sqld's `--auth-jwt-key-file` can read it, world-readable.

        `fmt` is "pem" or "base64" (URL-safe, unpadded, no newline: the only base64 sqld 0.24 accepts).
        """
        path = Path(path)
        # sqld 0.24 refuses a base64 key file with a trailing newline or "=" padding.
        data = self.public_key_pem if fmt == "pem" else self.public_key_base64.encode()
        path.write_bytes(data)
        path.chmod(0o644)
        return path

    def write_private_key(self, path: str | os.PathLike[str]) -> Path:
        """Write the private key PEM readable by its owner only (mode 0600)."""
        path = Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(self.private_key_pem)
        path.chmod(0o600)
        return path


def generate_keys() -> SqldKeys:
    """Make a new random Ed25519 key pair."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return SqldKeys(private_key_pem=pem)


def load_keys(private_key_pem: bytes | str | os.PathLike[str]) -> SqldKeys:
    """Load a key pair from a private key PEM (its bytes, or the path of its file), so a deployment's
    tokens keep working across runs.
    """
    if isinstance(private_key_pem, (str, os.PathLike)) and not str(private_key_pem).startswith("-----BEGIN"):
        data = Path(private_key_pem).read_bytes()
    else:
        data = private_key_pem.encode() if isinstance(private_key_pem, str) else private_key_pem
    keys = SqldKeys(private_key_pem=data)
    keys._private_key  # noqa: B018 - fail now, with a clear error, on a bad or non-Ed25519 key
    return keys


def make_token(
    keys: SqldKeys,
    access: Access | None = "rw",
    *,
    expires_in: float | None = None,
    now: float | None = None,
) -> str:
    """Return an EdDSA JWT that sqld accepts.

    `access`: "rw", "ro" or None (no `a` claim: full access); a negative `expires_in` makes it expired.
    """
    if access not in ("rw", "ro", None):
        raise ValueError(f"access must be 'rw', 'ro' or None, not {access!r}")
    issued = int(time.time() if now is None else now)
    claims: dict[str, object] = {"iat": issued}
    if access is not None:
        claims["a"] = access
    if expires_in is not None:
        claims["exp"] = int(issued + expires_in)
    return jwt.encode(claims, keys._private_key, algorithm="EdDSA")
