#!/bin/sh
# embed.sh IN OUT NAME — writes OUT, a C header defining
#   static const unsigned char NAME[] = { ...bytes of IN..., 0 };
# so the binary carries a web page (no file to find at run time). Only
# POSIX sh and od: nothing to install. The trailing NUL makes it a C string;
# IN must therefore not contain NUL bytes (checked).
set -eu
in=$1 out=$2 name=$3
if [ "$(tr -d '\000' <"$in" | wc -c)" -ne "$(wc -c <"$in")" ]; then
  echo "embed.sh: $in contains NUL bytes" >&2
  exit 1
fi
tmp=$out.tmp.$$
{
  echo "/* generated from $in by src/dashboard/embed.sh: do not edit */"
  echo "static const unsigned char ${name}[] = {"
  od -An -v -tx1 "$in" | sed -e 's/ *\([0-9a-f][0-9a-f]\)/0x\1,/g'
  echo "0x00};"
} >"$tmp"
mv "$tmp" "$out"
