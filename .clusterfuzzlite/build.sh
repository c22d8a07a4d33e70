#!/bin/bash -eu
# ClusterFuzzLite build script for keyshift: the real one lives in the project.
"$SRC/keyshift/fuzz/build.sh"
