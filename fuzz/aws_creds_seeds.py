#!/usr/bin/python3
"""fuzz/aws_creds_seeds.py -- the fuzz_aws_creds seeds: what
keyshift-kms-aws reads from its credential sources (docs/kms-plugin.md
[KP-AWS-10..14]).

    /usr/bin/python3 fuzz/aws_creds_seeds.py [OUTDIR]

Each seed is one mode byte (fuzz/fuzz_aws_creds.c: 0..2 a shared file
read for section default / profile ks / ks, 3 credential_process JSON, 4
metadata JSON, 5 and 6 STS AssumeRole / AssumeRoleWithWebIdentity
answers, 7 an STS error answer, 8 an ISO 8601 time, 9 an IMDS region
answer) and its input:
well-formed documents built here with Python's json and string
formatting, independently of the C readers, and for each one variants
that the readers must refuse (a member or element dropped, repeated, of
another type, an entity, a NUL, CRLF, nesting, a line at the 4096-byte
bound and over it) and every truncation of a short one.

Written to corpus/fuzz_aws_creds/ (or OUTDIR) as <sha1 of content>;
idempotent, nothing is removed.  Standard library only; run from anywhere.
"""
import json
import os
import sys

from seedlib import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus", "fuzz_aws_creds")

INI = [
    "[default]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = s/x+y\n",
    "# c\n; c\r\n[default]\r\naws_access_key_id=A\r\naws_secret_access_key = s\r\naws_session_token = t\r\n",
    "[profile ks]\nrole_arn = arn:aws:iam::123456789012:role/app\nsource_profile = base\nregion = eu-west-1\n"
    "duration_seconds = 3600\n[base]\naws_access_key_id = A\naws_secret_access_key = s\n",
    "[ks]\ncredential_process = /usr/bin/aws configure export-credentials --format process\n",
    "[default]\nregion = us-east-1\ns3 =\n  max_concurrent_requests = 10\n  addressing_style = path\n"
    "[profile ks]\nregion = ap-south-1\n",
    "[ks]\naws_access_key_id = A\naws_access_key_id = B\n",
    "[ks]\naws_access_key_id = A\n[ks]\n",
    "aws_access_key_id = A\n",
    "[ks\n",
    "[]\n",
    "[ks]\n= x\n",
    "[ks]\n  indented = 1\n",
    "[ks]\naws_access_key_id = A B\n",
    "[ks]\naws_access_key_id = A\x00B\n",
    "[ks]\nrole_arn = " + "a" * 2100 + "\n",
    "[default]\n# " + "x" * 4094 + "\n",
    "[default]\n# " + "x" * 4095 + "\n",
    "[ profile ks ]\naws_secret_access_key =\n",
]

EXP = "2030-01-02T03:04:05Z"
PROC = {"Version": 1, "AccessKeyId": "AKIDPROC", "SecretAccessKey": "s/p+", "SessionToken": "tok",
        "Expiration": EXP}
HTTP = {"Code": "Success", "LastUpdated": EXP, "Type": "AWS-HMAC", "AccessKeyId": "ASIA", "SecretAccessKey": "s",
        "Token": "tok", "Expiration": "2030-01-02T03:04:05.123456Z"}


def json_variants(doc):
    out = [json.dumps(doc), json.dumps(doc, separators=(",", ":"))]
    for k in doc:
        d = dict(doc)
        del d[k]
        out.append(json.dumps(d))
        for v in (None, 1, 1.0, "", "a b", [], {}, True, "x" * 5000):
            d = dict(doc)
            d[k] = v
            out.append(json.dumps(d))
    s = json.dumps(doc)
    out += [s[:-1] + ', "AccessKeyId": "B"}', s + " x", "[" + s + "]", s.replace('"tok"', '"t\\u0000k"'),
            '{"Code": "AssumeRoleUnauthorizedAccess", "Message": "no role"}', "", "{}", "null"]
    return out


