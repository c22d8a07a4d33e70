"""A PEP 517 build backend for the keyshift package, standard library only.

The package is pure Python (it loads libkeyshift.so.0 with ctypes), so its
wheel is a zip of keyshift/ with the .dist-info files PEP 427 requires.
pip calls build_wheel (and, when present, prepare_metadata_for_build_wheel)
with --no-build-isolation; nothing is downloaded.
"""

import base64
import hashlib
import os
import re
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "keyshift"


def _version():
    """__version__ of keyshift/__init__.py, read without importing it (the
    import loads the C library, which a build does not need)."""
    with open(os.path.join(HERE, NAME, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M)
    if not m:
        raise RuntimeError("keyshift/__init__.py has no __version__")
    return m.group(1)


def _metadata():
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
            "Summary: keyshift's application API (libkeyshift.so.0) for Python, over ctypes\n"
            "Requires-Python: >=3.8\n" % (NAME, _version()))


def _dist_info():
    return "%s-%s.dist-info" % (NAME, _version())


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    return _dist_info()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """Zip keyshift/*.py and py.typed with METADATA, WHEEL and RECORD."""
    files = []
    pkg = os.path.join(HERE, NAME)
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py") or fn == "py.typed":
            with open(os.path.join(pkg, fn), "rb") as f:
                files.append(("%s/%s" % (NAME, fn), f.read()))
    di = _dist_info()
    files.append((di + "/METADATA", _metadata().encode()))
    files.append((di + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: keyshift build_wheel.py\n"
                  b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    record = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append(di + "/RECORD,,")
    files.append((di + "/RECORD", ("\n".join(record) + "\n").encode()))
    name = "%s-%s-py3-none-any.whl" % (NAME, _version())
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return name
