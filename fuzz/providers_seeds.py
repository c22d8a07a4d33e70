#!/usr/bin/python3
"""fuzz/providers_seeds.py -- the registry test vectors and the fuzz_providers seeds.

    /usr/bin/python3 fuzz/providers_seeds.py [--markdown] [--list]

Builds provider registry files (docs/providers.md, "Registry") with a
writer of its own, independent of migrate/keys/registry_format.c: valid
registries of several shapes and at least one input of every rejection
class.  The offset of each rejection is computed here from the text
(where the offending element starts), not taken from the parser.

  (default)   write each vector of docs/providers.md (fenced
              ks-providers-vector blocks) and each input built here, plus
              every truncation of two valid registries, as
              corpus/fuzz_providers/<sha1 of content>;
  --markdown  print the built-in vectors as ks-providers-vector blocks, the
              form in which docs/providers.md holds them;
  --list      print name, expectation and length of each built-in vector.

Idempotent: a seed's name is its content's hash; nothing is removed.
Standard library only; run from anywhere.
"""
import os
import re
import sys

from seedlib import at, line_markdown, line_spec_vectors, text, write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus", "fuzz_providers")
SPEC = os.path.join(ROOT, "docs", "providers.md")

HEADER = "keyshift-providers 1"


def local(name, keyring, *serves, extra=()):
    return ["provider " + name, "  type local", "  keyring " + keyring] + list(extra) + \
        ["  " + s for s in serves]


def pkcs11(name, *serves, extra=("  token-label prod hsm", "  pin-env HSM_PIN")):
    return ["provider " + name, "  type pkcs11"] + list(extra) + ["  " + s for s in serves]


def plugin(name, command, *serves, extra=()):
    return ["provider " + name, "  type plugin", "  command " + command] + list(extra) + \
        ["  " + s for s in serves]


def file_257(line):
    """Nine plugin providers, eight with 32 lines of the format line (one %d), the ninth with one."""
    many = [HEADER]
    for i in range(9):
        many += plugin("p%d" % i, "aws", "serve k%d" % i,
                       extra=[line % j for j in range(32 if i < 8 else 1)])
    return text(*many)


# ---- the vectors ------------------------------------------------------------

