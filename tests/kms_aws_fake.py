"""tests/kms_aws_fake.py -- a fake AWS KMS endpoint for tests/kms_aws_test.sh.

It answers what moto_server does not: every error the client must map
(throttling, 5xx, disabled, pending deletion, wrong key) and malformed
responses its strict parser must refuse.  The KeyId of each request picks
the answer.  Every request's SigV4 signature is recomputed with botocore's
own signer (an implementation independent of tools/kms-aws/sigv4.c) from
the bytes on the wire; a mismatch is answered with
InvalidSignatureException and logged.

It also serves the credential endpoints the plugin's chain reads
(docs/kms-plugin.md [KP-AWS-10]), with the test's own keys, so that the
KMS calls made with them verify: IMDSv2 (PUT /latest/api/token, then the
role and its credentials, which expire 2 s after they are served, for
the refresh test) and a container endpoint (GET /creds, which wants the
Authorization token "fake-container-token"; GET /creds-once serves
credentials of 4 s once, then fails with HTTP 500).  Each credential
fetch is logged ("imds-creds", "container-creds", "once-creds N").  IMDS
also answers the instance's region, us-east-1 ([KP-AWS-16], logged
"imds-region").

Usage: python3 kms_aws_fake.py PORTFILE LOGFILE ACCESS_KEY SECRET [TOKEN]
"""
import base64
import datetime
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

PORTFILE, LOGFILE, AKID, SECRET = sys.argv[1:5]
TOKEN = sys.argv[5] if len(sys.argv) > 5 else None
B64 = lambda b: base64.b64encode(b).decode()
ERRORS = {
    "throttle": (400, "ThrottlingException"),
    "internal": (500, "KMSInternalException"),
    "disabled": (400, "DisabledException"),
    "pending": (400, "KMSInvalidStateException"),
    "importing": (400, "KMSInvalidStateException"),
    "incorrect": (400, "IncorrectKeyException"),
    "badctx": (400, "InvalidCiphertextException"),
    "prefixed": (400, "com.amazonaws.kms#NotFoundException"),
    "validation": (400, "ValidationException"),
}
STATES = {"pending": "PendingDeletion", "importing": "PendingImport"}
ARN = "arn:aws:kms:us-east-1:111122223333:key/"


def log(line):
    with open(LOGFILE, "a") as f:
        f.write(line + "\n")


