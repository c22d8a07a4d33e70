#!/bin/bash -eu
# OSS-Fuzz build script for keyshift: the real one lives in the project.
"$SRC/keyshift/fuzz/build.sh"