def vectors():
    """[(name, description, expect, bytes, result)]; expect is 'ok' or (error, offset);
    result is the list of result lines of an ok vector."""
    v = []

    def add(name, desc, expect, data, result=None):
        assert (expect == "ok") == (result is not None)
        v.append((name, desc, expect, data, result))

    def bad(name, desc, error, data, offset):
        add(name, desc, (error, offset), data)

    # ---- accepted --------------------------------------------------------
    add("one-local", "One local keyring serving one key_id.", "ok",
        text(HEADER, *local("app", "/etc/keyshift/app.keyring", "serve app/main")),
        ["provider: app local", "setting: app keyring /etc/keyshift/app.keyring",
         "serve: app exact app/main"])
    add("comments-and-blank-lines",
        "Comments and empty lines before the header, between sections and inside one.", "ok",
        text("# keyshift providers", "", HEADER, "", "# the main keyring",
             "provider app", "  type local", "# sealed", "  keyring /etc/keyshift/app.keyring",
             "", "  passphrase-file /run/secrets/app-pass", "  serve app/main", "",
             "#  indented text after # is still a comment"),
        ["provider: app local", "setting: app keyring /etc/keyshift/app.keyring",
         "setting: app passphrase-file /run/secrets/app-pass", "serve: app exact app/main"])
    add("local-and-pkcs11",
        "A local keyring for tests and a token for production, every pkcs11 setting given "
        "(settings in a non-canonical order).", "ok",
        text(HEADER,
             *local("dev", "/var/lib/keyshift/dev.keyring", "serve-prefix dev/",
                    extra=["  passphrase-env KEYSHIFT_DEV_PASS"]),
             "provider prod-hsm", "  type pkcs11", "  timeout-ms 2500", "  serve-prefix prod/",
             "  gcm-params no-ivbits", "  pin-file /run/secrets/hsm-pin",
             "  token-uri pkcs11:token=prod%20hsm;manufacturer=SoftHSM%20project",
             "  module /usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
             "  serve prod/billing@eu+1=x"),
        ["provider: dev local", "setting: dev keyring /var/lib/keyshift/dev.keyring",
         "setting: dev passphrase-env KEYSHIFT_DEV_PASS", "serve: dev prefix dev/",
         "provider: prod-hsm pkcs11",
         "setting: prod-hsm module /usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
         "setting: prod-hsm token-uri pkcs11:token=prod%20hsm;manufacturer=SoftHSM%20project",
         "setting: prod-hsm pin-file /run/secrets/hsm-pin",
         "setting: prod-hsm gcm-params no-ivbits", "setting: prod-hsm timeout-ms 2500",
         "serve: prod-hsm prefix prod/", "serve: prod-hsm exact prod/billing@eu+1=x"])
    label32 = "Prod HSM #1 / eu-west (primary!)"
    assert len(label32) == 32
    add("pkcs11-label-32", "A token label of 32 bytes with inner spaces and punctuation; the "
        "defaults for module, gcm-params and timeout-ms.", "ok",
        text(HEADER, *pkcs11("hsm", "serve k", extra=("  token-label " + label32, "  pin-env PIN"))),
        ["provider: hsm pkcs11", "setting: hsm token-label " + label32, "setting: hsm pin-env PIN",
         "serve: hsm exact k"])
    add("routing-overlap", "Exact and prefix lines that overlap across providers: allowed, "
        "routing decides ([P-ROUTE-1..2]).", "ok",
        text(HEADER,
             *local("a", "/k/a", "serve-prefix app/", "serve app/main"),
             *local("b", "/k/b", "serve-prefix app/eu/", "serve-prefix app/main", "serve app/main2")),
        ["provider: a local", "setting: a keyring /k/a", "serve: a prefix app/",
         "serve: a exact app/main", "provider: b local", "setting: b keyring /k/b",
         "serve: b prefix app/eu/", "serve: b prefix app/main", "serve: b exact app/main2"])
    longest = "x" * 63
    path1000 = "/" + "p" * 999
    add("limits", "A 63-byte name, a 256-byte key_id, a 128-byte variable name, a line of "
        "exactly 1024 bytes, timeout-ms 600000.", "ok",
        text(HEADER, "provider " + longest, "  type pkcs11", "  token-label t",
             "  pin-env " + "P" * 128, "  timeout-ms 600000", "  module " + path1000[:1024 - 9],
             "  serve " + "k" * 256),
        ["provider: %s pkcs11" % longest,
         "setting: %s module %s" % (longest, path1000[:1024 - 9]),
         "setting: %s token-label t" % longest, "setting: %s pin-env %s" % (longest, "P" * 128),
         "setting: %s timeout-ms 600000" % longest, "serve: %s exact %s" % (longest, "k" * 256)])

    add("one-plugin", "A KMS plugin found on PATH by its name ([P-PLUGIN-2]): "
        "keyshift-kms-aws.", "ok",
        text(HEADER, *plugin("kms", "aws", "serve-prefix app/")),
        ["provider: kms plugin", "setting: kms command aws", "serve: kms prefix app/"])
    arn = "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    add("plugin-every-setting",
        "A plugin by absolute path with every setting, in a non-canonical order: arg lines "
        "(spaces kept, one argv element each) stay in file order after the other settings, "
        "serve lines after them; retries and rate-limit 0.", "ok",
        text(HEADER, "provider aws-eu", "  type plugin", "  arg --key=app/main,1," + arn,
             "  serve-prefix app/", "  concurrency 8", "  rate-limit 0",
             "  arg --region eu-west-1", "  retries 0", "  retry-budget-ms 60000",
             "  command /usr/libexec/keyshift/keyshift-kms-aws", "  timeout-ms 2500",
             "  serve billing/main", "  arg --profile=prod #1"),
        ["provider: aws-eu plugin", "setting: aws-eu timeout-ms 2500",
         "setting: aws-eu command /usr/libexec/keyshift/keyshift-kms-aws",
         "setting: aws-eu retries 0", "setting: aws-eu retry-budget-ms 60000",
         "setting: aws-eu rate-limit 0", "setting: aws-eu concurrency 8",
         "setting: aws-eu arg --key=app/main,1," + arn, "setting: aws-eu arg --region eu-west-1",
         "setting: aws-eu arg --profile=prod #1",
         "serve: aws-eu prefix app/", "serve: aws-eu exact billing/main"])
    cmd63 = "k" + "-0" * 31
    assert len(cmd63) == 63
    add("plugin-limits", "A 63-byte command name, 32 arg lines, and each number at its largest.",
        "ok",
        text(HEADER, *plugin("p", cmd63, "serve k",
                             extra=["  timeout-ms 600000", "  retries 10",
                                    "  retry-budget-ms 3600000", "  rate-limit 100000",
                                    "  concurrency 64"] + ["  arg %d" % i for i in range(32)])),
        ["provider: p plugin", "setting: p timeout-ms 600000", "setting: p command " + cmd63,
         "setting: p retries 10", "setting: p retry-budget-ms 3600000",
         "setting: p rate-limit 100000", "setting: p concurrency 64"] +
        ["setting: p arg %d" % i for i in range(32)] + ["serve: p exact k"])

    add("plugin-env",
        "A plugin's environment ([P-PLUGIN-9]): env and env-prefix lines mixed with arg "
        "lines; after the arg lines in the canonical form, in file order; an env and an "
        "env-prefix with the same bytes are no conflict.", "ok",
        text(HEADER, "provider aws", "  type plugin", "  env-prefix AWS_", "  command aws",
             "  env HTTPS_PROXY", "  arg --region=eu-west-1", "  env AWS_", "  env no_proxy",
             "  serve-prefix app/"),
        ["provider: aws plugin", "setting: aws command aws", "setting: aws arg --region=eu-west-1",
         "setting: aws env-prefix AWS_", "setting: aws env HTTPS_PROXY", "setting: aws env AWS_",
         "setting: aws env no_proxy", "serve: aws prefix app/"])
    add("plugin-env-limits",
        "32 env and env-prefix lines in a provider, a name of 128 bytes, and the same name "
        "in two providers.", "ok",
        text(HEADER, *plugin("p", "aws", "serve k",
                             extra=["  env V%d" % i for i in range(31)] + ["  env-prefix " + "E" * 128]),
             *plugin("q", "aws", "serve q", extra=["  env V0"])),
        ["provider: p plugin", "setting: p command aws"] +
        ["setting: p env V%d" % i for i in range(31)] + ["setting: p env-prefix " + "E" * 128,
                                                          "serve: p exact k",
                                                          "provider: q plugin", "setting: q command aws",
                                                          "setting: q env V0", "serve: q exact q"])

    # ---- the file and its lines [P-FILE], [P-LINE] -----------------------
    one = text(HEADER, *local("app", "/k", "serve app/main"))
    bad("empty-file", "An empty file: no header.", "truncated", b"", 0)
    bad("only-comments", "Comments and empty lines only.", "truncated", text("# x", ""), 5)
    bad("no-final-lf", "The last line has no LF.", "truncated", one[:-1], len(one) - 1)
    bad("crlf", "CR LF line endings: the CR is refused.", "bad-value",
        one.replace(b"\n", b"\r\n"), len(HEADER))
    bad("tab-indent", "A setting indented with a tab.", "bad-value",
        one.replace(b"  type", b"\ttype"), at(one, "  type"))
    bad("utf8-in-comment", "UTF-8 in a comment: only 20..7E.", "bad-value",
        HEADER.encode() + b"\n# caf\xc3\xa9\n", len(HEADER) + 1 + 5)
    bad("nul-byte", "A NUL byte in a value.", "bad-value",
        one.replace(b"app/main", b"app\x00main"), at(one, "app/main", plus=3))
    bad("trailing-space", "A trailing space after a value.", "bad-value",
        one.replace(b"app/main\n", b"app/main  \n"), at(one, "app/main", plus=8))
    bad("blank-with-spaces", "A line of two spaces between settings.", "bad-value",
        one.replace(b"  keyring", b"  \n  keyring"), at(one, "  keyring"))
    long_line = HEADER.encode() + b"\n#" + b"c" * 1023 + b"\n"
    add("comment-1024", "A comment line of exactly 1024 bytes is fine; the file still needs a "
        "provider.", ("missing-field", len(long_line)), long_line)
    bad("line-1025", "A comment line of 1025 bytes.", "too-large",
        HEADER.encode() + b"\n#" + b"c" * 1024 + b"\n", len(HEADER) + 1 + 1024)
    big = text(HEADER, *local("app", "/k", "serve app/main"))
    big += b"#" * 1000 + b"\n"
    while len(big) <= 65536:
        big += b"#" * 1000 + b"\n"
    bad("file-too-large", "A valid registry padded with comments past 65536 bytes.",
        "too-large", big, 65536)

    # ---- the header [P-HEAD-1] -------------------------------------------
    bad("no-header", "A provider line first.", "bad-magic",
        text(*local("app", "/k", "serve app/main")), 0)
    bad("header-version-2", "Version 2.", "unsupported-version",
        text("keyshift-providers 2", *local("app", "/k", "serve app/main")), 19)
    bad("header-version-01", "Version 01: not exactly 1.", "unsupported-version",
        text("keyshift-providers 01", *local("app", "/k", "serve app/main")), 19)
    bad("header-no-version", "The header word without a version.", "bad-magic",
        text("keyshift-providers", *local("app", "/k", "serve app/main")), 0)
    bad("header-indented", "The header indented.", "bad-magic",
        text("  keyshift-providers 1", *local("app", "/k", "serve app/main")), 0)
    bad("no-provider", "A header and nothing else.", "missing-field", text(HEADER), 21)

    # ---- sections and names [P-SECT], [P-PROV] --------------------------
    bad("unknown-section", "A top-level line that is not a provider line.", "unknown-field",
        text(HEADER, "providers app"), 21)
    bad("provider-without-name", "A provider line without a name.", "missing-field",
        text(HEADER, "provider", "  type local"), 21 + 8)
    bad("provider-two-spaces", "Two spaces before the name.", "bad-value",
        text(HEADER, "provider  app", "  type local"), 21 + 9)
    bad("name-uppercase", "An uppercase letter in a name.", "bad-value",
        text(HEADER, *local("App", "/k", "serve a")), 21 + 9)
    bad("name-leading-dash", "A name beginning with a dash.", "bad-value",
        text(HEADER, *local("-app", "/k", "serve a")), 21 + 9)
    bad("name-64", "A name of 64 bytes.", "too-large",
        text(HEADER, *local("n" * 64, "/k", "serve a")), 21 + 9 + 63)
    d = text(HEADER, *local("app", "/k", "serve a"), *local("app", "/k2", "serve b"))
    bad("name-duplicate", "Two providers named app.", "conflict", d, at(d, "provider app", 1, 9))
    many = [HEADER]
    for i in range(65):
        many += local("p%d" % i, "/k", "serve k%d" % i)
    m = text(*many)
    bad("providers-65", "65 providers.", "too-large", m, at(m, "provider p64"))
    s = text(HEADER, *local("app", "/k", "serve a")[:3], *local("b", "/k", "serve b"))
    bad("section-without-serve", "A section with no serve line: found where the next begins.",
        "missing-field", s, at(s, "provider b"))
    s = text(HEADER, "provider app", "provider b")
    bad("section-empty", "A provider line with no settings.", "missing-field", s,
        at(s, "provider b"))
    s = text(HEADER, "provider app", "  type local", "  serve a")
    bad("local-without-keyring", "A local provider without its keyring, at the end of the file.",
        "missing-field", s, len(s))
    s = text(HEADER, *pkcs11("hsm", "serve a", extra=("  pin-env PIN",)))
    bad("pkcs11-without-token", "A pkcs11 provider with neither token-label nor token-uri.",
        "missing-field", s, len(s))
    s = text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-label t",)))
    bad("pkcs11-without-pin", "A pkcs11 provider with neither pin-file nor pin-env.",
        "missing-field", s, len(s))

    # ---- setting lines [P-SET] ---------------------------------------------
    s = text(HEADER, "  type local", *local("app", "/k", "serve a"))
    bad("setting-before-provider", "A setting before any provider line.", "missing-field", s, 21)
    s = text(HEADER, "provider app", " type local")
    bad("indent-one", "A setting indented by one space.", "bad-value", s, at(s, " type", plus=1))
    s = text(HEADER, "provider app", "   type local")
    bad("indent-three", "A setting indented by three spaces.", "bad-value", s,
        at(s, "   type", plus=2))
    s = text(HEADER, "provider app", "  type local", "  colour blue")
    bad("unknown-key", "A key that does not exist.", "unknown-field", s, at(s, "colour"))
    s = text(HEADER, "provider app", "  type local", "  pin 1234")
    bad("pin-value", "A PIN in the file: no key takes one ([P-PKCS11-3]).", "unknown-field", s,
        at(s, "pin 1234"))
    s = text(HEADER, "provider app", "  type local", "  pin-file /run/pin")
    bad("key-of-other-type", "pin-file in a local provider.", "unknown-field", s, at(s, "pin-file"))
    s = text(HEADER, "provider app", "  keyring /k", "  type local")
    bad("type-not-first", "keyring before type.", "missing-field", s, at(s, "keyring"))
    s = text(HEADER, "provider app", "  colour blue", "  type local")
    bad("unknown-before-type", "An unknown key before type: unknown-field first.",
        "unknown-field", s, at(s, "colour"))
    s = text(HEADER, "provider app", "  type local", "  type local")
    bad("type-twice", "type given twice.", "field-order", s, at(s, "type", 1))
    s = text(HEADER, *local("app", "/k", "serve a", extra=["  keyring /k2"]))
    bad("keyring-twice", "keyring given twice.", "field-order", s, at(s, "keyring", 1))
    s = text(HEADER, *local("app", "/k", "serve a", extra=["  passphrase-file /p", "  passphrase-env P"]))
    bad("passphrase-both", "passphrase-file and passphrase-env together.", "field-order", s,
        at(s, "passphrase-env"))
    s = text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-label t", "  token-uri pkcs11:token=t",
                                                       "  pin-env P")))
    bad("token-both", "token-label and token-uri together.", "field-order", s, at(s, "token-uri"))
    s = text(HEADER, "provider app", "  type")
    bad("key-without-value", "A key without a value.", "missing-field", s, len(s) - 1)
    s = text(HEADER, "provider app", "  type  local")
    bad("value-two-spaces", "Two spaces between key and value.", "bad-value", s,
        at(s, "type", plus=5))

    # ---- values [P-VAL], [P-TYPE], [P-SERVE], [P-LOCAL], [P-PKCS11] --------
    s = text(HEADER, "provider app", "  type kms")
    bad("type-unknown", "A provider type that does not exist.", "bad-value", s, at(s, "kms"))
    s = text(HEADER, *local("app", "k/app.keyring", "serve a"))
    bad("path-relative", "A relative keyring path.", "bad-value", s, at(s, "k/app.keyring"))
    s = text(HEADER, *local("app", "/k", "serve a", extra=["  passphrase-env 1PASS"]))
    bad("env-digit-first", "A variable name beginning with a digit.", "bad-value", s, at(s, "1PASS"))
    s = text(HEADER, *local("app", "/k", "serve a", extra=["  passphrase-env MY-PASS"]))
    bad("env-dash", "A dash in a variable name.", "bad-value", s, at(s, "MY-PASS", plus=2))
    s = text(HEADER, *local("app", "/k", "serve a", extra=["  passphrase-env " + "P" * 129]))
    bad("env-129", "A variable name of 129 bytes.", "too-large", s, at(s, "P" * 129, plus=128))
    s = text(HEADER, *local("app", "/k", "serve app main"))
    bad("serve-space", "A space in a served key_id.", "bad-value", s, at(s, "app main", plus=3))
    s = text(HEADER, *local("app", "/k", "serve-prefix app#"))
    bad("prefix-charset", "A # in a prefix.", "bad-value", s, at(s, "app#", plus=3))
    s = text(HEADER, *local("app", "/k", "serve " + "k" * 257))
    bad("serve-257", "A served key_id of 257 bytes.", "too-large", s, at(s, "k" * 257, plus=256))
    s = text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-label " + "L" * 33, "  pin-env P")))
    bad("label-33", "A token label of 33 bytes.", "too-large", s, at(s, "L" * 33, plus=32))
    s = text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-uri token=t", "  pin-env P")))
    bad("uri-scheme", "A token-uri without pkcs11:.", "bad-value", s, at(s, "token=t"))
    s = text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-uri pkcs11:token=prod hsm", "  pin-env P")))
    bad("uri-space", "A space in a token-uri.", "bad-value", s, at(s, "prod hsm", plus=4))
    s = text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-label t", "  pin-env P",
                                                       "  gcm-params ivbits")))
    bad("gcm-unknown", "An unknown gcm-params layout.", "bad-value", s, at(s, "ivbits"))
    for val, off, why in (("0", 0, "0"), ("600001", 0, "600001"), ("0100", 0, "a leading zero"),
                          ("10s", 2, "a unit"), ("99999999999", 0, "eleven digits")):
        s = text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-label t", "  pin-env P",
                                                           "  timeout-ms " + val)))
        bad("timeout-" + re.sub(r"[^a-z0-9]+", "-", why).strip("-"), "timeout-ms with %s." % why,
            "bad-value", s, at(s, "timeout-ms ", plus=11 + off))

    # ---- plugin providers [P-PLUGIN] ---------------------------------------
    s = text(HEADER, "provider kms", "  type plugin", "  arg --x", "  serve a")
    bad("plugin-without-command", "A plugin provider without its command, at the end of the file.",
        "missing-field", s, len(s))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  keyring /k"]))
    bad("plugin-keyring", "keyring in a plugin provider.", "unknown-field", s, at(s, "keyring"))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  token-label t"]))
    bad("plugin-token-label", "token-label in a plugin provider.", "unknown-field", s,
        at(s, "token-label"))
    s = text(HEADER, *local("app", "/k", "serve a", extra=["  arg --x"]))
    bad("arg-in-local", "arg in a local provider.", "unknown-field", s, at(s, "arg"))
    s = text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-label t", "  pin-env P",
                                                       "  command aws")))
    bad("command-in-pkcs11", "command in a pkcs11 provider.", "unknown-field", s, at(s, "command"))
    s = text(HEADER, *local("app", "/k", "serve a", extra=["  retries 3"]))
    bad("retries-in-local", "retries in a local provider.", "unknown-field", s, at(s, "retries"))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  command gcp"]))
    bad("command-twice", "command given twice.", "field-order", s, at(s, "command", 1))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  rate-limit 5", "  rate-limit 6"]))
    bad("rate-limit-twice", "rate-limit given twice.", "field-order", s, at(s, "rate-limit", 1))
    s = text(HEADER, *plugin("kms", "bin/kms", "serve a"))
    bad("command-relative", "A relative command path: the / is outside a NAME.", "bad-value", s,
        at(s, "bin/kms", plus=3))
    s = text(HEADER, *plugin("kms", "AWS", "serve a"))
    bad("command-uppercase", "An uppercase command name.", "bad-value", s, at(s, "AWS"))
    s = text(HEADER, *plugin("kms", "-aws", "serve a"))
    bad("command-leading-dash", "A command name beginning with a dash.", "bad-value", s,
        at(s, "-aws"))
    s = text(HEADER, *plugin("kms", "keyshift-kms-aws exec", "serve a"))
    bad("command-space", "A space in a command name.", "bad-value", s,
        at(s, "keyshift-kms-aws exec", plus=16))
    s = text(HEADER, *plugin("kms", "c" * 64, "serve a"))
    bad("command-64", "A command name of 64 bytes.", "too-large", s, at(s, "c" * 64, plus=63))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  arg  --x"]))
    bad("arg-leading-space", "An arg value beginning with a space ([P-SET-6]).", "bad-value", s,
        at(s, "arg  --x", plus=4))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  arg"]))
    bad("arg-without-value", "An arg line without a value.", "missing-field", s,
        at(s, "  arg\n", plus=5))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  arg %d" % i for i in range(33)]))
    bad("args-33", "33 arg lines in one provider.", "too-large", s, at(s, "  arg 32", plus=2))
    m = file_257("  arg %d")
    bad("args-257", "257 arg lines in the file (8 providers of 32, then one more).", "too-large",
        m, at(m, "provider p8") + len("provider p8\n  type plugin\n  command aws\n") + 2)
    for key, val, off, why in (("timeout-ms", "0", 0, "0"), ("timeout-ms", "600001", 0, "600001"),
                               ("retries", "11", 0, "11"), ("retries", "01", 0, "a leading zero"),
                               ("retries", "-1", 0, "a sign"),
                               ("retry-budget-ms", "0", 0, "0"),
                               ("retry-budget-ms", "3600001", 0, "3600001"),
                               ("rate-limit", "100001", 0, "100001"),
                               ("rate-limit", "50/s", 2, "a unit"),
                               ("rate-limit", "00", 0, "two zeros"),
                               ("concurrency", "0", 0, "0"), ("concurrency", "65", 0, "65"),
                               ("concurrency", "4294967297", 0, "2^32 + 1")):
        s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  %s %s" % (key, val)]))
        name = "plugin-%s-%s" % (key, re.sub(r"[^a-z0-9]+", "-", why).strip("-"))
        bad(name, "A plugin's %s with %s." % (key, why), "bad-value", s,
            at(s, "  %s " % key, plus=len(key) + 3 + off))

    s = text(HEADER, *local("app", "/k", "serve a", extra=["  env AWS_REGION"]))
    bad("env-in-local", "env in a local provider.", "unknown-field", s, at(s, "env"))
    s = text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-label t", "  pin-env P",
                                                       "  env-prefix AWS_")))
    bad("env-prefix-in-pkcs11", "env-prefix in a pkcs11 provider.", "unknown-field", s,
        at(s, "env-prefix"))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  env AWS-REGION"]))
    bad("env-name-dash", "A dash in an env name.", "bad-value", s, at(s, "AWS-REGION", plus=3))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  env-prefix 9AWS"]))
    bad("env-prefix-digit-first", "An env-prefix beginning with a digit.", "bad-value", s,
        at(s, "9AWS"))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  env AWS_REGION=eu"]))
    bad("env-with-value", "A value in an env line: the registry names variables only.",
        "bad-value", s, at(s, "AWS_REGION=eu", plus=10))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  env " + "N" * 129]))
    bad("env-name-129", "An env name of 129 bytes.", "too-large", s, at(s, "N" * 129, plus=128))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  env"]))
    bad("env-without-value", "An env line without a value.", "missing-field", s,
        at(s, "  env\n", plus=5))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  env AWS_PROFILE", "  arg x",
                                                            "  env AWS_PROFILE"]))
    bad("env-twice", "The same env name twice in one provider.", "conflict", s,
        at(s, "AWS_PROFILE", 1))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  env-prefix AWS_", "  env-prefix AWS_"]))
    bad("env-prefix-twice", "The same env-prefix twice in one provider.", "conflict", s,
        at(s, "AWS_", 1))
    s = text(HEADER, *plugin("kms", "aws", "serve a", extra=["  env V%d" % i for i in range(33)]))
    bad("envs-33", "33 env lines in one provider.", "too-large", s, at(s, "  env V32", plus=2))
    m = file_257("  env V%d")
    bad("envs-257", "257 env lines in the file (8 providers of 32, then one more).", "too-large",
        m, at(m, "provider p8") + len("provider p8\n  type plugin\n  command aws\n") + 2)

    # ---- routing conflicts and limits [P-SERVE-3..4] ----------------------
    s = text(HEADER, *local("a", "/k", "serve app/main"), *local("b", "/k", "serve app/main"))
    bad("serve-conflict", "The same key_id served by two providers.", "conflict", s,
        at(s, "app/main", 1))
    s = text(HEADER, *local("a", "/k", "serve-prefix app/", "serve-prefix app/"))
    bad("prefix-twice", "The same prefix twice in one provider.", "conflict", s, at(s, "app/", 1))
    s = text(HEADER, *local("a", "/k", "serve-prefix app/"), *local("b", "/k", "serve-prefix app/"))
    bad("prefix-conflict", "The same prefix in two providers.", "conflict", s, at(s, "app/", 1))
    lines = [HEADER] + local("a", "/k") + ["  serve k%d" % i for i in range(257)]
    s = text(*lines)
    bad("serves-257", "257 serve lines.", "too-large", s, at(s, "  serve k256", plus=2))
    return v


