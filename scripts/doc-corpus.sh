#!/usr/bin/env bash
# A larger corpus of real English text than the licence texts (data/demo.bin, 0.3 M tokens):
# the READMEs, Markdown and plain-text files the installed Debian packages ship under
# /usr/share/doc (about 6 M byte tokens on a machine set up by scripts/setup.sh), smaller
# than 200 KiB each (larger ones are mostly data tables), in byte order of their paths, so the
# same packages give the same file. It depends on what is installed: the corpus's token count
# and a hash of its file list are printed, and the benchmarks that use it record them.
#
# usage: scripts/doc-corpus.sh MESHTRAIN_BINARY OUT.bin
set -euo pipefail
MT=${1:?usage: scripts/doc-corpus.sh MESHTRAIN_BINARY OUT.bin}
OUT=${2:?usage: scripts/doc-corpus.sh MESHTRAIN_BINARY OUT.bin}
list=$(mktemp)
trap 'rm -f "$list"' EXIT
find /usr/share/doc -type f \( -name 'README*' -o -name '*.md' -o -name '*.txt' \) \
  ! -name '*.gz' -size -200k -print0 | LC_ALL=C sort -z > "$list"
[ -s "$list" ] || { echo "doc-corpus: no text files under /usr/share/doc" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"
xargs -0 "$MT" prepare -o "$OUT" < "$list"
echo "doc-corpus: $(tr '\0' '\n' < "$list" | wc -l) files, list hash $(tr '\0' '\n' < "$list" | md5sum | cut -c1-12)"
