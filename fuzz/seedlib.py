"""fuzz/seedlib.py -- what the seed scripts share: writing a corpus.

Seeds are files named by the SHA-1 of their content; writing only adds
files, so a corpus merged from fuzzer runs keeps what it found.
"""
import hashlib
import os


def write_corpus(name, seeds, out):
    """Write every seed into directory out (created) and say how many were new."""
    os.makedirs(out, exist_ok=True)
    new = 0
    for seed in seeds:
        path = os.path.join(out, hashlib.sha1(seed).hexdigest())
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(seed)
            new += 1
    print("%s: %d seeds (%d new) in %s" % (name, len(seeds), new, out))
