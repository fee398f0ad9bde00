#!/usr/bin/env python3
"""Make an Ed25519 key pair for sqld's JWT auth, and read-write / read-only tokens.

Why: a sqld with ``--auth-jwt-key-file`` refuses every request without a token signed by
the matching private key. This writes, into --out-dir:

  jwt-key.pem      the public key (PKCS#8 PEM) for --auth-jwt-key-file (not secret)
  jwt-key.b64      the same key in URL-safe base64, for the SQLD_AUTH_JWT_KEY env var
  private-key.pem  the private key (mode 0600): keep it to mint more tokens
  token-rw         a read-write token (claim a="rw", mode 0600)
  token-ro         a read-only token (claim a="ro", mode 0600)

An existing private-key.pem is reused (so tokens already handed out stay valid) unless
--force. Tokens are written to files, not printed, unless --print-env asks for them.
The logic lives in harel_edge.testing.auth; this is its command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

try:
    from harel_edge.testing.auth import generate_keys, load_keys
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))
    from harel_edge.testing.auth import generate_keys, load_keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=REPO / ".cache" / "sqld" / "keys",
        help="where to write the files (default: <repo>/.cache/sqld/keys)",
    )
    parser.add_argument("--force", action="store_true", help="make a new key pair even if one exists")
    parser.add_argument(
        "--expires-in",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give the tokens an exp claim this many seconds ahead (default: no expiry)",
    )
    parser.add_argument(
        "--print-env",
        action="store_true",
        help="print SQLD_AUTH_JWT_KEY, SQLD_TOKEN_RW and SQLD_TOKEN_RO as env assignments "
        "(prints secrets: for your terminal, not for logs)",
    )
    args = parser.parse_args(argv)

    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    private_path = out / "private-key.pem"
    if private_path.exists() and not args.force:
        keys = load_keys(private_path)
        made = "reused"
    else:
        keys = generate_keys()
        keys.write_private_key(private_path)
        made = "made"
    keys.write_public_key(out / "jwt-key.pem", "pem")
    keys.write_public_key(out / "jwt-key.b64", "base64")

    rw = keys.token("rw", expires_in=args.expires_in)
    ro = keys.token("ro", expires_in=args.expires_in)
    for name, token in (("token-rw", rw), ("token-ro", ro)):
        path = out / name
        path.unlink(missing_ok=True)
        path.touch(mode=0o600)
        path.write_text(token + "\n")

    print(f"{made} an Ed25519 key pair in {out}", file=sys.stderr)
    print(f"  sqld --auth-jwt-key-file {out / 'jwt-key.pem'}", file=sys.stderr)
    print(f"  tokens: {out / 'token-rw'} (read-write), {out / 'token-ro'} (read-only)", file=sys.stderr)
    if args.print_env:
        print(f"SQLD_AUTH_JWT_KEY={keys.public_key_base64}")
        print(f"SQLD_TOKEN_RW={rw}")
        print(f"SQLD_TOKEN_RO={ro}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