def extra_seeds():
    """Inputs beyond the vectors, for branches the vectors leave alone."""
    def p11(*extra):
        return text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-label t", "  pin-env P") + extra))
    return [
        p11("  gcm-params p11kit"),
        p11("  timeout-ms 1.5"),
        p11("  timeout-ms 1"),
        text(HEADER, *pkcs11("hsm", "serve a", extra=("  token-uri pkcs", "  pin-env P"))),
        text(HEADER, *local("app", "/k", "serve a", extra=["  passphrase-env my_pass_2"])),
        text(HEADER, *local("a~", "/k", "serve a")),
        text(HEADER, *local("a", "/k", "serve a")) + b"prov\n",
        text(HEADER, *local("a", "/k", "serve a")) + b"provider\n",
        text(HEADER, *local("a", "/k", "serve a")) + b"providerx b\n",
        text(HEADER, *local("a", "/k", "serve-prefix a/b", "serve-prefix a/", "serve a/b/c")),
        text(HEADER, *local("app", "/k", "serve a", extra=["  passphrase-env A{"])),
        text(HEADER, *local("app", "/k", "serve a", extra=["  passphrase-env A:"])),
        text(HEADER, *local("a", "/k", "serve a"), "serve-prefix b"),
        text(HEADER, *plugin("p", "/", "serve a", extra=["  arg #", "  arg a b  c"])),
        text(HEADER, *plugin("p", "a-", "serve a", extra=["  retries 0", "  rate-limit 1"])),
        text(HEADER, *plugin("p", "9", "serve a", extra=["  timeout-ms 1", "  concurrency 1",
                                                         "  retry-budget-ms 1"])),
        text(HEADER, "provider p", "  type plugin", "  arg x", "  serve a", "  command a"),
        text(HEADER, "provider p", "  type plugin", "  command a", "  serve a",
             "provider q", "  type plugin", "  command b", "  arg y", "  serve b"),
        text(HEADER, *plugin("p", "aws", "serve a", extra=["  retries 1.5"])),
        text(HEADER, *plugin("p", "aws", "serve a", extra=["  gcm-params p11kit"])),
        text(HEADER, *plugin("p", "aws", "serve a", extra=["  env A", "  env-prefix A", "  env _"])),
        text(HEADER, *plugin("p", "aws", "serve a", extra=["  env-prefix LC_", "  env A{"])),
        text(HEADER, *plugin("p", "aws", "serve a", extra=["  env-prefix"])),
        text(HEADER, *plugin("p", "aws", "serve a", extra=["  envx A"])),
        text(HEADER, "provider p", "  type plugin", "  env A", "  serve a", "  command a",
             "provider q", "  type plugin", "  env A", "  command b", "  env B", "  serve b"),
    ]


def check_unique(vs):
    """Every vector's name is unique (the tests and the docs refer to them)."""
    names = [x[0] for x in vs]
    assert len(names) == len(set(names)), "duplicate vector names"
    return vs


TAG = "ks-providers-vector"


def markdown(vs):
    return line_markdown(TAG, vs)


def spec_vectors():
    """The bytes of every ks-providers-vector block of docs/providers.md."""
    return line_spec_vectors(SPEC, TAG)


def main():
    vs = check_unique(vectors())
    if "--markdown" in sys.argv:
        print(markdown(vs))
        return
    if "--list" in sys.argv:
        for name, _, expect, data, _ in vs:
            print(name, expect, len(data))
        return
    seeds = [x[3] for x in vs] + spec_vectors() + extra_seeds()
    for n, _, _, d, _ in vs:
        if n in ("one-local", "local-and-pkcs11", "plugin-every-setting"):
            seeds += [d[:i] for i in range(len(d))]
    write_corpus("providers_seeds", list(dict.fromkeys(seeds)), CORPUS)


if __name__ == "__main__":
    main()