class Handler(BaseHTTPRequestHandler):
    once = 0

    def log_message(self, *args):
        pass

    def answer(self, status, body, headers=()):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def signature_ok(self, body):
        auth = self.headers.get("Authorization", "")
        m = re.fullmatch(
            r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/us-east-1/kms/aws4_request, "
            r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})",
            auth,
        )
        if not m or m.group(1) != AKID:
            return False, "malformed Authorization: " + auth
        want = "content-type;host;x-amz-date;" + ("x-amz-security-token;" if TOKEN else "") + "x-amz-target"
        if m.group(3) != want:
            return False, "signed headers " + m.group(3)
        if TOKEN and self.headers.get("X-Amz-Security-Token") != TOKEN:
            return False, "no session token"
        hdrs = {h: self.headers[h] for h in m.group(3).split(";")}
        req = AWSRequest(method="POST", url="http://" + hdrs["host"] + "/", data=body, headers=hdrs)
        req.context["timestamp"] = hdrs["x-amz-date"]
        signer = SigV4Auth(Credentials(AKID, SECRET, TOKEN), "kms", "us-east-1")
        sig = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
        return sig == m.group(4), "signature " + m.group(4) + " != botocore's " + sig

    def creds(self, life):
        exp = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=life)
        return {"Code": "Success", "AccessKeyId": AKID, "SecretAccessKey": SECRET,
                "Expiration": exp.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def do_PUT(self):
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self.answer(400, b"")
        log("imds-token")
        return self.answer(200, b"fake-imds-token")

    def do_GET(self):
        if self.path == "/creds-once":
            # credentials of 4 s the first time, then HTTP 500: a refresh that fails
            Handler.once += 1
            log("once-creds %d" % Handler.once)
            return self.answer(200, self.creds(4)) if Handler.once == 1 else self.answer(500, b"")
        if self.path == "/creds":
            if self.headers.get("Authorization") != "fake-container-token":
                return self.answer(401, b"")
            log("container-creds")
            return self.answer(200, self.creds(3600))
        if self.headers.get("X-aws-ec2-metadata-token") != "fake-imds-token":
            return self.answer(401, b"")
        if self.path == "/latest/meta-data/iam/security-credentials/":
            return self.answer(200, b"keyshift-role")
        if self.path == "/latest/meta-data/iam/security-credentials/keyshift-role":
            log("imds-creds")
            return self.answer(200, self.creds(2))
        if self.path == "/latest/meta-data/placement/region":
            log("imds-region")
            return self.answer(200, b"us-east-1")
        return self.answer(404, b"")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        target = self.headers.get("X-Amz-Target", "")
        ok, why = self.signature_ok(body)
        if self.headers.get("Content-Type") != "application/x-amz-json-1.1" or not target.startswith(
            "TrentService."
        ):
            ok, why = False, "content type or target"
        if not ok:
            log("sig-bad " + why)
            return self.answer(400, {"__type": "InvalidSignatureException", "message": why})
        log("sig-ok " + target)
        op = target.split(".", 1)[1]
        req = json.loads(body)
        kid = req.get("KeyId", "")
        if "EncryptionContext" in req:
            log("context " + json.dumps(req["EncryptionContext"], sort_keys=True))
        if op == "DescribeKey" and kid in STATES:
            return self.answer(
                200, {"KeyMetadata": {"Arn": ARN + kid, "KeyState": STATES[kid], "Enabled": False}}
            )
        if kid in ERRORS:
            status, typ = ERRORS[kid]
            return self.answer(status, {"__type": typ, "message": "fake " + typ})
        if kid == "unavailable":
            return self.answer(503, b"")
        if kid == "hdronly":
            return self.answer(
                400, b"", [("x-amzn-ErrorType", "AccessDeniedException:http://internal.amazon.com/")]
            )
        bodies = {
            "dupe": b'{"KeyId":"dupe","Plaintext":"QUFB","Plaintext":"QkJC"}',
            "badb64": json.dumps({"KeyId": kid, "Plaintext": "QUF B"}).encode(),
            "nopad": json.dumps({"KeyId": kid, "Plaintext": "QUI"}).encode(),
            "noncanon": json.dumps({"KeyId": kid, "Plaintext": "QUJ="}).encode(),
            "wrongtype": json.dumps({"KeyId": kid, "Plaintext": 12}).encode(),
            "nul": json.dumps({"KeyId": kid + "\u0000x", "Plaintext": "QUI="}).encode(),
            "notjson": b"hello",
            "array": b"[]",
            "huge": json.dumps({"KeyId": kid, "Plaintext": "QUI=", "Pad": "x" * 70000}).encode(),
            "badalg": json.dumps({"KeyId": kid, "Plaintext": "QUI=", "EncryptionAlgorithm": "RSAES_OAEP_SHA_1"}).encode(),
            "otherkey": json.dumps({"KeyId": ARN + "someone-else", "Plaintext": "QUI="}).encode(),
            "bigpt": json.dumps({"KeyId": kid, "Plaintext": B64(b"A" * 4097)}).encode(),
        }
        if kid in bodies:
            return self.answer(200, bodies[kid])
        # "good" and anything else: a well-formed answer
        if op == "Encrypt":
            return self.answer(200, {"KeyId": ARN + kid, "CiphertextBlob": B64(b"fake-ciphertext"),
                                     "EncryptionAlgorithm": "SYMMETRIC_DEFAULT"})
        if op == "Decrypt":
            return self.answer(200, {"KeyId": ARN + kid, "Plaintext": B64(b"AB"),
                                     "EncryptionAlgorithm": "SYMMETRIC_DEFAULT"})
        return self.answer(200, {"KeyMetadata": {"Arn": ARN + kid, "KeyState": "Enabled", "Enabled": True,
                                                 "KeyUsage": "ENCRYPT_DECRYPT"}})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(PORTFILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os  # noqa: E402

os.rename(PORTFILE + ".tmp", PORTFILE)
server.serve_forever()
