#!/usr/bin/env bash
# Triton sampler versions side by side on a GPU (no build: Triton only). Each VERSION is
# label=FILE, FILE a copy of python/tokenspeed_kernel/triton/sampling.py from some revision (the
# device machine's copy of the tree has no .git: extract them beforehand, e.g.
#   git show 9c5bbc5:python/tokenspeed_kernel/triton/sampling.py > .lab/v/9c5bbc5.py
# in an untracked, not ignored folder so that they travel). For each version the current python/
# tree is copied to /tmp/tv/<label> with that file in place, and triton_topp_tail.py runs there
# with ARGS (default: the processing mode at B = 64 / 256, 4 seeds).
#
#   VERSIONS="old=.lab/v/9c5bbc5.py new=python/tokenspeed_kernel/triton/sampling.py" \
#     ARGS="--mode proc --batch 64,256 --seeds 4" bench/lab/tools/triton_versions_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
ARGS=${ARGS:-"--mode proc --batch 64,256 --seeds 4"}
for v in ${VERSIONS:?VERSIONS=label=file ...}; do
  label=${v%%=*}; file=${v#*=}
  dst=/tmp/tv/$label
  rm -rf "$dst" && mkdir -p "$dst" && cp -a python "$dst/" && cp "$file" "$dst/python/tokenspeed_kernel/triton/sampling.py"
  # shellcheck disable=SC2086
  PYTHONPATH=$dst/python python3 bench/lab/tools/triton_topp_tail.py "$label" $ARGS 2>&1 | grep "^==\|Error"
done
