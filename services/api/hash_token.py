"""``python -m services.api.hash_token``: the line of the token document for a token.

    echo -n "$TOKEN" | python -m services.api.hash_token        # the SHA-256 of a token (from stdin)
    python -m services.api.hash_token --new --tenant research   # a new random token, and its entry

The token is read from stdin, not the command line, so it stays out of shell history and ``ps``.
"""

from __future__ import annotations

import argparse
import sys

from services.api.auth import MIN_TOKEN_CHARS, hash_token, new_token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.api.hash_token", description=__doc__)
    parser.add_argument("--new", action="store_true", help="make a new random token (printed once)")
    parser.add_argument("--tenant", help="print a token-document entry for this tenant")
    args = parser.parse_args(argv)
    if args.new:
        token = new_token()
        print(f"token (give it to the tenant; it is not stored): {token}", file=sys.stderr)
    else:
        token = sys.stdin.read().rstrip("\r\n")
        if len(token) < MIN_TOKEN_CHARS:
            print(f"error: a token needs at least {MIN_TOKEN_CHARS} characters", file=sys.stderr)
            return 2
    digest = hash_token(token)
    print(f"  - name: {args.tenant}\n    token_sha256: {digest}" if args.tenant else digest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