def sts(action, creds, root=None):
    inner = "".join("<%s>%s</%s>" % (k, v, k) for k, v in creds)
    root = root or action + "Response"
    return ('<?xml version="1.0"?>\n<%s xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><%sResult>'
            "<Credentials>%s</Credentials><AssumedRoleUser><Arn>arn:aws:sts::1:assumed-role/r/s</Arn>"
            "</AssumedRoleUser></%sResult><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></%s>\n"
            % (root, action, inner, action, root.split(" ")[0]))


CREDS = [("AccessKeyId", "ASIAX"), ("SecretAccessKey", "s/x+"), ("SessionToken", "FQoGZXIvYXdz"),
         ("Expiration", EXP)]


def sts_variants(action):
    out = [sts(action, CREDS), sts(action, CREDS).replace("\n", "\r\n")]
    for i in range(len(CREDS)):
        out.append(sts(action, CREDS[:i] + CREDS[i + 1:]))
        out.append(sts(action, CREDS + [CREDS[i]]))
        bad = list(CREDS)
        bad[i] = (bad[i][0], "a&amp;b")
        out.append(sts(action, bad))
        bad[i] = (bad[i][0], "<x/>")
        out.append(sts(action, bad))
        bad[i] = (bad[i][0], "")
        out.append(sts(action, bad))
    out.append(sts(action, CREDS).replace("<AccessKeyId>", '<AccessKeyId a="1">'))
    out.append(sts(action, CREDS, root="OtherResponse"))
    out.append(sts(action, CREDS) + "<trailing/>")
    return out


ERRORS = [
    '<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type>'
    "<Code>%s</Code><Message>m &amp; n</Message></Error><RequestId>r</RequestId></ErrorResponse>" % c
    for c in ("AccessDenied", "InvalidIdentityToken", "ExpiredTokenException", "Throttling", "IDPCommunicationError",
              "ValidationError", "")
] + ["", "<ErrorResponse><Error></Error></ErrorResponse>", "not xml"]

TIMES = [EXP, "2030-01-02T03:04:05.1Z", "2030-01-02T03:04:05.123456789Z", "2024-02-29T23:59:59Z",
         "2023-02-29T00:00:00Z", "1970-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "2030-13-01T00:00:00Z",
         "2030-01-02T03:04:05", "2030-01-02 03:04:05Z", "2030-01-02T03:04:05.Z", "2030-01-02T03:04:05+00:00",
         "9999-12-31T23:59:59Z", "2030-01-02T24:00:00Z", "2030-01-02T03:04:05.1234567890Z"]


REGIONS = ["us-east-1", "eu-west-3", "ap-southeast-2", "us-gov-west-1", "a" * 64, "a" * 65, "", "US-EAST-1",
           "us_east_1", "us-east-1\n", " us-east-1", "us-east-1\x00x", "r\xe9gion"]


def main(argv):
    seeds = []
    for i, text in enumerate(INI):
        for mode in (0, 1, 2):
            seeds.append(bytes([mode]) + text.encode("latin-1"))
    for mode, doc in ((3, PROC), (4, HTTP)):
        seeds += [bytes([mode]) + s.encode() for s in json_variants(doc)]
        short = json.dumps(doc).encode()
        seeds += [bytes([mode]) + short[:k] for k in range(0, len(short), 7)]
    for mode, action in ((5, "AssumeRole"), (6, "AssumeRoleWithWebIdentity")):
        seeds += [bytes([mode]) + s.encode() for s in sts_variants(action)]
        full = sts(action, CREDS).encode()
        seeds += [bytes([mode]) + full[:k] for k in range(0, len(full), 23)]
    seeds += [bytes([7]) + e.encode() for e in ERRORS]
    seeds += [bytes([8]) + t.encode() for t in TIMES]
    seeds += [bytes([9]) + r.encode("latin-1") for r in REGIONS]
    write_corpus("aws_creds_seeds", list(dict.fromkeys(seeds)), argv[0] if argv else CORPUS)


if __name__ == "__main__":
    main(sys.argv[1:])
