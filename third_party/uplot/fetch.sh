#!/usr/bin/env bash
# Fetches uPlot's release files from the npm registry (`npm pack`: the registry's tarball,
# checked against its published integrity hash), keeps the minified browser build, its CSS
# and licence, and checks them against SHA256SUMS. The files are committed: a build never
# needs the network; run this only to change the version (then update VERSION and
# SHA256SUMS: `sha256sum uPlot.iife.min.js uPlot.min.css LICENSE > SHA256SUMS`).
set -euo pipefail
cd "$(dirname "$0")"
version=$(cat VERSION)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "uplot@$version" >/dev/null)
tar -xzf "$tmp/uplot-$version.tgz" -C "$tmp"
cp "$tmp/package/dist/uPlot.iife.min.js" "$tmp/package/dist/uPlot.min.css" "$tmp/package/LICENSE" .
sha256sum -c SHA256SUMS
