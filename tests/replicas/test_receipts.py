"""Replicas sharing one --receipt-key (#43): every replica publishes the
same JWKS, and a run decided through another replica than its owner gets a
receipt signed with that key, naming the pause it was decided on.

Signatures are verified with JOSE libraries in the Rust and MCP suites;
here the cluster's agreement on the key is what is checked."""

import base64
import json
import os
import re
import unittest
import urllib.request

from harness import read_until
from test_round_robin import Cluster, answer, new_session, post, read_to_end

#: An Ed25519 private key in PKCS#8 DER is this prefix and the 32-byte
#: seed (RFC 8410): how a test makes a key file without a crypto library.
PKCS8_ED25519 = bytes.fromhex("302e020100300506032b657004220420")


def key_file(path):
    der = PKCS8_ED25519 + os.urandom(32)
    with open(path, "w") as f:
        f.write("-----BEGIN PRIVATE KEY-----\n%s\n-----END PRIVATE KEY-----\n"
                % base64.b64encode(der).decode())


def part(token, n):
    piece = token.split(".")[n]
    return json.loads(base64.urlsafe_b64decode(piece + "=" * (-len(piece) % 4)))


class SharedKeyTest(unittest.TestCase):
    def setUp(self):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="chatgate-receipts-")
        key = os.path.join(self.dir, "receipt.pem")
        key_file(key)
        self.out = os.path.join(self.dir, "receipts.txt")
        tools = os.path.join(self.dir, "tools.toml")
        with open(tools, "w") as f:
            f.write('[[tool]]\nname = "stamp"\ndescription = "Stamps"\nrisk = "low"\n'
                    'command = ["sh", "-c", "cat >/dev/null; printf \'%%s\\\\n\' \\"$CHATGATE_RECEIPT\\" >> %s"]\n'
                    'parameters = { type = "object" }\n' % self.out)
        self.cluster = Cluster(replicas=2, nginx=False,
                               extra=["--tools", tools, "--receipt-key", key])

    def tearDown(self):
        self.cluster.stop()

    def test_replicas_publish_one_key_and_a_forwarded_decision_is_signed_with_it(self):
        jwks = []
        for replica in self.cluster.replicas:
            with urllib.request.urlopen(replica.url + "/.well-known/jwks.json", timeout=10) as r:
                jwks.append(json.loads(r.read()))
        self.assertEqual(jwks[0], jwks[1])
        self.assertEqual(len(jwks[0]["keys"]), 1)
        kid = jwks[0]["keys"][0]["kid"]
        self.assertEqual(jwks[0]["keys"][0]["crv"], "Ed25519")

        owner, other = self.cluster.replicas
        session = new_session("rcpt")
        stream = post(owner, {"message": "stamp it", "session_id": session})
        seen = read_until(stream, rb'"chunk_type":"confirmation_request"')
        confirmation_id = re.search(rb'"confirmation_id":"([^"]+)"', seen).group(1).decode()
        status, chunk, _ = answer(other, session, "confirm", confirmation_id=confirmation_id)
        self.assertEqual(status, 200, chunk)
        rest = read_to_end(stream)
        self.assertIn(b'"chunk_type":"completion"', rest)

        with open(self.out) as f:
            token = f.read().strip()
        self.assertEqual(part(token, 0)["kid"], kid)
        self.assertEqual(part(token, 0)["alg"], "EdDSA")
        claims = part(token, 1)
        self.assertEqual(claims["confirmation_id"], confirmation_id)
        self.assertEqual(claims["session_id"], session)
        self.assertEqual(claims["via"], "chat")
        self.assertEqual(claims["task"]["tool"], "stamp")


if __name__ == "__main__":
    unittest.main()
