"""Print where `make install` puts the Python package for PREFIX (argv[1]).

Debian's python3 reads packages of /usr/local from
/usr/local/lib/python3.X/dist-packages (its "posix_local" scheme, whose
paths are the base plus /local); other interpreters, and any other
PREFIX, use the standard layout PREFIX/lib/python3.X/site-packages.
"""

import sys
import sysconfig

prefix = sys.argv[1].rstrip("/")
if sysconfig.get_default_scheme() == "posix_local" and prefix.endswith("/local"):
    print(sysconfig.get_path("purelib", "posix_local", vars={"base": prefix[: -len("/local")]}))
else:
    print(sysconfig.get_path("purelib", "posix_prefix", vars={"base": prefix}))
