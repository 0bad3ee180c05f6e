#!/bin/bash
# variant.sh NAME COMMIT (on the development machine, where git is): the kernel sources
# (kernels/src/cu/*) that COMMIT changed, as they are in COMMIT, into .carry/variants/NAME. A run
# carrying .carry then times them with the one build of HEAD through
# CLEAVE_KERNEL_SOURCES=.carry/variants/NAME (lib.sh). COMMIT's other kernel sources must equal
# HEAD's (the script refuses otherwise), and so should its launchers (kernels/src/ops: a change
# there since is listed, for the reader to judge).
set -e
name=$1 commit=$2
[ -n "$name" ] && [ -n "$commit" ] || { echo "usage: $0 NAME COMMIT" >&2; exit 2; }
changed=$(git diff --name-only "$commit~1" "$commit" -- kernels/src/cu)
[ -n "$changed" ] || { echo "$commit changes no kernel source" >&2; exit 1; }
if ! git diff --quiet "$commit~1" HEAD -- kernels/src/cu; then
  echo "kernel sources changed between $commit~1 and HEAD: rebase the variant first" >&2; exit 1
fi
git diff --stat "$commit~1" HEAD -- kernels/src/ops | sed 's/^/launchers changed since: /' 
d=.carry/variants/$name
rm -rf "$d"; mkdir -p "$d"
for f in $changed; do git show "$commit:$f" > "$d/$(basename "$f")"; done
ls "$d"
