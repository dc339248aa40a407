"""Verifies a chatgate receipt with PyJWT (a JOSE library that is not
chatgate's code) against a server's JWKS, and prints its claims as JSON.

    verify_receipt.py JWKS_URL TOKEN

Exit 0 with the claims on stdout, or 1 with why on stderr.
"""

import json
import sys

import jwt


def main() -> int:
    url, token = sys.argv[1], sys.argv[2]
    try:
        key = jwt.PyJWKClient(url).get_signing_key_from_jwt(token)
        claims = jwt.decode(token, key, algorithms=["EdDSA"])
    except jwt.PyJWTError as err:
        print(f"not verified: {err}", file=sys.stderr)
        return 1
    print(json.dumps(claims))
    return 0


if __name__ == "__main__":
    sys.exit(main())
